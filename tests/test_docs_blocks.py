"""Every code block of the README and docs/ that a reader may run says how it is tested,
and the ones that can run here do.

A fenced block with a language (bash, yaml, json, python) carries a marker on the line
above it, an HTML comment a reader does not see:

    <!-- docs-test: config -->          a launch file or config overrides (YAML or JSON):
                                        read as `rollway launch` reads a file, built on its
                                        preset and checked as a launch checks it (task,
                                        reward functions; paths are not read)
    <!-- docs-test: python -->          run as it is, in a directory holding what it names
    <!-- docs-test: tests/F.py::NAME --> what the block does is run by that test
    <!-- docs-test: not run: REASON --> it cannot run on this machine (a GPU, a cluster, a
                                        remote site): the reason says which

A fence without a language is a drawing or a file listing. A block without a marker, a
marker naming a test that does not exist, a config the launch would refuse, or a python
block that raises fails here.
"""

from __future__ import annotations

import json
import re
import sys
import types
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# A fence and its marker may be indented, inside a list item.
FENCE = re.compile(r"^\s*(```|~~~)(\w*)\s*$")
MARKER = re.compile(r"^\s*<!-- docs-test: (.+?) -->\s*$")
LIST_ITEM = re.compile(r"^(\s*)([-*+]|\d+[.)])\s+")


def blocks() -> list[tuple[str, int, str, str, str]]:
    """(page, line, language, marker, body) of every fenced block with a language."""
    found = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        i = 0
        while i < len(lines):
            m = FENCE.match(lines[i])
            if not m:
                i += 1
                continue
            end = next(j for j in range(i + 1, len(lines)) if lines[j].lstrip().startswith(m.group(1)))
            if m.group(2):
                above = MARKER.match(lines[i - 1]) if i else None
                marker = above.group(1) if above else ""
                found.append((str(page.relative_to(REPO)), i + 1, m.group(2), marker, "\n".join(lines[i + 1 : end])))
            i = end + 1
    return found


def content_indent(line: str) -> int:
    """Where a line's text starts: past a list item's marker, else its indentation."""
    item = LIST_ITEM.match(line)
    return item.end() if item else len(line) - len(line.lstrip())


def indented_code() -> list[str]:
    """`page:line` of every indented code block: a line after a blank one, indented four
    or more past the text above it (Markdown's code block without a fence)."""
    found = []
    for page in PAGES:
        lines, fenced = page.read_text().splitlines(), False
        for i, line in enumerate(lines):
            if FENCE.match(line):
                fenced = not fenced
                continue
            if fenced or not line.strip() or i == 0 or lines[i - 1].strip():
                continue
            above = next((lines[j] for j in range(i - 2, -1, -1) if lines[j].strip()), "")
            if len(line) - len(line.lstrip()) >= content_indent(above) + 4:
                found.append(f"{page.relative_to(REPO)}:{i + 1}")
    return found


BLOCKS = blocks()
IDS = [f"{page}:{line}" for page, line, *_ in BLOCKS]


def test_the_pages_have_blocks_of_every_kind():
    kinds = {marker.split(":")[0] if not marker.startswith("tests/") else "test" for *_, marker, _ in BLOCKS}
    assert {"config", "python", "test", "not run"} <= kinds, kinds


def test_no_block_is_indented_instead_of_fenced():
    # An indented block has no language and so no marker: it would escape every check here.
    assert indented_code() == [], "fence these (```bash, ```yaml, …) and mark how each is tested"


@pytest.mark.parametrize(("page", "line", "language", "marker", "body"), BLOCKS, ids=IDS)
def test_every_block_says_how_it_is_tested(page, line, language, marker, body):
    assert marker, f"{page}:{line}: a ```{language} block without a <!-- docs-test: ... --> marker above it"
    if marker.startswith("not run:"):
        assert len(marker) > len("not run: ") + 10, f"{page}:{line}: say why it is not run"
    elif marker.startswith("tests/"):
        for target in marker.split(";"):
            path, _, name = target.strip().partition("::")
            assert (REPO / path).is_file(), f"{page}:{line}: {path} does not exist"
            assert re.search(rf"^def {re.escape(name)}\(", (REPO / path).read_text(), re.M), (
                f"{page}:{line}: {path} has no test {name!r}"
            )
    else:
        assert marker in ("config", "python"), f"{page}:{line}: unknown marker {marker!r}"


# The reward functions the pages' examples name, as a user's package would hold them.
def _accuracy(prompts, completions, answer, **kwargs):
    return [float(c.strip() == a) for c, a in zip(completions, answer, strict=True)]


def _format(prompts, completions, **kwargs):
    return [0.0 for _ in completions]


@pytest.fixture
def users_reward_package(monkeypatch):
    package, module = types.ModuleType("my_rewards"), types.ModuleType("my_rewards.gsm8k")
    module.accuracy, module.format = _accuracy, _format
    package.gsm8k, package.accuracy = module, _accuracy
    monkeypatch.setitem(sys.modules, "my_rewards", package)
    monkeypatch.setitem(sys.modules, "my_rewards.gsm8k", module)
    monkeypatch.setenv("ROLLWAY_TASK_MODULES", "my_rewards,my_rewards.*")


CONFIGS = [b for b in BLOCKS if b[3] == "config"]


@pytest.mark.parametrize(
    ("page", "line", "language", "marker", "body"), CONFIGS, ids=[f"{b[0]}:{b[1]}" for b in CONFIGS]
)
def test_a_config_block_is_a_launch_the_site_would_take(
    page, line, language, marker, body, users_reward_package, tmp_path
):
    from rollway_cli.launchfile import launch_body
    from workers.config.presets import build
    from workers.run.runnable import check_runnable

    data = json.loads(body) if language == "json" else yaml.safe_load(body)
    spec = tmp_path / "launch.yaml"
    spec.write_text(yaml.safe_dump(data if ("preset" in data or "overrides" in data) else {"overrides": data}))
    launch = launch_body(spec, [])
    cfg = build(launch.get("preset", "async"), launch.get("overrides", {}))
    assert check_runnable(cfg) is cfg, f"{page}:{line}"


PYTHON = [b for b in BLOCKS if b[3] == "python"]


def _stage(body: str, where: Path) -> None:
    """What a python block names, made here: a checkpoint step directory, a run's export
    (merged model, its base and its LoRA adapter)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from workers.model.tiny_hf import make_tiny_checkpoint

    for step in re.findall(r'"(checkpoints/[^"]+)"', body):
        make_tiny_checkpoint(str(where / step))
    if '"run-12-model' in body:
        export = where / "run-12-model"
        make_tiny_checkpoint(str(export))
        make_tiny_checkpoint(str(export / "base"))
        base = AutoModelForCausalLM.from_pretrained(str(export / "base"))
        get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"])).save_pretrained(
            str(export / "adapter")
        )


@pytest.mark.parametrize(("page", "line", "language", "marker", "body"), PYTHON, ids=[f"{b[0]}:{b[1]}" for b in PYTHON])
def test_a_python_block_runs(page, line, language, marker, body, tmp_path, monkeypatch):
    _stage(body, tmp_path)
    monkeypatch.chdir(tmp_path)
    exec(compile(body, f"{page}:{line}", "exec"), {"__name__": "__docs__"})
