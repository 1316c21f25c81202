"""docs/first-model.md as a reader runs it: its blocks, in order, as one bash script, from a
folder laid out as a checkout, against the suite's started site (daphne, Celery, Ray)
and a Hub served over HTTP (tests/hub_server.py) under the ids the page names.

The Hub serves a tiny Llama checkpoint (SmolLM2 is a Llama) and a gsm8k-shaped dataset:
the `main` configuration's train and test splits as Parquet, with gsm8k's `question` and
`answer` columns and its card's `configs`, so `task.dataset.subset` picks them as
`load_dataset(path, "main")` does."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.hub_server import HubServer
from tests.integration.stack import REPO

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PAGE = REPO / "docs" / "first-model.md"
MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
DATASET_ID = "openai/gsm8k"
MARKER = "<!-- docs-test: tests/integration/test_first_model.py::test_the_first_model_page_runs_as_written -->"
TEST_ROWS = 32  # of data/gsm8k.jsonl's rows, the `test` split; the rest train
CARD = """\
---
configs:
- config_name: main
  data_files:
  - split: train
    path: main/train-*
  - split: test
    path: main/test-*
---
# gsm8k, as its card lays it out (the rows are the project's own)
"""


def page_script() -> str:
    """The page's blocks this test runs, in their order on the page."""
    text = PAGE.read_text()
    blocks = re.findall(re.escape(MARKER) + r"\n```bash\n(.*?)\n```", text, re.S)
    assert len(blocks) == 3, f"{PAGE}: expected the blocks of steps 1, 3 and 4, found {len(blocks)}"
    return "\n".join(blocks)


def gsm8k_files(tmp_path: Path) -> dict[str, bytes]:
    import datasets

    rows = [json.loads(line) for line in (REPO / "data" / "gsm8k.jsonl").read_text().splitlines()]
    rows = [{"question": r["prompt"], "answer": r["answer"]} for r in rows]
    files = {"README.md": CARD.encode()}
    for split, part in (("test", rows[:TEST_ROWS]), ("train", rows[TEST_ROWS:])):
        out = tmp_path / f"{split}.parquet"
        datasets.Dataset.from_list(part).to_parquet(str(out))
        files[f"main/{split}-00000-of-00001.parquet"] = out.read_bytes()
    return files


def test_the_first_model_page_runs_as_written(stack, cli_env, tmp_path, show_logs_on_failure):
    import torch
    from safetensors.torch import load_file

    from runs.models import MetricPoint, Run
    from workers.model.tiny_hf import make_tiny_checkpoint

    env, _ = cli_env
    stack.ensure_worker()
    served = make_tiny_checkpoint(str(tmp_path / "served-model"), "llama", max_position_embeddings=512)
    checkout = stack.user_dir  # on the site's import path, as a checkout's root is
    if not (checkout / ".venv").exists():
        (checkout / ".venv").symlink_to(REPO / ".venv")

    with HubServer() as hub:
        hub.add_dir("model", MODEL_ID, Path(served))
        hub.add("dataset", DATASET_ID, gsm8k_files(tmp_path))
        shell_env = {
            **env,
            "ROLLWAY_HOME": str(stack.home),
            "HF_ENDPOINT": hub.url,
            "HF_HOME": str(tmp_path / "hf-home"),
            "HF_HUB_OFFLINE": "0",
            "HF_HUB_DISABLE_TELEMETRY": "1",
        }
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", page_script()],
            cwd=checkout,
            env=shell_env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        fetched = {repo for repo, _ in hub.fetched}
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}\nHub requests unanswered: {hub.unknown}"
    assert fetched == {MODEL_ID, DATASET_ID}, hub.fetched

    run_id = int(re.search(r"^run (\d+): \d+ files", done.stdout, re.M).group(1))
    run = Run.objects.get(pk=run_id)
    assert run.status == Run.Status.SUCCEEDED
    launch_file = yaml.safe_load((checkout / "first.yaml").read_text())
    assert run.config["task"]["dataset"]["subset"] == "main"
    assert run.config["task"]["reward_funcs"] == launch_file["task"]["reward_funcs"] == ["my_rewards:accuracy"]
    assert run.config["model"]["path"] == str(stack.home / "models" / "smollm2-135m-instruct")
    steps = MetricPoint.objects.filter(run_id=run_id, series="rewards/accuracy/mean").count()
    assert steps == launch_file["stop"]["max_steps"]

    # What came back is the trained policy: the served weights, moved by ten steps.
    exported = load_file(str(checkout / "first-model" / "model.safetensors"))
    original = load_file(os.path.join(served, "model.safetensors"))
    assert exported.keys() == original.keys()
    assert any(not torch.equal(exported[k], original[k]) for k in original)
    # The page's last command loaded it with transformers' pipeline, which answered.
    assert re.search(r"^answer: ", done.stdout, re.M), done.stdout[-2000:]
