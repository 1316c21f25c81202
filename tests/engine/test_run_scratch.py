"""A run's temporary files live in its scratch directory, which goes when the run ends,
however it ends; a config path outside the allowed roots fails the run with a sentence,
even when it got past the launch check. Real driver, real actors, in-process Ray."""

from __future__ import annotations

import os

import pytest

from tests.engine.helpers import GONE_WAIT_S, TOKEN, policy_bytes, tiny_config, wait_for
from workers.core.run_actors import run_actor_names
from workers.run.lifecycle import cancel, launch
from workers.run.paths import Confinement

pytestmark = pytest.mark.slow


@pytest.fixture
def box(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    return Confinement.from_lists([str(models)], [], str(tmp_path / "scratch"))


def start(run_id, stub, cache_dir, box, **overrides) -> str:
    return launch(
        run_id, tiny_config(**overrides), ingest_url=stub.url, token=TOKEN, cache_dir=cache_dir, confinement=box
    )


def ended(run_id, stub, timeout=240) -> str:
    wait_for(lambda: stub.status.get(run_id) in ("succeeded", "failed"), timeout, "a terminal status")
    wait_for(lambda: not run_actor_names(run_id), GONE_WAIT_S, "the run's actors to exit")
    return stub.status[run_id]


def test_a_filesystem_sync_run_moves_whole_files_through_its_scratch_and_leaves_nothing(cluster, stub, cache_dir, box):
    scratch = box.scratch_dir(301)
    start(301, stub, cache_dir, box, sync={"protocol": "filesystem"}, stop={"max_steps": 6})
    # The versions are written under the scratch while the run goes on.
    wait_for(lambda: os.path.isdir(os.path.join(scratch, "sync")), 120, "filesystem sync to write into the scratch")
    assert ended(301, stub) == "succeeded", stub.errors.get(301)
    assert not os.path.exists(scratch)
    assert os.listdir(box.scratch_root) == []
    # Each version arrived as one safetensors file: every weight plus its JSON header.
    series = stub.series(301)
    full = policy_bytes(cache_dir)
    assert series["sync/bytes"] and all(full < v < full + 2**16 for v in series["sync/bytes"].values())
    assert series["sync/latency_ms"] and series["sync/inference_ms"]


def test_a_failed_run_leaves_no_scratch(cluster, stub, cache_dir, box):
    broken = os.path.join(box.model_roots[0], "broken")
    os.mkdir(broken)
    with open(os.path.join(broken, "config.json"), "w") as f:
        f.write("{ this is not a model config")
    start(302, stub, cache_dir, box, model={"source": "path", "path": broken})
    assert ended(302, stub, timeout=120) == "failed"
    assert not os.path.exists(box.scratch_dir(302))


def test_a_cancelled_run_leaves_no_scratch(cluster, stub, cache_dir, box):
    start(303, stub, cache_dir, box, sync={"protocol": "filesystem"}, stop={"max_steps": 10_000})
    wait_for(lambda: stub.series(303).get("reward/mean"), 120, "the first trained step")
    assert os.path.isdir(box.scratch_dir(303))
    assert cancel(303, timeout_s=20)
    wait_for(lambda: not os.path.exists(box.scratch_dir(303)), GONE_WAIT_S, "the scratch to go")


def test_a_path_outside_the_roots_fails_the_run_with_a_sentence(cluster, stub, cache_dir, box, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "config.json").write_text("{}")
    start(304, stub, cache_dir, box, model={"source": "path", "path": str(outside)})
    assert ended(304, stub, timeout=120) == "failed"
    error = stub.errors[304]
    assert error.startswith("model.path:") and "outside the allowed roots" in error
    assert "Traceback" not in error
    assert not os.path.exists(box.scratch_dir(304))
