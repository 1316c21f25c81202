"""Where a run's actors go in Ray: the run's placement group and each actor's seat in it.

The config's `placement` section, `inference.num_workers` × `inference.tensor_parallel_size`,
`trainer.num_ranks`, `rewards.workers` and the CPUs and GPUs per actor become one Ray
placement group per run:

- **disaggregated**: one bundle per inference worker ({CPU, GPU: tensor_parallel_size})
  and one per trainer rank ({CPU, GPU: 1}); no two actors share a GPU;
- **colocated**: one bundle per GPU, max(inference workers, trainer ranks) of them;
  inference worker k and trainer rank k share bundle k's GPU, half of it each in Ray's
  accounting (a GPU with one actor gives it all). How the GPU's memory is split is the
  engines' business (`inference.gpu_memory_utilization`), not Ray's;
- in either mode, after those: one bundle per reward worker ({CPU: rewards.cpus_per_worker,
  GPU: rewards.gpus_per_worker}), shared with no other pool.

With `placement.devices` "cpu" the bundles hold CPUs only and no actor asks for a GPU.
Each pool's bundles carry its node label selector (`placement.inference_node`,
`placement.trainer_node`, `placement.rewards_node`); the group's `strategy` is Ray's.

`plan` and `totals` are pure (admission counts the same totals in the web process,
which never imports Ray); `create`, `actor_options` and `remove` are the Ray calls the
driver makes. The group belongs to the driver: Ray removes it with the driver if the
driver dies first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from workers.config.run_config import node_labels

if TYPE_CHECKING:
    from workers.config.run_config import RunConfig

# Colocated: the share of a GPU each of its two actors asks for.
COLOCATED_SHARE = 0.5


@dataclass(frozen=True)
class Seat:
    """One actor's place in the run's placement group and what it asks Ray for."""

    bundle: int
    num_cpus: float
    num_gpus: float


@dataclass(frozen=True)
class Plan:
    """The run's placement group (bundles, their node label selectors, the strategy)
    and the seat of each inference worker, trainer rank and reward worker, by index."""

    strategy: str
    bundles: list[dict[str, float]]
    selectors: list[dict[str, str]]
    inference: list[Seat]
    trainer: list[Seat]
    rewards: list[Seat]
    summary: str  # the request in words, for a message about a group Ray cannot place


@dataclass(frozen=True)
class Totals:
    """What a run's actors ask Ray for in all: CPUs, and GPUs by pool (colocated GPUs
    are counted once, in `gpus`)."""

    cpus: float
    gpus: float
    inference_gpus: float
    trainer_gpus: float
    rewards_gpus: float = 0.0


def _gpus_per_worker(cfg: RunConfig) -> int:
    return cfg.inference.tensor_parallel_size if cfg.placement.devices == "gpu" else 0


def _gpus_per_rank(cfg: RunConfig) -> int:
    return 1 if cfg.placement.devices == "gpu" else 0


def _gpus_per_reward_worker(cfg: RunConfig) -> float:
    return cfg.rewards.gpus_per_worker if cfg.placement.devices == "gpu" else 0.0


def totals(cfg: RunConfig) -> Totals:
    """The run's request in all, counted without a bundle per actor (a hostile config
    may ask for millions)."""
    w, r, k = cfg.inference.num_workers, cfg.trainer.num_ranks, cfg.rewards.workers
    cpus = w * cfg.inference.cpus_per_worker + r * cfg.trainer.cpus_per_rank + k * cfg.rewards.cpus_per_worker
    inference_gpus, trainer_gpus = float(w * _gpus_per_worker(cfg)), float(r * _gpus_per_rank(cfg))
    rewards_gpus = k * _gpus_per_reward_worker(cfg)
    shared = max(w, r) if cfg.placement.mode == "colocated" else inference_gpus + trainer_gpus
    return Totals(cpus, shared + rewards_gpus, inference_gpus, trainer_gpus, rewards_gpus)


def phase_threads(cfg: RunConfig) -> tuple[int, int]:
    """Torch threads for each inference worker and each trainer rank:
    `placement.cpu_threads` where set; else, for a run whose phases take turns on CPUs
    (mode 'sync': generation, then the step, never both), every thread of the run's
    actors; else the CPUs each reserved (at least 1, as Ray counts them).

    Taking turns, one phase's actors would otherwise compute on their own threads while
    the other phase's sit idle: each phase gets all the threads the run's inference
    workers and trainer ranks have between them, shared among its own actors. A peer that
    runs both phases in one process (TRL's GRPOTrainer) uses every core in each.

    The count is always given, never left to the environment: Ray sets OMP_NUM_THREADS
    from an actor's CPUs only where the raylet's own environment lacks it, so a shell (or
    a process that started Ray) exporting OMP_NUM_THREADS would otherwise give every actor
    that many threads, side by side on the same cores."""
    if cfg.placement.cpu_threads is not None:
        return cfg.placement.cpu_threads, cfg.placement.cpu_threads
    w, r = cfg.inference.num_workers, cfg.trainer.num_ranks
    own = _threads(cfg.inference.cpus_per_worker), _threads(cfg.trainer.cpus_per_rank)
    if cfg.mode != "sync" or cfg.placement.devices != "cpu":  # on GPUs the phases compute there
        return own
    held = w * own[0] + r * own[1]
    return max(1, held // w), max(1, held // r)


def _threads(cpus: float) -> int:
    """The threads Ray gives an actor that reserved `cpus` (OMP_NUM_THREADS: at least 1)."""
    return max(1, int(cpus))


def _bundle(cpus: float, gpus: float) -> dict[str, float]:
    return {"CPU": cpus, "GPU": gpus} if gpus else {"CPU": cpus}


def _words(bundle: dict[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in bundle.items()) + "}"


def plan(cfg: RunConfig) -> Plan:
    """The run's placement group and each actor's seat in it (module doc)."""
    pl, w, r = cfg.placement, cfg.inference.num_workers, cfg.trainer.num_ranks
    cw, cr = cfg.inference.cpus_per_worker, cfg.trainer.cpus_per_rank
    on_inference, on_trainer = node_labels(pl.inference_node), node_labels(pl.trainer_node)
    if pl.mode == "colocated":
        bundles, selectors, inference, trainer, parts = [], [], [], [], []
        for g in range(max(w, r)):
            here = (g < w) + (g < r)
            share = 1.0 if here == 1 else COLOCATED_SHARE
            bundles.append(_bundle(cw * (g < w) + cr * (g < r), 1.0))
            selectors.append({**on_inference, **on_trainer} if here == 2 else on_inference if g < w else on_trainer)
            if g < w:
                inference.append(Seat(g, cw, share))
            if g < r:
                trainer.append(Seat(g, cr, share))
        shared = min(w, r)
        parts.append(f"{shared} GPU(s) each shared by an inference worker and a trainer rank")
        if w != r:
            alone = "inference worker" if w > r else "trainer rank"
            parts.append(f"{abs(w - r)} GPU(s) for one {alone} each")
        where = {**on_inference, **on_trainer}
    else:
        worker = _bundle(cw, _gpus_per_worker(cfg))
        rank = _bundle(cr, _gpus_per_rank(cfg))
        bundles = [dict(worker) for _ in range(w)] + [dict(rank) for _ in range(r)]
        selectors = [dict(on_inference) for _ in range(w)] + [dict(on_trainer) for _ in range(r)]
        inference = [Seat(k, cw, worker.get("GPU", 0.0)) for k in range(w)]
        trainer = [Seat(w + k, cr, rank.get("GPU", 0.0)) for k in range(r)]
        parts = [
            f"{w} inference worker(s) × {_words(worker)}" + (f" on nodes {pl.inference_node}" if on_inference else ""),
            f"{r} trainer rank(s) × {_words(rank)}" + (f" on nodes {pl.trainer_node}" if on_trainer else ""),
        ]
        where = {}
    # The reward workers' bundles come last, whatever the mode: no other pool shares them.
    rw, on_rewards = cfg.rewards.workers, node_labels(pl.rewards_node)
    scorer = _bundle(cfg.rewards.cpus_per_worker, _gpus_per_reward_worker(cfg))
    rewards = [Seat(len(bundles) + j, scorer["CPU"], scorer.get("GPU", 0.0)) for j in range(rw)]
    bundles += [dict(scorer) for _ in range(rw)]
    selectors += [dict(on_rewards) for _ in range(rw)]
    if rw:
        where_rewards = f" on nodes {pl.rewards_node}" if on_rewards else ""
        parts.append(f"{rw} reward worker(s) × {_words(scorer)}{where_rewards}")
    summary = f"{', '.join(parts)}; strategy {pl.strategy}"
    if where:
        summary += f"; nodes labelled {', '.join(f'{k}={v}' for k, v in where.items())}"
    return Plan(pl.strategy, bundles, selectors, inference, trainer, rewards, summary)


# -- the Ray calls ---------------------------------------------------------------------


def create(p: Plan, name: str):
    """Ask Ray for the plan's placement group (asynchronously: `group.ready()` is the
    reference to wait on)."""
    from ray.util import placement_group

    return placement_group(p.bundles, strategy=p.strategy, name=name, bundle_label_selector=p.selectors)


def actor_options(group, seat: Seat) -> dict:
    """`.options(...)` of the actor in `seat`: its CPUs and GPUs, inside its bundle."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return {
        "num_cpus": seat.num_cpus,
        "num_gpus": seat.num_gpus,
        "scheduling_strategy": PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=seat.bundle),
    }


def remove(group) -> None:
    """Give the group's resources back to the cluster (its actors die with it)."""
    from ray.util import remove_placement_group

    remove_placement_group(group)


def remove_named(name: str) -> None:
    """Remove the group called `name` if there is one: a previous driver's, whose removal
    Ray may not have finished (a name is unique while its group lives)."""
    from ray.util import get_placement_group

    try:
        group = get_placement_group(name)
    except ValueError:  # none by that name
        return
    remove(group)
