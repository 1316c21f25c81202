"""The prompt ledger across a kill (workers/run/ledger.py): a run killed while it trains
(one of its actors, or its driver) and resumed from the last checkpoint it completed
accounts for every row, whatever the killed run was doing at that moment.

The killed run also shows how a kill ends a run (each of these kills would otherwise
need a whole run of its own): every actor of the run exits, the driver's children with
their killed driver (the driver owns them); a killed trainer, inference worker or buffer
fails the run with a sentence naming it and the Ray actor, and the failure's record
keeps Ray's ActorDiedError and the actor's name (workers/run/failures.py).

Each example kills one role after a step chosen by a seeded draw, at whatever point of
its loop the run is then (generating, putting, training, writing a checkpoint): the
assertions hold for every such point, so where the kill lands changes which checkpoint
is the last, not the outcome. The draw picks the mode and the step only: each role is
killed in one example, whatever the draw; the async one whose driver was killed is
resumed, launched as the site launches a resume. A sync run's resume closes its ledger in
tests/engine/test_checkpoints.py (a resume reads only the checkpoint, whatever ended the
run it came from)."""

from __future__ import annotations

import random

import pytest
import ray

from tests.engine.helpers import GONE_WAIT_S, TOKEN, tiny_config, wait_for, warm_started
from workers.core.run_actors import NAMESPACE, actor_name, run_actor_names
from workers.run.checkpoints import BUFFER, INFERENCE, Checkpoint, list_checkpoints
from workers.run.ledger import LedgerTotals
from workers.run.lifecycle import launch
from workers.run.paths import Confinement

pytestmark = pytest.mark.slow

B = 4  # groups a step trains (tiny_config's trainer.batch_groups)
ROLES = ("trainer", "inference-0", "buffer", "driver")
_draw = random.Random(39)
# (run id, mode, the role killed, the step after which it is killed)
EXAMPLES = [(960 + i, _draw.choice(("sync", "async")), role, _draw.randint(1, 2)) for i, role in enumerate(ROLES)]
# How a failure names each role but the driver's (a killed driver posts nothing: the
# site's reconcile says it is gone, tests/integration/test_faults.py).
SAID = {"trainer": "The trainer", "inference-0": "Inference worker 0", "buffer": "The buffer"}
# The example resumed: a resume reads only the checkpoint, whose ledger every example
# checks, so which role was killed changes what it resumes from, not how; each resume is
# a whole run, and the sync run resumed in tests/engine/test_checkpoints.py (its ledger
# checked there too) proves the same path for the other mode.
RESUMED = ("driver",)


def ledger_of(stub, run_id: int) -> dict[str, float]:
    return {name: max(points.items())[1] for name, points in stub.series(run_id).items() if name.startswith("ledger/")}


def test_the_resumed_example_is_the_async_one():
    assert [mode for _, mode, role, _ in EXAMPLES if role in RESUMED] == ["async"]


@pytest.mark.parametrize(("run_id", "mode", "role", "after"), EXAMPLES)
def test_a_killed_run_stops_whole_names_the_killed_actor_and_its_last_checkpoint_accounts_for_every_row_on_resume(
    cluster, stub, cache_dir, tmp_path, run_id, mode, role, after
):
    root = str(tmp_path / "checkpoints")
    logs = tmp_path / "logs"
    confinement = Confinement(scratch_root=str(tmp_path / "scratch"), checkpoint_root=root, log_root=str(logs))
    checkpointed = {"every_steps": 1, "keep_last": 2}
    config = tiny_config(mode=mode, stop={"max_steps": 10_000}, checkpoint=checkpointed)
    warm_started(config, cache_dir)
    launch(run_id, config, ingest_url=stub.url, token=TOKEN, cache_dir=cache_dir, confinement=confinement)
    wait_for(lambda: len(stub.series(run_id).get("reward/mean", {})) >= after, 120, f"step {after}")
    victim = actor_name(run_id) if role == "driver" else f"{actor_name(run_id)}-{role}"
    ray.kill(ray.get_actor(victim, namespace=NAMESPACE), no_restart=True)
    if role != "driver":
        wait_for(lambda: stub.status.get(run_id) == "failed", 60, "the run to fail")
        assert (
            stub.errors[run_id]
            == f"{SAID[role]} (Ray actor {victim}) died: it was killed (ray.kill). Launch the run again."
        )
        [body] = [b for kind, run, b in stub.requests if kind == "status" and run == run_id and b["status"] == "failed"]
        assert "ActorDiedError" in body["failure"]["traceback"]
        assert body["failure"]["actor_name"] == victim
    # Every actor of the run exits: the driver's children die with a killed driver.
    wait_for(lambda: not run_actor_names(run_id), GONE_WAIT_S + 60, "the killed run's actors to exit")
    assert stub.status.get(run_id) != "succeeded"

    # The last checkpoint it completed accounts for every row it had drawn by then.
    last = list_checkpoints(root, run_id)[-1]
    ckpt = Checkpoint(last["location"])
    at_checkpoint = LedgerTotals.of(ckpt.load_json(INFERENCE), ckpt.load_json(BUFFER))
    assert at_checkpoint.unaccounted == 0, at_checkpoint
    assert at_checkpoint.trained == B * last["step"]
    if role not in RESUMED:
        return

    resumed_id, steps = run_id + 20, last["step"] + 1
    resumed = tiny_config(mode=mode, stop={"max_steps": steps}, checkpoint=checkpointed)
    launch(
        resumed_id, resumed, ingest_url=stub.url, token=TOKEN, cache_dir=cache_dir,
        confinement=confinement, resume_from=last["location"],
    )  # fmt: skip
    wait_for(lambda: stub.status.get(resumed_id) in ("succeeded", "failed"), 240, "the resumed run to end")
    assert stub.status[resumed_id] == "succeeded", stub.errors.get(resumed_id)
    # The driver's last points (the ledger's among them) follow its final status.
    wait_for(lambda: not run_actor_names(resumed_id), GONE_WAIT_S, "the resumed run's actors to exit")
    ledger = ledger_of(stub, resumed_id)
    assert ledger.get("ledger/unaccounted") == 0, (ledger, (logs / f"run-{resumed_id}.log").read_text()[-3000:])
    assert ledger["ledger/trained"] == B * steps
    assert ledger["ledger/drawn"] >= at_checkpoint.drawn
