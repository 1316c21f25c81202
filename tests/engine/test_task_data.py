"""task.dataset: each file format, the column mapping, the split, the seeded shuffle,
confinement under the data roots, and the errors that name the field."""

from __future__ import annotations

import csv
import json
import os
import random

import pydantic
import pytest

from workers.config.run_config import RunConfig
from workers.rl_tasks import make_task
from workers.rollout.shipped_data import DATA_DIR, write
from workers.rollout.task_data import DatasetError, DatasetPrompts, load_splits, worker_prompts
from workers.run.paths import Confinement
from workers.train.warmstart import demonstrations

ROWS = [{"q": f"{a} {b} 1:{a + b + 1}=", "a": f"{a} {b} 1:{a + b + 1}"} for a in range(1, 6) for b in range(1, 5)]


def write_rows(path, rows=ROWS) -> str:
    ext = os.path.splitext(path)[1]
    if ext == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif ext == ".json":
        path.write_text(json.dumps(rows))
    elif ext == ".csv":
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    elif ext == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), str(path))
    return str(path)


def config(path: str, seed: int = 0, **dataset) -> RunConfig:
    return RunConfig.model_validate(
        {
            "seed": seed,
            "task": {
                "name": "countdown",
                "dataset": {"path": path, "prompt_column": "q", "answer_column": "a", **dataset},
            },
            "inference": {"max_new_tokens": 13},
        }
    )


@pytest.mark.parametrize("ext", [".jsonl", ".json", ".csv", ".parquet"])
def test_each_format_loads_with_its_column_mapping(tmp_path, ext):
    path = write_rows(tmp_path / f"rows{ext}")
    splits = load_splits(config(path, eval_fraction=0.25))
    assert (len(splits.train), len(splits.eval)) == (15, 5)
    expected = {(r["q"], r["a"]) for r in ROWS}
    assert set(splits.train) | set(splits.eval) == expected and not set(splits.train) & set(splits.eval)


def test_the_shuffle_follows_the_seed(tmp_path):
    path = write_rows(tmp_path / "rows.jsonl")
    first, again, other = (load_splits(config(path, seed=s)) for s in (1, 1, 2))
    assert first == again
    assert first.train != other.train
    assert first.train != [(r["q"], r["a"]) for r in ROWS][4:]  # shuffled, not file order


def test_a_separate_eval_file_is_the_eval_split(tmp_path):
    train = write_rows(tmp_path / "train.jsonl")
    held = write_rows(tmp_path / "eval.csv", ROWS[:3])
    splits = load_splits(config(train, eval_fraction=0, eval_path=held))
    assert len(splits.train) == len(ROWS) and set(splits.eval) == {(r["q"], r["a"]) for r in ROWS[:3]}
    with pytest.raises(pydantic.ValidationError, match="either eval_fraction"):
        config(train, eval_path=held)


