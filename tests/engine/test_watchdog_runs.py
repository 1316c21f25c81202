"""Whole runs that hang: the watchdog (workers/run/watchdog.py) turns a wait that outlives
its deadline into the run's failure, naming the actor, its node and the operation.

Each run forces its hang through the engine's hook (workers.core.watch.HANG_ENV, which
the run's actors inherit through Ray's runtime_env): the n-th call of one operation
never returns. The floor (15 s, far above any of these calls' healthy durations here,
even on a loaded host) is the deadline, and the hang comes after enough earlier calls
that the ceiling does not apply; a hung run waits, using no CPU, for its deadline.
One run per kind of wait: an inference worker's generate call and its side of a
collective weight transfer, the trainer's step and its weight send, a reward worker's
call; the other operations' wrapping shows in what the watchdog saw end before the hang.

The five runs run side by side on one cluster, so that their hangs wait out the floor
together rather than one after another (each asks Ray for a tenth of a CPU per actor, so
all five fit the cluster's two); what each says is checked once all have ended.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.engine.helpers import run_config, tiny_config
from workers.core.merge import deep_merge
from workers.core.watch import GENERATE, HANG_ENV, SCORE, TRAIN_STEP, WEIGHT_LOAD, WEIGHT_SEND

pytestmark = pytest.mark.slow

WATCHDOG = {"multiple": 3, "floor_s": 15, "ceiling_s": 600}
CASES = {
    "generate": (f"{GENERATE}:7", "inference worker 0", {}),
    "weight send": (f"{WEIGHT_SEND}:7", "trainer", {}),
    "score": (f"{SCORE}:20", "reward worker 0", {"rewards": {"workers": 1}}),
    "train step": (f"{TRAIN_STEP}:7", "trainer", {}),
    # A collective: the worker's side of the trainer's broadcast (the send waits for it too,
    # and the watchdog names the operation that is stuck, not the one waiting on it).
    "weight load": (f"{WEIGHT_LOAD}:7", "inference worker 0", {"sync": {"protocol": "collective", "packed": False}}),
}


# Each run's actors reserve a tenth of a CPU (0.25 by default), so that the five runs fit
# a cluster of two CPUs at once: a reservation, not a limit (each computes on one thread).
SHARE = {"inference": {"cpus_per_worker": 0.1}, "trainer": {"cpus_per_rank": 0.1}}


def hung_run(cache_dir: str, case: str) -> dict:
    hang, _, extra = CASES[case]
    config = deep_merge(tiny_config(stop={"max_steps": 30}, watchdog=WATCHDOG), deep_merge(SHARE, extra))
    return run_config(7300 + list(CASES).index(case), cache_dir, config, env={HANG_ENV: hang})


def what_is_wrong(case: str, out: dict) -> str | None:
    """None where the run failed as the hang in `case` should fail it, else what differs."""
    hang, actor, _ = CASES[case]
    failure, error = out.get("failure") or {}, out.get("error") or ""
    checks = [
        (out["state"] == "failed" and failure.get("kind") == "hang", f"not failed by a hang: {error}"),
        (failure.get("actor") == actor and failure.get("operation", "").startswith(case), f"named {failure}"),
        (bool(failure.get("node")) and failure.get("node") in error, f"no node in: {error}"),
        (error.startswith(f"The {actor} on node ") and f"has been in its {case} for " in error, error),
        ("past its deadline of 15 s (watchdog.floor_s; 3 × the p99 of its last" in error, error),
    ]
    watched = out.get("watched") or {}
    if case == "generate":  # what ended before the hang: every operation of the two actors
        worker, trainer = watched.get("inference worker 0", {}), watched.get("trainer", {})
        checks.append((worker.get(GENERATE) == 6 and worker.get(WEIGHT_LOAD, 0) >= 1, f"watched {watched}"))
        checks.append((trainer.get(TRAIN_STEP, 0) >= 1 and trainer.get(WEIGHT_SEND, 0) >= 1, f"watched {watched}"))
    else:
        checks.append((watched.get(actor, {}).get(case) == int(hang.rpartition(":")[2]) - 1, f"watched {watched}"))
    wrong = [why for ok, why in checks if not ok]
    return wrong[0] if wrong else None


def test_a_hang_fails_the_run_naming_actor_node_and_operation(cluster, cache_dir):
    with ThreadPoolExecutor(len(CASES)) as pool:
        outs = dict(zip(CASES, pool.map(lambda case: hung_run(cache_dir, case), CASES), strict=True))
    wrong = {case: why for case, out in outs.items() if (why := what_is_wrong(case, out)) is not None}
    assert not wrong, wrong
