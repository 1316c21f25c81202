"""An inference worker of a run as Ray sees it: the actor class the driver spawns, whose
process builds the worker itself (`InferenceHost`, workers/run/inference_host.py) in its
constructor and hands it every call.

Why two classes: Ray needs an actor's class in the process that spawns it, and the run's
driver spawns this one. The host imports torch, transformers, the backend and the sync
protocols; this module imports none of them, so neither does the driver's process, which
generates and trains nothing: `import torch` alone costs a process 2.6-3.0 s of CPU on a
2-core host and 180 MB of memory (`bench/run_cost.py`), in every run's driver.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workers.config.run_config import RunConfig
from workers.core.run_actors import actor_class, where_am_i

if TYPE_CHECKING:
    from workers.core.sync_messages import Notice
    from workers.run.inference_host import InferenceHost
    from workers.run.ledger import Row
    from workers.run.messages import InferenceReport


@actor_class(max_concurrency=4)
class InferenceWorker:
    """Generates groups with the weights it holds and puts them into the buffer
    (`InferenceHost` says how); each method is the host's."""

    def __init__(
        self,
        cfg: RunConfig,
        model_dir: str,
        index: int,
        num_workers: int,
        buffer,
        scratch_dir: str | None = None,
        reward_workers: list | None = None,
        num_threads: int | None = None,
    ) -> None:
        # Here, not at the module's head: the driver imports this module (see the docstring).
        from workers.run.inference_host import InferenceHost

        self.host: InferenceHost = InferenceHost(
            cfg, model_dir, index, num_workers, buffer, scratch_dir, reward_workers, num_threads
        )

    def ready(self) -> bool:
        return self.host.ready()

    def where(self) -> dict:
        return where_am_i()

    def sync_connect(self, endpoint: dict, rank: int) -> None:
        self.host.sync_connect(endpoint, rank)

    def state_dict(self) -> dict:
        return self.host.state_dict()

    def load_state_dict(self, state: dict, carried: list[Row] | None = None) -> None:
        self.host.load_state_dict(state, carried)

    def restore(self, state: dict | None, policy_version: int, carried: list[Row] | None = None) -> None:
        self.host.restore(state, policy_version, carried)

    def start(self) -> None:
        self.host.start()

    def stop(self, timeout: float = 10.0, final_eval_version: int | None = None) -> None:
        self.host.stop(timeout, final_eval_version)

    def wait_asleep(self, timeout: float) -> bool:
        return self.host.wait_asleep(timeout)

    def update_weights(self, notice: Notice) -> None:
        self.host.update_weights(notice)

    def drain_metrics(self) -> InferenceReport:
        return self.host.drain_metrics()
