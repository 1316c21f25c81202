"""The one `--set a.b=value` grammar (workers/core/merge.py) that the `rollway` CLI and the
bench scripts share, read back through the config models where the types decide."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from workers.config.presets import build
from workers.core.merge import OverrideError, parse_set, parse_sets, set_value

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "raw, value",
    [
        ("8", 8),
        ("3e-3", 0.003),  # YAML 1.1 (PyYAML) would keep this a string
        ("0.002", 0.002),
        ("true", True),
        ("null", None),
        ("[1, 2]", [1, 2]),
        ('{"a": 1}', {"a": 1}),
        ('"8"', "8"),
        ("no", "no"),  # YAML 1.1 would make it False
        ("off", "off"),
        ("masked_is", "masked_is"),
        ("Qwen/Qwen3-0.6B", "Qwen/Qwen3-0.6B"),
        ("", ""),
    ],
)
def test_a_value_is_json_when_it_is_json_else_its_text(raw, value):
    assert set_value(raw) == value
    assert type(set_value(raw)) is type(value)


@pytest.mark.parametrize("raw", ["[1, 2", '{"a": }', '"unterminated'])
def test_a_value_that_starts_like_json_but_is_not_is_an_error(raw):
    with pytest.raises(OverrideError, match="not valid JSON"):
        set_value(raw)


def test_items_nest_by_dots_and_a_later_item_wins():
    assert parse_sets(["trainer.lr=0.002", "correction.method=masked_is", "seed=3", "trainer.lr=0.001"]) == {
        "trainer": {"lr": 0.001},
        "correction": {"method": "masked_is"},
        "seed": 3,
    }
    assert parse_set("task.dataset.path=data/x.jsonl") == {"task": {"dataset": {"path": "data/x.jsonl"}}}


@pytest.mark.parametrize(
    "item, says",
    [
        ("buffer.capacity", "field.path=value"),
        ("=3", "field.path=value"),
        ("buffer..capacity=3", "not a config field name"),
    ],
)
def test_a_malformed_item_says_how_to_write_it(item, says):
    with pytest.raises(OverrideError, match=says):
        parse_set(item)


def test_the_configs_types_decide_what_a_bare_word_means():
    """`no` is false for a boolean field and stays text elsewhere, whichever tool parsed it."""
    cfg = build("async", parse_sets(["lora.enabled=no", "trainer.lr=3e-3", "stop.max_steps=20"]))
    assert cfg.lora.enabled is False and cfg.trainer.lr == 0.003 and cfg.stop.max_steps == 20


def test_the_cli_and_the_bench_scripts_use_this_grammar_and_no_other():
    """Every script with a `--set` option reads it through workers.core.merge.parse_sets, and
    the CLI through workers.core.merge.parse_set: no second parser to drift."""
    from rollway_cli import launchfile
    from workers.core import merge

    assert launchfile.parse_set("lora.enabled=no") == merge.parse_set("lora.enabled=no") == {"lora": {"enabled": "no"}}
    scripts = [p for p in sorted((REPO / "bench").glob("*.py")) if '"--set"' in p.read_text()]
    assert len(scripts) >= 4
    for script in scripts:
        tree = ast.parse(script.read_text())
        called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        assert "parse_sets" in called, f"{script.name} reads --set without workers.core.merge.parse_sets"
        assert "yaml" not in script.read_text() or "safe_load" not in script.read_text()


def test_the_cli_grammar_loads_without_torch():
    """The `rollway` command line installs without the engine's heavy dependencies."""
    code = "import sys; import rollway_cli.launchfile; print('torch' in sys.modules, 'pydantic' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_a_launch_files_relative_dataset_paths_are_read_beside_it(tmp_path):
    from rollway_cli.launchfile import launch_body

    folder = tmp_path / "project" / "runs"
    folder.mkdir(parents=True)
    spec = folder / "run.yaml"
    spec.write_text(
        "task:\n  dataset:\n    path: ../data/rows.jsonl\n    eval_path: ./held.jsonl\n"
        "overrides:\n  stop: {max_steps: 3}\n"
    )
    dataset = launch_body(spec, [])["overrides"]["task"]["dataset"]
    assert dataset == {
        "path": str(tmp_path / "project" / "data" / "rows.jsonl"),
        "eval_path": str(folder / "held.jsonl"),
    }
    # A Hub id, an absolute path and a --set value are sent as written.
    spec.write_text("task.dataset.path: acme/sums\n")
    assert launch_body(spec, [])["overrides"]["task"]["dataset"]["path"] == "acme/sums"
    spec.write_text("task.dataset.path: /srv/data/rows.jsonl\n")
    assert launch_body(spec, [])["overrides"]["task"]["dataset"]["path"] == "/srv/data/rows.jsonl"
    body = launch_body(spec, ["task.dataset.path=./other.jsonl"])
    assert body["overrides"]["task"]["dataset"]["path"] == "./other.jsonl"
