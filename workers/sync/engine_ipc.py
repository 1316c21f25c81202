"""Protocol "cuda_ipc" into vLLM on a GPU: vLLM's IPC engine pair, driven by the trainer.

vLLM's `ipc` engines (`vllm/distributed/weight_transfer/ipc_engine.py`) move a policy
between processes that share a GPU without copying it: the trainer's engine exports each
tensor of the source as a CUDA IPC handle (torch's `reduce_tensor`), keyed by the GPU's
UUID; each vLLM worker maps the handles on its own GPU (`rebuild_cuda_tensor`) and loads
them through vLLM's layerwise reload. The trainer's engine is synchronous: it holds the
exported tensors until `update_weights` returns, and vLLM's HTTP and Ray clients return
once the workers have loaded.

How it sits in a run, as the broadcast engines do (workers/sync/engine_broadcast.py):
the trainer's engine drives vLLM's four-call client protocol through `_Handoff` (the
run's `NoticeClient`, engine_trainer.py), which turns the update into the run's Notice
for every inference worker; a worker starts,
updates and finishes at its own apply point (`sync.update_mode`), under its backend's
lock, labels the weights with their version, and then says so in the sender's
rendezvous store. `_Handoff.update_weights` returns once every worker has: the
exported tensors outlive every mapping of them.

Unpacked: the whole policy is one update (one handle per tensor), since vLLM's packed
mode reuses one staging buffer chunk after chunk and so needs a round trip per chunk.
The trainer sends `PolicySource` (LoRA merged, checkpoint names and layout), in the
inference workers' dtype: views of the parameters where they already are that dtype, a
copy otherwise. Every rank of a trainer pool runs the engine (vLLM all-gathers the
handles over the pool's group, so a worker finds the ones on its own GPU); rank 0 sends.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

from workers.core.rendezvous import default_host, join_store, open_store
from workers.core.sync_messages import Notice, Notify, SyncReport, end_to_end_ms
from workers.sync.base import Stopwatch, WeightReceiver, WeightSender
from workers.sync.engine_trainer import NoticeClient, PolicySource, sent_bytes
from workers.sync.transfer_engines import VLLM_IPC

if TYPE_CHECKING:
    from workers.config.run_config import SyncConfig

PROTOCOL = "cuda_ipc"


def applied_key(seq: int, rank: int) -> str:
    """The store key receiver `rank` sets once it has loaded update `seq`."""
    return f"applied/{seq}/{rank}"


class _Handoff(NoticeClient):
    """The run's client (engine_trainer.py) that waits, after each notice, until every
    worker has loaded it (`applied_key`), as vLLM's own clients return only then."""

    def __init__(self, num_receivers: int, timeout_s: float) -> None:
        super().__init__(PROTOCOL)
        self.num_receivers, self.timeout_s = num_receivers, timeout_s
        self.store: Any = None  # the rendezvous store, opened by EngineIpcSender.endpoint

    def delivered(self, version: int, seq: int) -> None:
        keys = [applied_key(seq, rank) for rank in range(1, self.num_receivers + 1)]
        try:
            self.store.wait(keys)  # the store's timeout: sync.timeout_s
        except RuntimeError as exc:
            raise TimeoutError(
                f"weights of version {version} were handed to {self.num_receivers} inference worker(s) through "
                f"CUDA IPC, and not all loaded them within sync.timeout_s ({self.timeout_s:g} s): a worker that "
                "never reaches its apply point holds the trainer here"
            ) from exc


