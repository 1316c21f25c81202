"""Protocol "lora": adapter-only sync. The trainer trains a peft LoRA adapter on a frozen
base (workers/model/lora.py); only the adapter's tensors move (a small fraction of the
model's), through the object store like protocol "object_store".

Workers already hold the base (the same model directory the trainer started from; the
sender publishes the base's checksum and `connect` refuses a different one). A worker
then does one of two things with each version:

- a backend with adapter support (`load_lora_adapter(name, lora_int_id, path)`, vLLM with
  `enable_lora=True`) gets the adapter written as a peft directory and registered under a
  versioned name `policy-v<version>` (id version + 1): requests name the adapter they
  were generated with, and the base weights never change;
- any other backend (TorchBackend) gets base + scaling · B·A merged into a full state dict
  locally (`workers.model.lora.merge_adapter`, bit-identical to peft's merge). Bytes on the
  wire stay adapter-only; the merge costs one full load inside the worker.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import torch

from workers.core.sync_messages import Notice, Notify, SyncReport, end_to_end_ms
from workers.model.loading import checkpoint_weights, live_weights, saved_form
from workers.model.lora import (
    adapter_config,
    adapter_parameters,
    base_state_dict,
    is_peft,
    lora_scaling,
    merge_adapter,
    write_adapter_dir,
)
from workers.sync.base import Stopwatch, WeightReceiver, WeightSender, state_checksum
from workers.sync.object_store import RayStore, from_wire, to_wire
from workers.sync.weights import adapter_tensors, is_sharded

# Adapter directories kept on a worker: vLLM may re-read an evicted adapter from disk.
KEEP_ADAPTERS = 2


def base_checksum(model: torch.nn.Module) -> str:
    """sha256 of a peft model's frozen base as its checkpoint files hold it (names and
    layout, `saved_form`): what a worker checks its own copy of the base against
    without building the model (an inference worker running vLLM may not: vLLM runs
    GPT-NeoX through transformers' class, patched in that process)."""
    return state_checksum(saved_form(base_state_dict(model), model))


def adapter_name(version: int) -> str:
    """The versioned adapter name a worker registers: requests say which policy made them."""
    return f"policy-v{version}"


class LoRASender(WeightSender):
    protocol = "lora"
    gathers = "adapter"

    def __init__(self, store: Any | None = None) -> None:
        super().__init__()
        self.store = store if store is not None else RayStore()
        self._last_ref: Any = None
        # A sharded trainer's base is whole in no rank: its trainer takes the checksum
        # before sharding and sets it here.
        self.base_checksum: str | None = None
        self._adapter: dict[str, torch.nn.Parameter] | None = None

    def attach(self, model: torch.nn.Module) -> None:
        if not is_peft(model):
            raise TypeError(
                "sync.protocol 'lora' needs the trainer's model wrapped with a peft LoRA adapter "
                "(workers.model.lora.apply_lora); enable LoRA or choose a full-weight protocol"
            )
        super().attach(model)
        self._adapter = None if is_sharded(model) else adapter_parameters(model)

    def endpoint(self) -> dict[str, Any]:
        model = self._require_model()
        if self.base_checksum is None and is_sharded(model):
            raise RuntimeError("a sharded trainer's LoRA sender needs base_checksum set before endpoint()")
        return {
            "protocol": self.protocol,
            "scaling": lora_scaling(model),
            "adapter_config": adapter_config(model),
            "base_checksum": self.base_checksum or base_checksum(model),
        }

    def send(self, version: int, notify: Notify) -> SyncReport:
        model = self._require_model()
        sent_at, clock = time.time(), Stopwatch()
        # Sharded: gathered, every rank joining (workers/sync/weights.py).
        live = self._adapter
        wire, nbytes = to_wire(adapter_tensors(model) if live is None else {k: p.detach() for k, p in live.items()})
        self._last_ref = self.store.put(wire)
        notify(Notice(self.protocol, version, self._next_seq(), nbytes, sent_at, {"ref": self._last_ref}))
        return SyncReport(self.protocol, version, nbytes, trainer_ms=clock.ms(), tensors=len(wire), messages=1)

    def close(self) -> None:
        self._last_ref = None


@dataclass
class StagedAdapter:
    notice: Notice
    adapter: dict[str, torch.Tensor]
    receive_ms: float


class LoRAReceiver(WeightReceiver):
    protocol = "lora"

    def __init__(
        self, base_dir: str, store: Any | None = None, adapter_root: str | None = None, verify_base: bool = True
    ) -> None:
        """`base_dir`: the model directory the worker's backend was built from (the base).
        `adapter_root`: where adapter directories for adapter-capable backends go."""
        self.base_dir = base_dir
        self.store = store if store is not None else RayStore()
        self._owns_root = adapter_root is None
        self.adapter_root = adapter_root
        self.verify_base = verify_base
        self.base: dict[str, torch.Tensor] | None = None  # the merge's base, read on first use
        self._connected = False
        self._merged: dict[str, torch.Tensor] = {}  # merge buffers, reused per version
        self._written: list[str] = []

    def connect(self, endpoint: dict[str, Any], rank: int = 1) -> None:
        super().connect(endpoint, rank)
        self.scaling = float(endpoint["scaling"])
        self.adapter_config = endpoint["adapter_config"]
        if self.verify_base and state_checksum(checkpoint_weights(self.base_dir)) != endpoint["base_checksum"]:
            raise ValueError(
                f"the base weights in {self.base_dir} differ from the trainer's LoRA base: adapter-only "
                f"sync needs workers built from the same model directory as the trainer"
            )
        self._connected = True
        if self.adapter_root is None:
            shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
            self.adapter_root = tempfile.mkdtemp(prefix="rollway-adapters-", dir=shm)
        os.makedirs(self.adapter_root, exist_ok=True)

    def receive(self, notice: Notice) -> StagedAdapter:
        if not self._connected:
            raise RuntimeError("LoRAReceiver.receive before connect(endpoint)")
        clock = Stopwatch()
        adapter = from_wire(self.store.get(notice.payload["ref"]))
        return StagedAdapter(notice, adapter, clock.ms())

    def apply(self, backend: Any, staged: StagedAdapter) -> SyncReport:
        if not self._connected or self.adapter_root is None:
            raise RuntimeError("LoRAReceiver.apply before connect(endpoint)")
        clock = Stopwatch()
        version = staged.notice.version
        # A VLLMBackend built without lora_rank has the method but cannot serve adapters.
        if hasattr(backend, "load_lora_adapter") and getattr(backend, "lora_rank", True) is not None:
            path = os.path.join(self.adapter_root, adapter_name(version))
            write_adapter_dir(path, staged.adapter, self.adapter_config)
            backend.load_lora_adapter(adapter_name(version), version + 1, path)
            self._written.append(path)
            while len(self._written) > KEEP_ADAPTERS:
                shutil.rmtree(self._written.pop(0), ignore_errors=True)
        else:
            if self.base is None:
                # The base as the trainer holds it, which the adapter's names follow: loaded
                # by transformers (it renames or fuses some checkpoints' weights on load:
                # GPT-NeoX's head, the experts of a mixture of experts), each tied weight once.
                self.base = live_weights(self.base_dir)
            # load_weights copies (both backends do), so the buffers are free again after.
            backend.load_weights(
                merge_adapter(
                    self.base,
                    staged.adapter,
                    self.scaling,
                    out=self._merged,
                    fan_in_fan_out=bool(self.adapter_config.get("fan_in_fan_out")),
                )
            )
        return SyncReport(
            self.protocol,
            version,
            staged.notice.nbytes,
            inference_ms=staged.receive_ms + clock.ms(),
            end_to_end_ms=end_to_end_ms(staged.notice),
            receive_ms=staged.receive_ms,
            tensors=len(staged.adapter),
            messages=1,
        )

    def close(self) -> None:
        if self._owns_root and self.adapter_root:
            shutil.rmtree(self.adapter_root, ignore_errors=True)
