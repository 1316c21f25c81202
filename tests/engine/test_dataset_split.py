"""A dataset's train/held-out split is keyed by `task.dataset.split_seed`, not the run's
seed: a warm start under one seed and runs under others share one held-out set, the
default split is the one seed-0 runs always had, and a model directory or checkpoint
records its split, so a run that would hold out rows it trained on is refused."""

from __future__ import annotations

import os
import random
import shutil
from collections import Counter

import pytest

from tests.engine.helpers import small_config
from workers.config.presets import deep_merge
from workers.config.run_config import RunConfig
from workers.model.loading import load_model
from workers.rollout.shipped_data import DATA_DIR
from workers.rollout.task_data import SPLIT_FILE, load_splits, read_rows, read_split_record
from workers.run.checkpoints import (
    CheckpointRefused,
    CheckpointTarget,
    check_resume_split,
    trainer_parts,
    write_checkpoint,
)
from workers.run.paths import Confinement
from workers.train.export import export_policy
from workers.train.trainer import Trainer
from workers.train.warmstart import demonstrations, policy_dir

COUNTDOWN = os.path.join(DATA_DIR, "countdown.jsonl")


def shipped(seed: int, **dataset) -> RunConfig:
    """The shipped countdown file as bench/learning.py's countdown-file recipe splits it."""
    return RunConfig.model_validate(
        {
            "seed": seed,
            "task": {"name": "countdown", "dataset": {"path": COUNTDOWN, "eval_fraction": 0.2, **dataset}},
            "model": {"max_position_embeddings": 64},
            "inference": {"max_new_tokens": 16},
        }
    )


def small(path: str, seed: int = 0, model_path: str | None = None, **dataset) -> RunConfig:
    """A config whose warm start takes milliseconds, on the rows at `path`."""
    model = {"source": "path", "path": model_path} if model_path else {}
    base = small_config().model_dump(mode="json", exclude={"model": {"source", "path"}})
    return RunConfig.model_validate(
        deep_merge(
            base,
            {
                "seed": seed,
                "model": {**model, "max_position_embeddings": 64},
                "task": {"name": "countdown", "dataset": {"path": path, "eval_fraction": 0.25, **dataset}},
                "inference": {"max_new_tokens": 16},
            },
        )
    )


def old_split(cfg: RunConfig) -> tuple[list, list]:
    """(train, held out) as a run split its rows before the split had a seed of its own."""
    rows = read_rows(cfg.task.dataset.path, "task.dataset.path", cfg)
    random.Random(f"dataset-{cfg.seed}").shuffle(rows)
    n_eval = round(len(rows) * cfg.task.dataset.eval_fraction)
    return rows[n_eval:], rows[:n_eval]


def test_the_default_split_is_the_one_seed_0_runs_always_had():
    cfg = shipped(seed=0)
    assert cfg.task.dataset.split_seed == 0
    train, held = old_split(cfg)
    splits = load_splits(cfg)
    # Same rows held out, in the same order; same training rows in the same order.
    assert splits.eval == held and splits.train == train


def test_a_warm_start_under_seed_0_and_runs_under_seeds_0_to_4_share_one_held_out_set():
    warm = shipped(seed=0)
    source, _, _ = demonstrations(warm)  # what the warm start teaches from
    # The file repeats some rows word for word; a row held once is told apart by its text.
    counts = Counter(read_rows(COUNTDOWN, "task.dataset.path", warm))
    taught = {row for row in source.rows if counts[row] == 1}
    runs = {seed: load_splits(shipped(seed)) for seed in range(5)}
    held = {seed: splits.eval for seed, splits in runs.items()}
    assert all(rows == held[0] for rows in held.values())
    assert len(held[0]) == 800 and len(taught) > 2900 and not taught & set(held[0])
    # The run's seed still orders its training rows.
    assert len({tuple(splits.train[:50]) for splits in runs.values()}) == 5
    assert {splits.record["fingerprint"] for splits in runs.values()} == {runs[0].record["fingerprint"]}
    # The control: split by each run's own seed, most of seed 3's held-out rows were taught.
    assert len(taught & set(old_split(shipped(3))[1])) > 500