class EngineIpcSender(WeightSender):
    """The trainer's side: vLLM's `ipc` trainer engine. `rank`: this process's rank in
    its trainer pool (0 sends; the others join the handles' all-gather)."""

    protocol = PROTOCOL
    every_rank_sends = True

    def __init__(self, sync: SyncConfig, num_receivers: int, wire_dtype: str | None = None, rank: int = 0) -> None:
        super().__init__()
        if num_receivers < 1:
            raise ValueError(f"a cuda_ipc sync needs ≥ 1 inference worker (got {num_receivers})")
        self.sync, self.rank = sync, rank
        self.wire_dtype = getattr(torch, wire_dtype) if wire_dtype else None
        self.source: PolicySource | None = None
        self._client = _Handoff(num_receivers, sync.timeout_s)
        self._engine: Any = None
        self._endpoint: dict[str, Any] | None = None

    def attach(self, model: torch.nn.Module) -> None:
        super().attach(model)
        self.source = PolicySource(model, self.sync.bucket_mb, self.wire_dtype)

    def endpoint(self) -> dict[str, Any]:
        if self._endpoint is None:
            host = default_host()
            world = 1 + self._client.num_receivers
            self._client.store, port = open_store(host, world, self.sync.timeout_s, "IPC weight handoff")
            self._endpoint = {
                "protocol": self.protocol,
                "engine": VLLM_IPC,
                "store_host": host,
                "store_port": port,
                "world_size": world,
                "timeout_s": self.sync.timeout_s,
            }
        return self._endpoint

    def connect(self) -> None:
        if self.source is None:
            raise RuntimeError("EngineIpcSender.connect before attach(model)")
        if self.rank == 0:
            self.endpoint()
        info = IPCTrainerInitInfo(rank=self.rank, packed=False)
        self._engine = WeightTransferTrainerFactory.trainer_init(info, client=self._client, source=self.source)

    def send(self, version: int, notify: Notify) -> SyncReport:
        if self._engine is None or self.source is None:
            raise RuntimeError("EngineIpcSender.send before connect(): connect the trainer and workers first")
        clock = Stopwatch()
        meta = self._client.send(self._engine, self.source, version, self._next_seq(), notify)
        nbytes = sent_bytes(meta)
        # Nothing crosses a wire: the bytes are what the workers map, in one message.
        return SyncReport(self.protocol, version, nbytes, trainer_ms=clock.ms(), tensors=len(meta), messages=1)

    def close(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None


class EngineIpcReceiver(WeightReceiver):
    """An inference worker's side: its vLLM engine, built with `ipc`, maps and loads."""

    protocol = PROTOCOL
    # The trainer holds the exported tensors until every worker has loaded them.
    blocks_sender = True

    def __init__(self, backend: Any) -> None:
        if backend is None or getattr(backend, "transfer_engine", None) != VLLM_IPC:
            raise ValueError(
                f"a {VLLM_IPC!r} receiver needs the worker's vLLM backend built with that weight-transfer engine "
                f"(got {getattr(backend, 'transfer_engine', backend)!r})"
            )
        self.backend = backend
        self.rank = 1
        self._store: Any = None

    def connect(self, endpoint: dict[str, Any], rank: int = 1) -> None:
        super().connect(endpoint, rank)
        if endpoint.get("engine") != VLLM_IPC:
            raise ValueError(f"the trainer drives engine {endpoint.get('engine')!r}; this worker's is {VLLM_IPC!r}")
        self.rank = rank
        self._store = join_store(
            endpoint["store_host"], endpoint["store_port"], endpoint["world_size"], endpoint["timeout_s"]
        )
        self.backend.init_weight_transfer_engine({"packed": False})

    def receive(self, notice: Notice) -> Notice:
        """Nothing moves yet: the engine maps the handles when the worker applies."""
        return notice

    def apply(self, backend: Any, staged: Notice) -> SyncReport:
        """Map and load `staged`'s tensors inside vLLM's update, label the weights with
        its version as the update finishes (under the backend's lock), then let the
        trainer release them."""
        clock = Stopwatch()
        update_info = staged.payload["update_info"]
        backend.start_weight_update()
        backend.update_weights(update_info)
        backend.finish_weight_update(str(staged.version))
        ms = clock.ms()
        self._store.set(applied_key(staged.seq, self.rank), "1")
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
        self._store = None
