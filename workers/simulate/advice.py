"""What a simulated run says about itself: which pool starves, and what to change.

A simulation's summary holds each pool's busy share and the groups dropped as stale; read
alone, "trainer busy 0.10" asks the reader to know that the trainer then waits on
generation and that the GPUs' split is the knob. `advice` turns the summary into the
sentences a run's page shows, each naming the setting that would change it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from workers.config.run_config import RunConfig
    from workers.simulate.cluster import Cluster

# A pool busy less than this share of the run starves (the busier one bounds the run); an
# async run's inference workers busy less than BUSY as well are held by the staleness bound.
STARVED = 0.5
BUSY = 0.8
# Dropping more than this share of the generated groups as stale is worth a sentence.
DROPPED = 0.05


def advice(summary: dict, cfg: RunConfig, cluster: Cluster) -> list[str]:
    """Sentences on which pool bounds the run and on the groups it threw away, each
    with the setting to change; one sentence saying neither starves when none applies."""
    trainer, inference = summary["trainer_busy"], summary["inference_busy"]
    colocated = cfg.placement.mode == "colocated"
    out = []
    if trainer < STARVED and trainer <= inference:
        fix = (
            "generation is the whole step here: shorter completions or a faster engine"
            if colocated
            else f"give generation more of the GPUs (cluster.inference_share above {cluster.inference_share:g})"
        )
        out.append(
            f"The trainer waits {1 - trainer:.0%} of the time: generation bounds this run (inference busy "
            f"{inference:.0%}); {fix}."
        )
        if inference < BUSY and cfg.mode == "async":
            out.append(
                f"The inference workers wait {1 - inference:.0%} of the time too: the staleness bound holds them "
                f"(buffer.max_staleness {cfg.buffer.max_staleness}) until the trainer's next version, so more "
                "generation GPUs help only with a looser bound."
            )
    elif inference < STARVED and inference <= trainer:
        fix = (
            "the step is the trainer's: more trainer GPUs or a cheaper step"
            if colocated
            else f"give the trainer more of the GPUs (cluster.inference_share below {cluster.inference_share:g})"
        )
        ahead = "" if cfg.mode == "sync" else ", or let generation run further ahead (buffer.max_staleness)"
        out.append(
            f"The inference workers wait {1 - inference:.0%} of the time: the trainer bounds this run (trainer "
            f"busy {trainer:.0%}); {fix}{ahead}."
        )
    dropped = summary["dropped_share"]
    if dropped > DROPPED:
        what = "generated again (buffer.on_stale requeue)" if cfg.buffer.on_stale == "requeue" else "dropped"
        out.append(
            f"{dropped:.0%} of the generated groups were {what} as stale (older than buffer.max_staleness "
            f"{cfg.buffer.max_staleness} versions): raise buffer.max_staleness, or let generation run less far "
            "ahead (a smaller buffer.capacity or buffer.max_head_offpolicyness)."
        )
    if not out:
        out.append(
            f"Neither pool starves: trainer busy {trainer:.0%}, inference busy {inference:.0%}, "
            f"{dropped:.0%} of the groups dropped as stale."
        )
    return out