def test_another_split_seed_holds_out_other_rows():
    zero, one = load_splits(shipped(0)), load_splits(shipped(0, split_seed=1))
    assert set(zero.eval) != set(one.eval) and zero.record["fingerprint"] != one.record["fingerprint"]
    assert zero.record["dataset"] == one.record["dataset"]


def write_small_rows(path) -> str:
    rows = [f'{{"prompt": "{a} {b}:{a + b}=", "answer": "{a} {b}:{a + b}"}}' for a in range(1, 9) for b in range(1, 6)]
    path.write_text("\n".join(rows) + "\n")
    return str(path)


@pytest.fixture
def warm_started(tmp_path):
    """(rows file, a policy warm-started on it under seed 0, a confinement allowing both)."""
    data = tmp_path / "data"
    data.mkdir()
    rows = write_small_rows(data / "rows.jsonl")
    policy = policy_dir(small(rows, seed=0), str(tmp_path / "models" / "cache"))
    confinement = Confinement(model_roots=(str(tmp_path / "models"),), data_roots=(str(data),))
    return rows, policy, confinement


def test_a_warm_started_policy_records_its_split(warm_started):
    rows, policy, _ = warm_started
    assert read_split_record(policy) == load_splits(small(rows, seed=0)).record


def test_runs_from_a_warm_start_under_other_seeds_are_accepted(warm_started):
    rows, policy, confinement = warm_started
    for seed in range(5):
        assert confinement.errors(small(rows, seed=seed, model_path=policy)) == {}


def test_a_launch_from_a_model_trained_on_another_split_is_refused_naming_both(warm_started):
    rows, policy, confinement = warm_started
    own = load_splits(small(rows, seed=3, split_seed=1)).record
    errors = confinement.errors(small(rows, seed=3, model_path=policy, split_seed=1))
    assert list(errors) == ["task.dataset.split_seed"]
    message = errors["task.dataset.split_seed"]
    trained = read_split_record(policy)["fingerprint"]
    assert f"split {trained} (task.dataset.split_seed 0" in message
    assert f"split {own['fingerprint']} (task.dataset.split_seed 1" in message
    assert "set task.dataset.split_seed to 0 and task.dataset.eval_fraction to 0.25" in message
    # Another held-out fraction is another split too.
    assert "task.dataset.split_seed" in confinement.errors(small(rows, model_path=policy, eval_fraction=0.5))


def test_a_model_without_a_recorded_split_or_from_other_data_is_accepted(warm_started, tmp_path):
    rows, policy, confinement = warm_started
    users = str(tmp_path / "models" / "users")
    shutil.copytree(policy, users)
    os.remove(os.path.join(users, SPLIT_FILE))
    assert confinement.errors(small(rows, model_path=users, split_seed=1)) == {}
    other = write_small_rows(tmp_path / "data" / "other.jsonl")
    with open(other, "a") as f:
        f.write('{"prompt": "9 9:18=", "answer": "9 9:18"}\n')
    assert confinement.errors(small(other, model_path=policy, split_seed=1)) == {}


def test_an_export_records_the_runs_split(warm_started, tmp_path):
    rows, policy, _ = warm_started
    cfg = small(rows, seed=2, model_path=policy)
    export_policy(load_model(policy), policy, str(tmp_path / "export"), cfg)
    assert read_split_record(str(tmp_path / "export")) == load_splits(cfg).record


def test_a_resume_across_splits_is_refused(warm_started, tmp_path):
    rows, policy, _ = warm_started
    cfg = small(rows, seed=1, model_path=policy)
    parts = trainer_parts(Trainer(cfg, policy), starved_s=0.0)
    record = write_checkpoint(CheckpointTarget(str(tmp_path / "ckpt"), 5), 1, parts)
    assert read_split_record(record.location) == load_splits(cfg).record  # also a model directory's record
    check_resume_split(record.location, small(rows, seed=4, model_path=policy))  # same split: resumes
    with pytest.raises(CheckpointRefused) as info:
        check_resume_split(record.location, small(rows, seed=1, model_path=policy, split_seed=7))
    assert info.value.field == "resume_from" and "set task.dataset.split_seed to 0" in info.value.message
