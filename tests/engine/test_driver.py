"""The run lifecycle on in-process Ray with the torch backend: launch, metrics, status,
cancel, idempotency, failure.

Elsewhere, on runs that exist there anyway (each whole run costs seconds of process
start-up): async mode one step off policy and the start-up phases on
tests/engine/test_run_scratch.py's filesystem sync run; sync mode taking turns (staleness
0, the trainer waiting, each phase on both phases' threads) on
tests/engine/test_eval_runs.py's sync run, and eval being off by default on
tests/engine/test_task_runs.py's calculator run; the run's actors dying with their killed
driver, and a killed actor named in the run's error, in
tests/engine/test_ledger_resume.py. The vocabulary run also syncs deltas (the bytes each
version moved)."""

from __future__ import annotations

import os
import time

import pytest
import ray

from tests.engine.helpers import GONE_WAIT_S, TOKEN, policy_bytes, tiny_config, wait_for, warm_started
from tests.engine.ingest_stub import IngestStub
from workers.core.metric_names import METRICS, MULTI_AGENT, NAMES, PER_RANK
from workers.core.run_actors import NAMESPACE, run_actor_names
from workers.rollout.reward_stage import POOL_SERIES
from workers.run.lifecycle import cancel, is_alive, launch
from workers.run.paths import Confinement
from workers.run.schedule import Schedule

pytestmark = pytest.mark.slow


def start(run_id: int, stub: IngestStub, cache_dir: str, confinement: Confinement | None = None, **overrides) -> str:
    config = tiny_config(**overrides)
    warm_started(config, cache_dir)
    return launch(run_id, config, ingest_url=stub.url, token=TOKEN, cache_dir=cache_dir, confinement=confinement)


def test_a_launched_run_reports_the_vocabulary_and_succeeds(cluster, stub, cache_dir):
    # KL to the initial policy and dynamic sampling on: their series are emitted only then.
    # The run also syncs deltas (sync.delta, bfloat16 inference) at a small learning rate,
    # which changes no series: a run of its own would prove the rest again.
    trainer = {"batch_groups": 4, "group_size": 4, "kl_coef": 0.01, "dynamic_sampling": True, "lr": 1e-6}
    delta = {"sync": {"delta": True}, "inference": {"dtype": "bfloat16"}}
    assert start(101, stub, cache_dir, eval={"every_steps": 2, "num_prompts": 8}, trainer=trainer, **delta) == "run-101"
    wait_for(lambda: stub.status.get(101) in ("succeeded", "failed"), 180, "a terminal status")
    assert stub.statuses[101] == ["running", "succeeded"], stub.errors.get(101)

    series = stub.series(101)
    always = {m.name for m in METRICS if not m.only}
    assert always <= set(series), f"missing: {sorted(always - set(series))}"
    # The default config (bounded buffer, token_tis correction) with the eval pass on
    # meets the condition of every series marked `only` but the per-rank ones (a trainer
    # pool's: tests/engine/test_trainer_pool_runs.py) and routing/agreement (a mixture of
    # experts with keep_routing: tests/engine/test_metric_vocabulary.py) and the reward
    # pool's (rewards.workers ≥ 1: tests/engine/test_reward_stage.py) and the episodes'
    # (a multi-agent task or buffer.unit episode: tests/engine/test_multi_agent_runs.py)
    # and trainer/mfu (a device with a known peak: tests/engine/test_mfu.py) and
    # inference/asleep_frac (vLLM sleeping for a colocated trainer:
    # tests/engine/test_driver_vllm.py), so this run emits the rest of the vocabulary.
    episode_series = {m.name for m in METRICS if m.only == MULTI_AGENT}
    others = {"routing/agreement", "trainer/mfu", "inference/asleep_frac"}
    expected = NAMES - PER_RANK - others - POOL_SERIES - episode_series
    assert set(series) == expected, f"mode-specific missing: {sorted(expected - set(series))}"
    assert max(series["eval/pass@k"]) == 4  # the end of the run's pass, on the final weights
    assert sorted(series["reward/mean"]) == [1, 2, 3, 4]  # one point per step, step = version
    assert series["policy/version"] == {s: float(s) for s in range(1, 5)}
    assert all(0 <= v <= 1 for v in series["inference/idle_frac"].values())
    # Delta sync: the first version goes whole (in bfloat16, half the float32 policy),
    # each later one as its few changed elements.
    sent = series["sync/bytes"]
    assert sent[1] == pytest.approx(policy_bytes(cache_dir) / 2, rel=0.01)
    assert all(0 < sent[step] < sent[1] / 4 for step in (2, 3, 4)), sent
    assert stub.received == len(stub.points)  # nothing posted twice

    # The recorded schedule reaches the site before the status that ends the run: a batch
    # a step, each of B groups, in the form a replay takes.
    schedule = Schedule.from_json(stub.schedule[101])
    assert [len(b.group_ids) for b in schedule.batches] == [4] * 4
    assert stub.schedule[101]["bytes"] == schedule.size_bytes() == series["schedule/bytes"][4]
    kinds = [(kind, body.get("status")) for kind, run_id, body in stub.requests if run_id == 101]
    assert kinds.index(("schedule", None)) < kinds.index(("status", "succeeded"))

    # The driver exits when done, and its actors with it.
    wait_for(lambda: not run_actor_names(101), GONE_WAIT_S, "the run's actors to exit")
    assert not is_alive(101)


def test_launching_twice_finds_the_running_driver_and_cancel_removes_every_run_actor_and_its_scratch(
    cluster, stub, cache_dir, tmp_path
):
    # Filesystem sync writes each version under the run's scratch directory while it runs.
    box = Confinement(scratch_root=str(tmp_path / "scratch"))
    scratch = box.scratch_dir(103)
    config = {"sync": {"protocol": "filesystem"}, "stop": {"max_steps": 10_000}}
    start(103, stub, cache_dir, box, **config)
    first = ray.get_actor("run-103", namespace=NAMESPACE)._actor_id
    start(103, stub, cache_dir, box, **config)
    assert ray.get_actor("run-103", namespace=NAMESPACE)._actor_id == first
    expected = ["run-103", "run-103-buffer", "run-103-inference-0", "run-103-trainer"]
    wait_for(lambda: run_actor_names(103) == expected, 120, f"actors {expected}")
    assert cancel(10, timeout_s=5) is False  # "run-10" is a prefix of "run-103": not touched
    assert run_actor_names(103) == expected
    wait_for(lambda: stub.series(103).get("reward/mean"), 120, "a first step")
    assert stub.statuses[103] == ["running"]  # started once
    assert os.path.isdir(scratch)

    # cancel raises TimeoutError naming the actors that outlive its timeout.
    assert cancel(103, timeout_s=GONE_WAIT_S) is True
    assert run_actor_names(103) == []
    for name in expected:
        with pytest.raises(ValueError):
            ray.get_actor(name, namespace=NAMESPACE)
    assert not is_alive(103)
    assert cancel(103) is False  # nothing left to cancel
    assert stub.statuses[103] == ["running"]  # no "succeeded" after a cancel
    # A cancelled run leaves no scratch.
    wait_for(lambda: not os.path.exists(scratch), GONE_WAIT_S, "the scratch to go")


def test_cancel_while_the_run_is_still_starting(cluster, stub, cache_dir):
    start(109, stub, cache_dir, stop={"max_steps": 10_000})
    assert cancel(109, timeout_s=GONE_WAIT_S) is True
    assert run_actor_names(109) == []
    time.sleep(1.0)  # nothing comes back: the driver did not go on to spawn
    assert run_actor_names(109) == []
