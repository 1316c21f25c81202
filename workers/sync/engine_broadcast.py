"""Protocol "collective" into vLLM: vLLM's broadcast engine pair, driven by the trainer.

vLLM's dense NCCL engines (`vllm/distributed/weight_transfer/nccl_engine.py`) move a
policy as PRIME-RL and verl move it: the trainer's engine declares every weight's name,
dtype and shape (the update info), each vLLM worker enters `update_weights` with it and
joins the broadcasts from the trainer's rank 0, loading each tensor (or packed chunk) as
it lands through vLLM's layerwise reload. On GPUs that engine is vLLM's `nccl`; on CPUs
it is the same pair with gloo for NCCL (`rollway_gloo`, workers/sync/vllm_engines.py).

How it sits in a run: the trainer's engine (`WeightTransferTrainerFactory.trainer_init`)
drives vLLM's four-call client protocol through `NoticeClient` (engine_trainer.py), which
turns the update into the run's Notice for every inference worker. The engines'
rendezvous is the run's `sync_connect`, each worker with its own rank offset (vLLM's
trainer_init numbers the workers of a single engine). A worker starts, updates and finishes at its
own apply point (`sync.update_mode`: between two generate calls, or two decode steps),
under its backend's lock, labelling the weights with their version as it finishes. So
the trainer's broadcast waits for every worker to reach that point: vLLM receives inside
`update_weights` with the engine stopped, where the project's own collective stages the
weights beside generation (workers/sync/collective.py). An inference worker therefore
applies pending weights wherever it waits on the trainer (the buffer's back-pressure).

The trainer sends `PolicySource`: the policy it computes (LoRA merged, a tied weight
once) under the checkpoint's names and layout (what vLLM's loader takes), in buckets
cut between modules; an fsdp2 pool's other ranks join the gathers (`gathers`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from workers.core.rendezvous import default_host, free_port
from workers.core.sync_messages import Notice, Notify, SyncReport, end_to_end_ms
from workers.sync.base import Stopwatch, WeightReceiver, WeightSender
from workers.sync.engine_trainer import NoticeClient, PolicySource, sent_bytes
from workers.sync.transfer_engines import ROLLWAY_GLOO
from workers.sync.vllm_engines import GlooTrainerInitInfo, packed_chunks  # registers the engines

if TYPE_CHECKING:
    from workers.config.run_config import SyncConfig

PROTOCOL = "collective"


class EngineBroadcastSender(WeightSender):
    """The trainer's side: vLLM's trainer engine for `engine` ("nccl", "rollway_gloo")."""

    protocol = PROTOCOL

    def __init__(
        self,
        sync: SyncConfig,
        num_receivers: int,
        engine: str,
        ranks_per_receiver: int = 1,
        wire_dtype: str | None = None,
    ) -> None:
        super().__init__()
        if num_receivers < 1:
            raise ValueError(f"a collective sync needs ≥ 1 inference worker (got {num_receivers})")
        self.sync, self.engine = sync, engine
        self.ranks_per_receiver = ranks_per_receiver
        self.world_size = 1 + num_receivers * ranks_per_receiver
        self.wire_dtype = getattr(torch, wire_dtype) if wire_dtype else None
        self.source: PolicySource | None = None
        self._client = NoticeClient(PROTOCOL)
        self._engine: Any = None
        self._endpoint: dict[str, Any] | None = None

    def attach(self, model: torch.nn.Module) -> None:
        super().attach(model)
        self.source = PolicySource(model, self.sync.bucket_mb, self.wire_dtype)

    def endpoint(self) -> dict[str, Any]:
        if self._endpoint is None:
            host = default_host()
            self._endpoint = {
                "protocol": self.protocol,
                "engine": self.engine,
                "master_address": host,
                "master_port": free_port(host),
                "world_size": self.world_size,
                "ranks_per_receiver": self.ranks_per_receiver,
                "packed": self.sync.packed,
                "packed_buffer_size_bytes": int(self.sync.bucket_mb * 2**20),
                "timeout_s": self.sync.timeout_s,
            }
        return self._endpoint

    def connect(self) -> None:
        """Open rank 0's end; blocks until every receiver's engine has joined."""
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        if self.source is None:
            raise RuntimeError("EngineBroadcastSender.connect before attach(model)")
        e = self.endpoint()
        fields = {
            "master_address": e["master_address"],
            "master_port": e["master_port"],
            "world_size": e["world_size"],
            "packed": e["packed"],
            "packed_buffer_size_bytes": e["packed_buffer_size_bytes"],
            "rank": 0,
        }
        if self.engine == ROLLWAY_GLOO:
            init_info: Any = GlooTrainerInitInfo(**fields, timeout_s=e["timeout_s"])
        else:
            init_info = NCCLTrainerInitInfo(**fields)
        self._engine = WeightTransferTrainerFactory.trainer_init(init_info, client=self._client, source=self.source)

    def send(self, version: int, notify: Notify) -> SyncReport:
        if self._engine is None or self.source is None:
            raise RuntimeError("EngineBroadcastSender.send before connect(): connect the trainer and workers first")
        clock = Stopwatch()
        meta = self._client.send(self._engine, self.source, version, self._next_seq(), notify)
        nbytes = sent_bytes(meta)
        if self.sync.packed:  # vLLM's packed chunks, as the receiving engine cuts them
            shapes = ((m.name, list(m.shape), m.dtype) for m in meta)
            messages = sum(1 for _ in packed_chunks(shapes, int(self.sync.bucket_mb * 2**20)))
        else:
            messages = len(meta)
        return SyncReport(self.protocol, version, nbytes, trainer_ms=clock.ms(), tensors=len(meta), messages=messages)

    def close(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None


class EngineBroadcastReceiver(WeightReceiver):
    """An inference worker's side: its vLLM engine, built with `engine`, receives."""

    protocol = PROTOCOL
    # The sender's broadcast waits for `apply`: a worker must apply wherever it waits on the trainer.
    blocks_sender = True

    def __init__(self, engine: str, backend: Any) -> None:
        if backend is None or getattr(backend, "transfer_engine", None) != engine:
            raise ValueError(
                f"a {engine!r} receiver needs the worker's vLLM backend built with that weight-transfer engine "
                f"(got {getattr(backend, 'transfer_engine', backend)!r})"
            )
        self.engine, self.backend = engine, backend

    def connect(self, endpoint: dict[str, Any], rank: int = 1) -> None:
        """Join the trainer's rendezvous (blocks until every rank joins): this worker's
        engine takes ranks 1 + (rank - 1) · its tensor-parallel size onwards."""
        super().connect(endpoint, rank)
        if endpoint.get("engine") != self.engine:
            raise ValueError(f"the trainer drives engine {endpoint.get('engine')!r}; this worker's is {self.engine!r}")
        info = {
            "master_address": endpoint["master_address"],
            "master_port": endpoint["master_port"],
            "rank_offset": 1 + (rank - 1) * endpoint["ranks_per_receiver"],
            "world_size": endpoint["world_size"],
            "packed": endpoint["packed"],
            "packed_buffer_size_bytes": endpoint["packed_buffer_size_bytes"],
        }
        if self.engine == ROLLWAY_GLOO:
            info["timeout_s"] = endpoint["timeout_s"]
        self.backend.init_weight_transfer_engine(info)

    def receive(self, notice: Notice) -> Notice:
        """Nothing moves yet: the engine receives when the worker applies."""
        return notice

    def apply(self, backend: Any, staged: Notice) -> SyncReport:
        """Join the trainer's broadcast of `staged` inside vLLM's update, and label the
        weights with its version as the update finishes (under the backend's lock: no
        token is sampled between the two)."""
        clock = Stopwatch()
        update_info = staged.payload["update_info"]
        backend.start_weight_update()
        backend.update_weights(update_info)
        backend.finish_weight_update(str(staged.version))
        ms = clock.ms()
        return SyncReport(
            self.protocol,
            staged.version,
            staged.nbytes,
            inference_ms=ms,
            end_to_end_ms=end_to_end_ms(staged),
            receive_ms=ms,
            tensors=len(update_info.get("names", ())),
        )

    def close(self) -> None:
        pass
