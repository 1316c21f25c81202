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
"""

from __future__ import annotations

import pytest

from tests.engine.helpers import run_config, tiny_config
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


@pytest.mark.parametrize("case", list(CASES))
def test_a_hang_fails_the_run_naming_actor_node_and_operation(cluster, cache_dir, case):
    hang, actor, extra = CASES[case]
    config = tiny_config(stop={"max_steps": 30}, watchdog=WATCHDOG, **extra)
    out = run_config(7300 + list(CASES).index(case), cache_dir, config, env={HANG_ENV: hang})
    failure = out["failure"]
    assert out["state"] == "failed" and failure["kind"] == "hang", out["error"]
    assert failure["actor"] == actor and failure["operation"].startswith(case)
    assert failure["node"] and failure["node"] in out["error"]
    assert out["error"].startswith(f"The {actor} on node ") and f"has been in its {case} for " in out["error"]
    assert "past its deadline of 15 s (watchdog.floor_s; 3 × the p99 of its last" in out["error"]
    watched = out["watched"]
    if case == "generate":  # what ended before the hang: every operation of the two actors
        assert watched["inference worker 0"][GENERATE] == 6 and watched["inference worker 0"][WEIGHT_LOAD] >= 1
        assert watched["trainer"][TRAIN_STEP] >= 1 and watched["trainer"][WEIGHT_SEND] >= 1
    else:
        assert watched[actor][case] == int(hang.rpartition(":")[2]) - 1