@pytest.mark.parametrize(
    ("content", "name", "dataset", "field", "says"),
    [
        (None, "rows.txt", {}, "task.dataset.path", "no known extension"),
        (None, "missing.jsonl", {}, "task.dataset.path", "is not a file"),
        ("{not json", "bad.jsonl", {}, "task.dataset.path", "cannot be read as json"),
        (ROWS, "rows.jsonl", {"answer_column": "target"}, "task.dataset.answer_column", "no column 'target'"),
        ([{"q": "3 5!:8=", "a": "3 5:8"}], "rows.jsonl", {"eval_fraction": 0}, "task.dataset.path", "lacks: ['!']"),
        ([{"q": "1 " * 40 + ":2=", "a": "1 1:2"}], "rows.jsonl", {"eval_fraction": 0}, "task.dataset.path", "max_pos"),
        (ROWS[:1], "rows.jsonl", {"eval_fraction": 0.9}, "task.dataset.eval_fraction", "leaves no training rows"),
    ],
)
def test_a_file_the_run_cannot_use_names_the_field(tmp_path, content, name, dataset, field, says):
    path = tmp_path / name
    if isinstance(content, list):
        write_rows(path, content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(DatasetError) as info:
        load_splits(config(str(path), **dataset))
    assert info.value.field == field and says in info.value.message


def test_confinement_refuses_a_dataset_outside_the_data_roots(tmp_path):
    allowed, outside = tmp_path / "data", tmp_path / "elsewhere"
    allowed.mkdir()
    outside.mkdir()
    inside = write_rows(allowed / "rows.jsonl")
    escaped = write_rows(outside / "rows.jsonl")
    os.symlink(escaped, allowed / "link.jsonl")
    confinement = Confinement(data_roots=(str(allowed),))
    assert confinement.errors(config(inside)) == {}
    for path in (escaped, str(allowed / "link.jsonl"), str(allowed / ".." / "elsewhere" / "rows.jsonl")):
        errors = confinement.errors(config(path))
        assert list(errors) == ["task.dataset.path"] and "ROLLWAY_DATA_ROOTS" in errors["task.dataset.path"]
    assert "ROLLWAY_DATA_ROOTS is empty" in Confinement().errors(config(inside))["task.dataset.path"]
    # Allowed, but unusable: the same check names the column.
    bad_column = config(inside, prompt_column="question")
    assert "no column 'question'" in confinement.errors(bad_column)["task.dataset.prompt_column"]


def test_workers_draw_disjoint_shares_in_turn(tmp_path):
    cfg = config(write_rows(tmp_path / "rows.jsonl"), eval_fraction=0)
    task = make_task(cfg.task)
    shares = [worker_prompts(cfg, task, i, 2).sample(10, random.Random(i)) for i in range(2)]
    assert not set(shares[0]) & set(shares[1]) and len(set(shares[0]) | set(shares[1])) == 20
    source = DatasetPrompts([("a=", "a"), ("b=", "b")])
    assert sorted(source.sample(4, random.Random(0))) == [("a=", "a"), ("a=", "a"), ("b=", "b"), ("b=", "b")]


def test_a_dataset_source_restored_from_its_state_draws_on_as_the_original():
    rows = [(f"{c}=", c) for c in "abcdefgh"]
    original, rng = DatasetPrompts(rows), random.Random(3)
    original.sample(11, rng)  # past one pass: the rows are reshuffled
    state = json.loads(json.dumps(original.state_dict()))  # as a checkpoint stores it
    saved_rng = rng.getstate()
    want = original.sample(9, rng)

    def draws(source: DatasetPrompts) -> list:
        again = random.Random()
        again.setstate(saved_rng)
        return source.sample(9, again)

    restored = DatasetPrompts(rows)
    restored.load_state_dict(state)
    assert draws(restored) == want
    assert draws(DatasetPrompts(rows)) != want  # the control: without the state, other draws


def test_the_warm_start_draws_demonstrations_from_the_train_split(tmp_path):
    cfg = config(write_rows(tmp_path / "rows.jsonl"), eval_fraction=0.5)
    source, demo, _ = demonstrations(cfg)
    train = set(load_splits(cfg).train)
    task = make_task(cfg.task)
    for prompt, answer in source.sample(30, random.Random(0)):
        assert (prompt, answer) in train and task.reward(demo(prompt, answer), answer) == 1.0


def test_the_shipped_datasets_are_what_the_generator_writes(tmp_path):
    written = write(str(tmp_path))
    for path in written:
        shipped = os.path.join(DATA_DIR, os.path.basename(path))
        with open(path) as a, open(shipped) as b:
            assert a.read() == b.read(), f"{shipped} is stale: run python -m workers.rollout.shipped_data"
    cfg = config(os.path.join(DATA_DIR, "countdown.jsonl"), prompt_column="prompt", answer_column="answer")
    splits = load_splits(cfg)
    assert (len(splits.train), len(splits.eval)) == (3600, 400)


# --- loads that start together --------------------------------------------------------


@pytest.fixture
def fresh_progress_bar_lock(monkeypatch):
    """tqdm as a new process has it (no class lock yet), with the thread switch that
    loses the race made likely: creating a missing lock yields first, as a thread may
    be preempted right there (tqdm.contrib.concurrent.ensure_lock checks for a lock,
    then creates one, then deletes it on the way out if it had found none)."""
    import importlib
    import time

    import tqdm.std

    for cls in (tqdm.std.tqdm, importlib.import_module("datasets.utils.tqdm").tqdm):
        if "_lock" in vars(cls):
            monkeypatch.delattr(cls, "_lock")
    get_lock = tqdm.std.tqdm.get_lock.__func__

    def get_lock_after_a_switch(cls):
        if not hasattr(cls, "_lock"):
            time.sleep(0.02)
        return get_lock(cls)

    monkeypatch.setattr(tqdm.std.tqdm, "get_lock", classmethod(get_lock_after_a_switch))


def test_many_loads_starting_at_once_all_succeed(tmp_path, fresh_progress_bar_lock):
    import threading

    paths = [write_rows(tmp_path / f"rows{k}.parquet") for k in range(12)]
    start = threading.Barrier(len(paths))
    failures: list[str] = []

    def load(path: str) -> None:
        start.wait()
        try:
            assert len(load_splits(config(path, eval_fraction=0.25)).train) == 15
        except Exception as exc:
            failures.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=load, args=(p,)) for p in paths]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


def test_a_loader_fault_says_the_loader_failed_not_the_file(tmp_path, monkeypatch):
    import datasets

    from workers.rollout.task_data import DatasetLoadError

    path = write_rows(tmp_path / "rows.parquet")

    def broken(*args, **kwargs):
        raise AttributeError("type object 'tqdm' has no attribute '_lock'")

    monkeypatch.setattr(datasets, "load_dataset", broken)
    with pytest.raises(DatasetLoadError) as caught:
        load_splits(config(path))
    message = str(caught.value)
    assert message.startswith("task.dataset.path: loading") and "inside the datasets library" in message
    assert "AttributeError" in message and "cannot be read as" not in message
    assert not isinstance(caught.value, DatasetError)


def test_a_corrupt_file_is_still_blamed_on_the_file(tmp_path):
    path = tmp_path / "rows.parquet"
    path.write_bytes(b"not parquet at all")
    with pytest.raises(DatasetError, match="cannot be read as parquet: ArrowInvalid"):
        load_splits(config(str(path)))
