"""Weight-update modes as a switch of a real run: the driver, a Ray buffer, an inference
worker and the trainer on in-process Ray (torch backend); test_driver_vllm.py runs the
same order on vLLM.

The stepped modes' runs force weights to arrive mid-generation (WEIGHTS_MID_GENERATION_ENV,
which the run's actors inherit through Ray's runtime_env): every generate call after the
first waits after its first decode step until the trainer has published the version its
predecessor's groups allow, so call k (k >= 2) runs on version k - 2 and takes k - 1 in
its middle, whatever the host's load. No warm start (the policy seldom says EOS, so
sequences are still generating when the weights come) and 56-token completions; the
worker may run ahead (unbounded stream, η = 3): the abort modes abort and count, in-flight
and resumed sequences mix versions, and every trained token stays within max_staleness.
`drain` loads weights only between calls, so no order is needed and nothing mixes: the
drain presets' runs check that (tests/engine/test_presets.py).

Each stepped mode's run is then replayed (workers/run/schedule.py), not forced: the
replay loads weights at the decode steps the original recorded and nowhere else, and
trains the same batches to the same weights, bit for bit.
"""

from __future__ import annotations

import pytest

from tests.engine.helpers import (
    assert_made_the_same_loads,
    assert_trained_the_same,
    mixed_from_the_second_step,
    run_config,
    tiny_config,
)
from workers.rollout.partial_rollouts import WEIGHTS_MID_GENERATION_ENV
from workers.run.schedule import Schedule

pytestmark = pytest.mark.slow

AHEAD = {"mode": "unbounded", "max_staleness": 3, "max_head_offpolicyness": 3}
STEPS = 8


MODES = ["abort_retry", "abort_resume", "in_flight"]


@pytest.mark.parametrize("mode", MODES)
def test_update_mode_in_a_run_and_its_replay(cluster, cache_dir, mode):
    run_id = 7100 + 2 * MODES.index(mode)
    config = tiny_config(
        buffer=AHEAD,
        sync={"update_mode": mode},
        stop={"max_steps": STEPS},
        warm_start={"steps": 0, "noisy_steps": 0},
        inference={"max_new_tokens": 56},
        trainer={"batch_groups": 2, "group_size": 4},
    )
    out = run_config(run_id, cache_dir, config, env={WEIGHTS_MID_GENERATION_ENV: "1"})
    assert out["state"] == "succeeded", out["error"]
    series = {k: dict(v) for k, v in out["series"].items()}

    def last(name: str) -> float:  # the value at the last step: a cumulative series' total
        return series[name][max(series[name])]

    assert sorted(series["loss"]) == list(range(1, STEPS + 1))
    assert max(series["staleness/max"].values()) <= 3
    aborted, resumed, retried = (last(f"rollout/partial_{k}") for k in ("aborted", "resumed", "retried"))
    mixed = series["rollout/mixed_version_frac"]
    mixes = mixed_from_the_second_step(mixed, STEPS)  # where the mode keeps a sequence's tokens
    if mode == "abort_retry":
        assert aborted >= STEPS - 1 and retried == aborted and resumed == 0, (aborted, resumed, retried)
        assert set(mixed.values()) == {0.0}  # a retried sequence starts again on the new weights
    elif mode == "abort_resume":
        assert aborted >= STEPS - 1 and resumed == aborted and retried == 0, (aborted, resumed, retried)
        assert mixes, mixed
    else:
        assert aborted == resumed == retried == 0 and mixes, mixed
    # Mixed-version tokens still carry the logprobs of the weights that sampled them.
    assert all(0.5 < v < 2.0 for v in series["is/ratio_mean"].values())
    # Each call after the first loaded the next version after its first decode step (the
    # last call may have been cut short by the run's end); the replay, not forced, loads
    # there and trains what the original trained.
    loads = Schedule.from_json(out["schedule"]).loads
    assert [(x.call, x.step, x.version) for x in loads][: STEPS - 2] == [(c, 1, c) for c in range(1, STEPS - 1)]
    again = run_config(run_id + 1, cache_dir, config, replay=out["schedule"])
    assert_made_the_same_loads(out, again, STEPS)
    assert_trained_the_same(out, again)
