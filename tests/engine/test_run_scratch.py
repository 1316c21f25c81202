"""A run's temporary files live in its scratch directory, which goes when the run ends,
however it ends (a cancelled run's: tests/engine/test_driver.py, whose cancelled run
syncs through its scratch); a config path outside the allowed roots fails the run with a
sentence, even when it got past the launch check. Real driver, real actors, in-process
Ray.

The filesystem sync run is the module's one whole run to its end, so it also carries
what any default async run shows: training one step off policy, the trainer and the
inference worker on a thread each, and the driver's start-up phases (a whole run costs
seconds of process start-up; its steps are cheap)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.engine.helpers import GONE_WAIT_S, TOKEN, policy_bytes, tiny_config, wait_for
from tests.engine.ingest_stub import IngestStub
from workers.core.run_actors import run_actor_names
from workers.run.buffer import FIRST_BATCH_HOLD_ENV
from workers.run.lifecycle import launch
from workers.run.paths import Confinement

pytestmark = pytest.mark.slow

WARM_START = {"steps": 6, "noisy_steps": 2}  # the filesystem run's own: short, and built by that run


def confine(root: Path) -> Confinement:
    """Model paths under <root>/models, run scratch under <root>/scratch."""
    models = root / "models"
    models.mkdir()
    return Confinement.from_lists([str(models)], [], str(root / "scratch"))


@pytest.fixture
def box(tmp_path):
    return confine(tmp_path)


def start(run_id, stub, cache_dir, box, **overrides) -> str:
    return launch(
        run_id, tiny_config(**overrides), ingest_url=stub.url, token=TOKEN, cache_dir=cache_dir, confinement=box
    )


def ended(run_id, stub, timeout=240) -> str:
    wait_for(lambda: stub.status.get(run_id) in ("succeeded", "failed"), timeout, "a terminal status")
    wait_for(lambda: not run_actor_names(run_id), GONE_WAIT_S, "the run's actors to exit")
    return stub.status[run_id]


@pytest.fixture(scope="module")
def filesystem_run(cluster, cache_dir, tmp_path_factory):
    """One async run with filesystem sync, launched as the site launches it, to its end:
    the run the tests below read. Its warm start is its own (a seed no other test uses,
    warm_start 6+2), so the driver builds it and reports the build's progress. While it
    runs, whether the versions were seen written under its scratch."""
    box = confine(tmp_path_factory.mktemp("filesystem-run"))
    config = tiny_config(
        seed=301,
        warm_start=WARM_START,
        buffer={"capacity": 2, "max_staleness": 1},
        sync={"protocol": "filesystem"},
        stop={"max_steps": 6},
    )
    sync_dir = os.path.join(box.scratch_dir(301), "sync")
    written = False

    def finished() -> bool:  # each poll also looks for the versions under the scratch
        nonlocal written
        written = written or os.path.isdir(sync_dir)
        return stub.status.get(301) in ("succeeded", "failed")

    with IngestStub(token=TOKEN) as stub:
        # The trainer's first step waits for two batches, both generated at version 0:
        # the second trains one version late whatever the host's load.
        hold = {FIRST_BATCH_HOLD_ENV: str(2 * config["trainer"]["batch_groups"])}
        launch(301, config, ingest_url=stub.url, token=TOKEN, cache_dir=cache_dir, confinement=box, env=hold)
        wait_for(finished, 240, "a terminal status")
        wait_for(lambda: not run_actor_names(301), GONE_WAIT_S, "the run's actors to exit")
        yield SimpleNamespace(stub=stub, box=box, config=config, written_while_running=written)


def test_a_filesystem_sync_run_moves_whole_files_through_its_scratch_and_leaves_nothing(filesystem_run, cache_dir):
    stub, box = filesystem_run.stub, filesystem_run.box
    assert stub.statuses[301] == ["running", "succeeded"], stub.errors.get(301)
    # The versions were written under the scratch while the run went on.
    assert filesystem_run.written_while_running
    assert not os.path.exists(box.scratch_dir(301))
    assert os.listdir(box.scratch_root) == []
    # Each version arrived as one safetensors file: every weight plus its JSON header.
    series = stub.series(301)
    full = policy_bytes(cache_dir, config=filesystem_run.config)
    assert series["sync/bytes"] and all(full < v < full + 2**16 for v in series["sync/bytes"].values())
    assert series["sync/latency_ms"] and series["sync/inference_ms"]


def test_an_async_run_trains_one_step_off_policy_its_trainer_and_worker_side_by_side(filesystem_run):
    stub = filesystem_run.stub
    assert stub.statuses[301] == ["running", "succeeded"], stub.errors.get(301)
    series = stub.series(301)
    # A buffer of 2 batches, max_staleness 1, the first step held until both were full:
    # inference ran ahead, within max_staleness.
    assert max(series["staleness/max"].values()) == 1.0
    assert series["is/ratio_mean"]  # IS correction reported
    threads = {p["actor"]: p["threads"] for p in stub.placement[301]}
    assert threads["trainer"] == threads["inference worker 0"] == 1, threads  # side by side: a thread each


def test_the_driver_reports_each_start_up_phase_in_order_then_stepping(filesystem_run):
    stub = filesystem_run.stub
    assert stub.statuses[301] == ["running", "succeeded"], stub.errors.get(301)
    phases = [phase for phase, _ in stub.phases[301]]
    # Each phase once, in order, except warm_start which repeats with its progress.
    order = [p for i, p in enumerate(phases) if i == 0 or phases[i - 1] != p]
    assert order == ["warm_start", "starting_engines", "first_step", "stepping"]
    details = dict(reversed(stub.phases[301]))  # the first detail of each phase
    assert "inference worker" in details["starting_engines"]
    steps = WARM_START["steps"] + WARM_START["noisy_steps"]
    assert stub.phases[301][phases.index("starting_engines") - 1][1].endswith(f"step {steps}/{steps}")


def test_a_failed_run_leaves_no_scratch(cluster, stub, cache_dir, box, tiny_model_dir):
    # A checkpoint every check passes (its config, tokenizer and a weights file) whose
    # weights cannot be read: the run fails building its policy, after its scratch was
    # made (the scratch root did not exist before; the scratch is made under it).
    corrupt = os.path.join(box.model_roots[0], "corrupt")
    shutil.copytree(tiny_model_dir, corrupt)
    Path(corrupt, "model.safetensors").write_bytes(b"these are not safetensors")
    assert not os.path.exists(box.scratch_root)
    start(302, stub, cache_dir, box, model={"source": "path", "path": corrupt})
    assert ended(302, stub, timeout=120) == "failed"
    assert stub.phases[302][-1][0] == "warm_start", stub.phases[302]
    assert os.listdir(box.scratch_root) == []  # made, then removed when the run failed


def test_a_path_outside_the_roots_fails_the_run_with_a_sentence(cluster, stub, cache_dir, box, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "config.json").write_text("{}")
    start(304, stub, cache_dir, box, model={"source": "path", "path": str(outside)})
    assert ended(304, stub, timeout=120) == "failed"
    error = stub.errors[304]
    assert error.startswith("model.path:") and "outside the allowed roots" in error
    assert "Traceback" not in error
    assert not os.path.exists(box.scratch_root)  # refused before its scratch was made
