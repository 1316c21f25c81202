"""The project's weight-transfer engines, registered with vLLM's factories.

vLLM's RL interface moves weights in three calls its workers answer over vLLM's own RPC
(`LLM.start_weight_update` / `update_weights` / `finish_weight_update`, after one
`init_weight_transfer_engine`), each handled by the engine named in the engine's
`WeightTransferConfig`. vLLM ships engines for CUDA only (`nccl`, `sparse_nccl`,
`nccl_m2n`: NCCL communicators; `ipc`: CUDA IPC handles; `sharded_rdt`: NIXL memory
on CUDA streams), so the engines here are how the same calls run on vLLM-CPU (which
engine a worker is built with: workers.sync.vllm_transfer_engine):

    engine           update_info                       a vLLM worker process ...
    rollway_gloo     {"names", "dtype_names",          joins the trainer's broadcast of
                      "shapes"} (vLLM's nccl)          each tensor or packed chunk and
                                                       loads it: vLLM's `nccl` engine
                                                       pair with gloo for NCCL
    rollway_memory   {"weights": [(name, tensor), …]}  loads the tensors it is handed
                                                       (the "uni" executor: the worker
                                                       is the inference worker's own
                                                       process, the RPC a call)
    rollway_files    {"paths": [safetensors, …]}       reads the files (from /dev/shm or
                                                       the run's scratch) and loads them
                                                       (worker processes of a tensor-
                                                       parallel engine: every rank reads)

"collective" into vLLM is `rollway_gloo` on CPUs and vLLM's `nccl` on GPUs, driven by
the trainer (workers/sync/engine_broadcast.py): the two differ by the communicator. The
object store and the filesystem protocol stage the weights in the inference worker
(staging overlaps generation) and the backend hands them to `rollway_memory` or
`rollway_files` between two engine steps. LoRA adapter-only sync stays a `LoRARequest`
(VLLMBackend.load_lora_adapter): these engines load checkpoint weights into the base
model's parameters, and a LoRA-serving engine keeps its base fixed and serves each
adapter version by name.

`rollway_memory` and `rollway_files` load as vLLM's own `reload_weights(is_checkpoint_format=True)`
does: layerwise reload set up (at the first update that carries weights), `model.load_weights`
per update, vLLM's post-load processing (vLLM-CPU repacks its linear weights) at finish,
and the tied output layer packed again there (`repack_tied_head`).

`rollway_memory`'s trainer-side twin (`MemoryTrainerEngine`, registered with
`WeightTransferTrainerFactory`) drives any object with the four methods of vLLM's
`VLLMWeightSyncClient` (a VLLMBackend has them): start, one update with the source's
tensors, finish. The source yields what vLLM's loader takes: checkpoint names and layout
(`workers.model.loading.saved_form`; a plain Llama's parameters are already).
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, cast

import torch
from vllm.distributed.weight_transfer.base import (
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    VLLMWeightSyncClient,
    WeightSource,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory, WeightTransferTrainerFactory
from vllm.distributed.weight_transfer.nccl_common import worker_init_payload
from vllm.distributed.weight_transfer.nccl_engine import (
    NCCLTrainerInitInfo,
    NCCLTrainerWeightTransferEngine,
    NCCLWeightTransferEngine,
    NCCLWeightTransferInitInfo,
    NCCLWeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.packed_tensor import pack_tensors, unpack_tensor

from workers.core.rendezvous import join_store
from workers.sync.transfer_engines import ROLLWAY_FILES as FILES
from workers.sync.transfer_engines import ROLLWAY_GLOO as GLOO
from workers.sync.transfer_engines import ROLLWAY_MEMORY as MEMORY

if TYPE_CHECKING:
    from typing import Self


def repack_tied_head(model: torch.nn.Module) -> None:
    """vLLM-CPU computes the output layer with a packed copy of its weight, made after
    loading. A tied output layer is the embedding, which a reload fills under the
    embedding's name, but the head's packed copy is not made again (vLLM 0.32): it
    would keep the old weights' logits (measured: Qwen2 and GPT-2 sampled from the old
    head after a full sync). Pack it again from the weight it shares."""
    head = getattr(model, "lm_head", None)
    method = getattr(head, "quant_method", None)
    if getattr(getattr(model, "config", None), "tie_word_embeddings", False) and method is not None:
        method.process_weights_after_loading(head)


@dataclass
class RollwayInitInfo(WeightTransferInitInfo):
    """Nothing to rendezvous: the weights come with each update."""


@dataclass
class FilesUpdateInfo(WeightTransferUpdateInfo):
    paths: list[str] = field(default_factory=list)


@dataclass
class MemoryUpdateInfo(FilesUpdateInfo):
    weights: list[tuple[str, torch.Tensor]] = field(default_factory=list)


class _CheckpointEngine(WeightTransferEngine):
    """Checkpoint-format weights loaded the way vLLM's reload_weights loads them."""

    init_info_cls = RollwayInitInfo

    def init_transfer_engine(self, init_info: RollwayInitInfo) -> None:
        pass

    # Layerwise reload moves every layer's parameters to the meta device until its
    # weights arrive, so it starts at the first update that parsed and carries weights,
    # not at start_weight_update: an update refused before loading (a bad update_info)
    # then leaves the model as it was, where vLLM's order would leave it on meta.
    _reloading = False

    def start_weight_update(self) -> None:
        self._reloading = False

    def update_weights(self, update_info: dict[str, Any]) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        typed = self.parse_update_info(update_info)
        if not self.carries_weights(typed):
            return
        if not self._reloading:
            initialize_layerwise_reload(self.model)
            self._reloading = True
        self.receive_weights(typed)
        # vLLM's own ends with torch.accelerator.synchronize(), which raises on a host
        # without an accelerator (vLLM-CPU): synchronize only where there is one.
        if torch.accelerator.is_available():
            torch.accelerator.synchronize()

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        if not self._reloading:
            return
        self._reloading = False
        finalize_layerwise_reload(self.model, self.model_config)
        repack_tied_head(self.model)

    def shutdown(self) -> None:
        pass

    def carries_weights(self, update_info: Any) -> bool:
        return bool(update_info.paths)

    def _load(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        # vLLM's models define load_weights; torch's Module type does not know it.
        cast("Any", self.model).load_weights(iter(weights))

    @staticmethod
    def trainer_send_weights(iterator: Any, trainer_args: Any) -> None:
        raise NotImplementedError("the trainer's side is MemoryTrainerEngine (WeightTransferTrainerFactory)")


class FilesEngine(_CheckpointEngine):
    update_info_cls = FilesUpdateInfo

    def receive_weights(self, update_info: FilesUpdateInfo) -> None:
        from safetensors.torch import load_file

        for path in update_info.paths:
            self._load(load_file(path).items())


class MemoryEngine(FilesEngine):
    """Files too: what reaches a worker in another process reaches this one."""

    update_info_cls = MemoryUpdateInfo

    def carries_weights(self, update_info: Any) -> bool:
        return bool(update_info.paths or update_info.weights)

    def receive_weights(self, update_info: MemoryUpdateInfo) -> None:  # type: ignore[override]
        super().receive_weights(update_info)
        if update_info.weights:
            self._load(update_info.weights)


@dataclass
class MemoryTrainerInitInfo(TrainerInitInfo):
    backend: ClassVar[str] = MEMORY


class MemoryTrainerEngine(TrainerWeightTransferEngine[MemoryTrainerInitInfo]):
    """The trainer's side of `rollway_memory`: the source's tensors, in one update."""

    init_info_cls = MemoryTrainerInitInfo

    @classmethod
    def trainer_init(
        cls, init_info: MemoryTrainerInitInfo, *, client: VLLMWeightSyncClient, source: WeightSource | None = None
    ) -> Self:
        if source is None:
            raise ValueError(f"the {MEMORY} trainer engine needs a WeightSource (the trainer's weights)")
        engine = cls(client=client, source=source, is_sender=init_info.is_sender)
        if engine.is_sender:
            engine.client.init_weight_transfer_engine({})
        return engine

    def send_weights(self) -> None:
        assert self.source is not None
        weights = list(self.source)  # every rank iterates: a sharded source gathers
        if not self.is_sender:
            return
        self.client.start_weight_update()
        self.client.update_weights({"weights": weights})
        self.client.finish_weight_update()


# -- rollway_gloo: vLLM's dense NCCL engine pair with gloo for NCCL ----------------------
#
# vLLM's `nccl` engines broadcast checkpoint-format weights from the trainer (rank 0) to
# every vLLM worker (ranks rank_offset..), each worker receiving inside `update_weights`
# and loading through the layerwise reload; the trainer side drives the round trip
# (`NCCLTrainerWeightTransferEngine.send_weights`: metadata, start, the workers' update
# concurrently with the broadcast, finish). Every part of that runs on a CPU but the
# communicator (PyNccl) and CUDA streams. The twins below keep vLLM's classes and
# replace only those, so a CPU run goes through vLLM's own round trip, update info,
# rank layout and reload, and a GPU run differs from it by the communicator alone.


class GlooCommunicator:
    """The two methods of vLLM's PyNcclCommunicator the broadcast engines call, over a
    gloo group on the TCPStore vLLM's rendezvous would open (host:port, rank 0 the
    master)."""

    def __init__(self, store: torch.distributed.Store, rank: int, world_size: int, timeout_s: float) -> None:
        prefixed = torch.distributed.PrefixStore("rollway-weight-transfer", store)
        self.store = store  # the group reads through it: kept alive with it
        self.group: Any = torch.distributed.ProcessGroupGloo(
            prefixed, rank, world_size, datetime.timedelta(seconds=timeout_s)
        )

    @classmethod
    def open(cls, host: str, port: int, world_size: int, timeout_s: float) -> GlooCommunicator:
        """Rank 0's side: the store's master, as vLLM's `StatelessProcessGroup.create` is."""
        store = torch.distributed.TCPStore(
            host, port, world_size, is_master=True, timeout=datetime.timedelta(seconds=timeout_s)
        )
        return cls(store, 0, world_size, timeout_s)

    def broadcast(self, tensor: torch.Tensor, src: int, stream: Any = None) -> None:
        if self.group is None:
            raise RuntimeError("the weight-transfer group was shut down")
        opts = torch.distributed.BroadcastOptions()
        opts.rootRank = src
        self.group.broadcast([tensor], opts).wait()

    def destroy(self) -> None:
        self.group = None


@dataclass(kw_only=True)
class GlooInitInfo(NCCLWeightTransferInitInfo):
    """vLLM's worker init info, and how long a broadcast may wait for its peers."""

    timeout_s: float = 600.0


def packed_chunks(
    metadata: Iterable[tuple[str, list[int], torch.dtype]], buffer_size_bytes: int
) -> Iterable[list[tuple[str, list[int], torch.dtype, int]]]:
    """The chunks vLLM's `packed_nccl_broadcast_consumer` cuts from the update info: a
    chunk closes past `buffer_size_bytes` (the producer's `pack_tensors` closes at the
    same tensor)."""
    chunk: list[tuple[str, list[int], torch.dtype, int]] = []
    size = 0
    for name, shape, dtype in metadata:
        nbytes = math.prod(shape) * dtype.itemsize
        chunk.append((name, shape, dtype, nbytes))
        size += nbytes
        if size > buffer_size_bytes:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


class GlooEngine(NCCLWeightTransferEngine):
    """vLLM's dense NCCL engine (a vLLM worker's side) over gloo."""

    init_info_cls = GlooInitInfo

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:  # type: ignore[override]
        self.packed = init_info.packed
        self.packed_buffer_size_bytes = init_info.packed_buffer_size_bytes
        self.packed_num_buffers = init_info.packed_num_buffers
        # This worker's rank in the trainer-worker group, as vLLM's
        # worker_init_process_group numbers it: unique across data-parallel groups.
        p = self.parallel_config
        rank = p.data_parallel_index * p.world_size + p.rank + init_info.rank_offset
        if init_info.master_address is None or init_info.master_port is None:
            raise ValueError(f"{GLOO}: init_info needs master_address and master_port (a TCPStore rendezvous)")
        store = join_store(init_info.master_address, init_info.master_port, init_info.world_size, init_info.timeout_s)
        self.model_update_group = cast("Any", GlooCommunicator(store, rank, init_info.world_size, init_info.timeout_s))

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # vLLM's ends with torch.accelerator.synchronize(), which raises on a host without
        # an accelerator; a gloo broadcast has completed when it returns.
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: NCCLWeightTransferUpdateInfo) -> None:
        # vLLM's receive, with CUDA streams left out: unpacked, a tensor per broadcast;
        # packed, the chunks vLLM's consumer cuts, one buffer at a time.
        from vllm.model_executor.model_loader.mtp_validation import disable_mtp_completeness_check

        group = self.model_update_group
        if group is None:
            raise RuntimeError(f"{GLOO} weight transfer not initialized: call init_transfer_engine() first")
        meta = [
            (name, list(shape), getattr(torch, dtype))
            for name, dtype, shape in zip(update_info.names, update_info.dtype_names, update_info.shapes, strict=True)
        ]
        with disable_mtp_completeness_check():
            if not self.packed:
                for name, shape, dtype in meta:
                    weight = torch.empty(shape, dtype=dtype, device=self.device)
                    group.broadcast(weight, src=0)
                    self._load([(name, weight)])
                return
            for chunk in packed_chunks(meta, self.packed_buffer_size_bytes):
                names, shapes, dtypes, sizes = (list(x) for x in zip(*chunk, strict=True))
                packed = torch.empty(sum(sizes), dtype=torch.uint8, device=self.device)
                group.broadcast(packed, src=0)
                self._load(unpack_tensor(packed, names, shapes, dtypes, sizes))

    def finish_weight_update(self) -> None:
        super().finish_weight_update()
        repack_tied_head(self.model)

    def _load(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        # vLLM's models define load_weights; torch's Module type does not know it.
        cast("Any", self.model).load_weights(weights)


@dataclass
class GlooTrainerInitInfo(NCCLTrainerInitInfo):
    backend: ClassVar[str] = GLOO
    timeout_s: float = 600.0


class GlooTrainerEngine(NCCLTrainerWeightTransferEngine):
    """vLLM's dense NCCL trainer engine over gloo: its `send_weights` round trip as it
    is; the endpoint and the broadcast without CUDA."""

    init_info_cls = GlooTrainerInitInfo

    @classmethod
    def trainer_init(  # type: ignore[override]
        cls, init_info: GlooTrainerInitInfo, *, client: VLLMWeightSyncClient, source: WeightSource | None = None
    ) -> Self:
        if source is None:
            raise ValueError(f"the {GLOO} trainer engine needs a WeightSource (the trainer's weights)")
        engine = cls(
            client=client,
            source=source,
            is_sender=init_info.is_sender,
            packed=init_info.packed,
            packed_buffer_size_bytes=init_info.packed_buffer_size_bytes,
            packed_num_buffers=init_info.packed_num_buffers,
        )
        if not engine.is_sender:
            return engine
        worker_info = GlooInitInfo(
            master_address=init_info.master_address,
            master_port=init_info.master_port,
            rank_offset=1,
            world_size=init_info.world_size,
            packed=init_info.packed,
            packed_buffer_size_bytes=init_info.packed_buffer_size_bytes,
            packed_num_buffers=init_info.packed_num_buffers,
            timeout_s=init_info.timeout_s,
        )
        # As vLLM's: the workers wait in init_weight_transfer_engine for the rendezvous
        # while rank 0 opens it.
        with ThreadPoolExecutor(max_workers=1) as exe:
            future = exe.submit(engine.client.init_weight_transfer_engine, worker_init_payload(worker_info))
            engine.model_update_group = cast(
                "Any",
                GlooCommunicator.open(
                    init_info.master_address, init_info.master_port, init_info.world_size, init_info.timeout_s
                ),
            )
            future.result()
        return engine

    def _broadcast(self, source: WeightSource, meta: list) -> None:
        if not self.is_sender:
            for _ in source:  # the trainer-side gathers only
                pass
            return
        group = self.model_update_group
        assert group is not None, "trainer_init() must be called before _broadcast()"
        pairs = self._checked_iter(source, meta)
        if not self.packed:
            for _name, tensor in pairs:
                group.broadcast(tensor.contiguous(), src=0)
            return
        # vLLM's producer with one buffer and no streams: the same chunks on the wire.
        while (chunk := pack_tensors(pairs, lambda item: item[1], self.packed_buffer_size_bytes)) is not None:
            group.broadcast(chunk.packed_tensor, src=0)


def register() -> None:
    """Register the engines with vLLM's factories (once per process)."""
    for name, cls in ((MEMORY, MemoryEngine), (FILES, FilesEngine), (GLOO, GlooEngine)):
        if name not in WeightTransferEngineFactory._registry:
            WeightTransferEngineFactory.register_engine(name, cls)
    for name, trainer_cls in ((MEMORY, MemoryTrainerEngine), (GLOO, GlooTrainerEngine)):
        if name not in WeightTransferTrainerFactory._registry:
            WeightTransferTrainerFactory.register_engine(name, trainer_cls)


class RegisterEngines:
    """vLLM's `worker_extension_cls`: vLLM imports it by name in each of its worker
    processes before the model loads (and its engine is created), which imports this
    module and so registers the engines there too (a tensor-parallel engine's workers
    are processes of their own). It adds no method to vLLM's worker."""


register()
