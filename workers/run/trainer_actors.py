"""The trainer of a run as Ray sees it: the actor classes the driver spawns, rank 0
(`TrainerActor`) and the other ranks of its pool (`TrainerRank`), whose processes build
the trainer itself (`TrainerHost`, `RankHost`: workers/run/trainer_host.py) in their
constructors and hand it every call.

Why two classes each: Ray needs an actor's class in the process that spawns it, and the
run's driver spawns these. The hosts import torch, transformers and the sync protocols;
this module imports none of them, so neither does the driver's process, which trains
nothing (workers/run/inference_worker.py says what torch would cost it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workers.config.run_config import RunConfig
from workers.core.run_actors import actor_class, where_am_i

if TYPE_CHECKING:
    from workers.core.sync_messages import Gathers
    from workers.run.checkpoints import CheckpointRecord, CheckpointTarget
    from workers.run.messages import TrainerReport
    from workers.run.trainer_host import RankHost, TrainerHost
    from workers.train.step_plan import RankStep
    from workers.train.trainer import RankResult


@actor_class(max_concurrency=4)
class TrainerRank:
    """Rank r ≥ 1 of a trainer pool (`RankHost` says what it does); each method is the host's."""

    def __init__(self, cfg: RunConfig, model_dir: str, rank: int, num_threads: int | None = None) -> None:
        # Here, not at the module's head: the driver imports this module (see the docstring).
        from workers.run.trainer_host import RankHost

        self.host: RankHost = RankHost(cfg, model_dir, rank, num_threads)

    def ready(self) -> bool:
        return self.host.ready()

    def where(self) -> dict:
        return where_am_i()

    def join(self, endpoint) -> None:
        self.host.join(endpoint)

    def train_rank(self, step: RankStep) -> RankResult:
        return self.host.train_rank(step)

    def follow_sync(self, gathers: Gathers) -> None:
        self.host.follow_sync(gathers)

    def send_beside(self, version: int) -> None:
        self.host.send_beside(version)

    def follow_checksum(self) -> None:
        self.host.follow_checksum()

    def follow_export(self) -> None:
        self.host.follow_export()

    def checkpoint_shards(self, location: str, path: str) -> list[dict]:
        return self.host.checkpoint_shards(location, path)

    def restore(self, version: int, location: str | None = None) -> None:
        self.host.restore(version, location)

    def close(self) -> None:
        self.host.close()


@actor_class(max_concurrency=4)
class TrainerActor:
    """Takes B groups per step from the buffer, trains, publishes the new weights
    (`TrainerHost` says how); each method is the host's."""

    def __init__(
        self,
        cfg: RunConfig,
        model_dir: str,
        buffer,
        workers: list,
        num_threads: int | None = None,
        scratch_dir: str | None = None,
        checkpoints: CheckpointTarget | None = None,
        ranks: list | None = None,
    ) -> None:
        # Here, not at the module's head: the driver imports this module (see the docstring).
        from workers.run.trainer_host import TrainerHost

        self.host: TrainerHost = TrainerHost(
            cfg, model_dir, buffer, workers, num_threads, scratch_dir, checkpoints, ranks
        )

    def ready(self) -> bool:
        return self.host.ready()

    def where(self) -> dict:
        return where_am_i()

    def policy_checksum(self) -> str:
        return self.host.policy_checksum()

    def export(self, target: str) -> dict:
        return self.host.export(target)

    def restore(self, location: str) -> int:
        return self.host.restore(location)

    def checkpoint(self) -> CheckpointRecord | None:
        return self.host.checkpoint()

    def ledger(self) -> dict[str, float]:
        return self.host.ledger()

    def sync_endpoint(self) -> dict:
        return self.host.sync_endpoint()

    def sync_connect(self) -> None:
        self.host.sync_connect()

    def start(self) -> None:
        self.host.start()

    def stop(self, timeout: float = 30.0, keep_sender: bool = False) -> int:
        return self.host.stop(timeout, keep_sender)

    def close_sender(self) -> None:
        self.host.close_sender()

    def drain_metrics(self) -> TrainerReport:
        return self.host.drain_metrics()
