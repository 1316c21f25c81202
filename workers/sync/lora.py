"""Protocol "lora": adapter-only sync. The trainer trains a peft LoRA adapter on a frozen
base; only the adapter's tensors move (a rank-8 adapter of a 36M model is 2.9 MB against
160 MB), through the object store like protocol "object_store".

Workers already hold the base (the same model directory the trainer started from; the
sender publishes the base's checksum and `connect` refuses a different one). A worker
then does one of two things with each version:

- a backend with adapter support (`load_lora_adapter(name, lora_int_id, path)`, vLLM with
  `enable_lora=True`) gets the adapter written as a peft directory and registered under a
  versioned name `policy-v<version>` (id version + 1): requests name the adapter they
  were generated with, and the base weights never change;
- any other backend (TorchBackend) gets base + scaling · B·A merged into a full state dict
  locally, the exact float operations of peft's `merge_and_unload`, so the worker's
  weights are bit-identical to the trainer's merged policy. Bytes on the wire stay
  adapter-only; the merge costs one full load inside the worker.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from safetensors.torch import load_file, save_file

from workers.sync.base import (
    Notice, Notify, Stopwatch, SyncReport, WeightReceiver, WeightSender, end_to_end_ms,
    state_checksum,
)
from workers.sync.object_store import RayStore, from_wire, to_wire

# Every linear layer of a Llama block: the usual choice for RL fine-tuning with LoRA.
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_PEFT_PREFIX = "base_model.model."
# Adapter directories kept on a worker: vLLM may re-read an evicted adapter from disk.
KEEP_ADAPTERS = 2


def apply_lora(
    model: torch.nn.Module,
    rank: int = 8,
    alpha: float = 16.0,
    target_modules: Sequence[str] = TARGET_MODULES,
    dropout: float = 0.0,
    init_lora_weights: bool | str = True,
):
    """Wrap the trainer's model with a peft LoRA adapter (base frozen, adapter trainable).
    Build the optimizer afterwards, over the trainable parameters."""
    from peft import LoraConfig, get_peft_model

    if rank < 1:
        raise ValueError(f"lora.rank must be ≥ 1 (got {rank})")
    config = LoraConfig(
        r=rank, lora_alpha=alpha, target_modules=list(target_modules), lora_dropout=dropout,
        init_lora_weights=init_lora_weights, bias="none",
    )
    return get_peft_model(model, config)


def is_peft(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def adapter_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's tensors under peft's saved names (…q_proj.lora_A.weight), detached
    views of the live parameters."""
    from peft.utils import get_peft_model_state_dict

    return {k: v.detach() for k, v in get_peft_model_state_dict(model).items()}


def adapter_parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """peft's saved name → the live Parameter, resolved once: asking peft for its adapter
    state dict walks the whole model each time (~50 ms for 12 layers here)."""
    active = model.active_adapter if isinstance(model.active_adapter, str) else "default"
    params = dict(model.named_parameters())
    out = {}
    for key in adapter_state_dict(model):
        live = key.removesuffix(".weight") + f".{active}.weight"
        if live not in params:
            raise KeyError(f"adapter tensor {key!r} has no live parameter {live!r}")
        out[key] = params[live]
    return out


def base_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The frozen base under Hugging Face checkpoint names (views, no copy)."""
    out = {}
    for key, t in model.get_base_model().state_dict().items():
        if ".lora_" in key:
            continue
        out[key.replace(".base_layer.", ".")] = t.detach()
    return out


def _target_weight(adapter_key: str) -> tuple[str, str]:
    """'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight' →
    ('model.layers.0.self_attn.q_proj.weight', 'A')."""
    key = adapter_key.removeprefix(_PEFT_PREFIX)
    for part in ("A", "B"):
        suffix = f".lora_{part}.weight"
        if key.endswith(suffix):
            return key[: -len(suffix)] + ".weight", part
    raise ValueError(f"{adapter_key!r} is not a LoRA A/B weight (bias and DoRA adapters are not supported)")


def merge_adapter(
    base: dict[str, torch.Tensor],
    adapter: dict[str, torch.Tensor],
    scaling: float,
    out: dict[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """base + (B @ A) · scaling for every adapted weight, untouched tensors shared.

    The same float operations, in the same order, as peft's merge (get_delta_weight then
    +=), so the result is bit-identical to `merge_and_unload()` on the same tensors.
    `out`: buffers from an earlier call to merge into again (a worker merging every
    version would otherwise fault in a fresh model-sized allocation each time)."""
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in adapter.items():
        weight, part = _target_weight(key)
        pairs.setdefault(weight, {})[part] = t
    merged = dict(base)
    for weight, ab in pairs.items():
        if weight not in base or set(ab) != {"A", "B"}:
            raise KeyError(f"adapter for {weight!r} does not match the base (has {sorted(ab)}; "
                           f"base has it: {weight in base})")
        if out is None:
            merged[weight] = base[weight] + (ab["B"] @ ab["A"]) * scaling
        else:
            dest = out.get(weight)
            if dest is None:
                dest = out[weight] = torch.empty_like(base[weight])
            torch.matmul(ab["B"], ab["A"], out=dest)
            dest.mul_(scaling)
            torch.add(base[weight], dest, out=dest)
            merged[weight] = dest
    return merged


def effective_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The policy a peft model computes, as full weights under checkpoint names (what a
    full sync of a LoRA run moves)."""
    return merge_adapter(base_state_dict(model), adapter_state_dict(model), _scaling(model))


def _scaling(model: torch.nn.Module) -> float:
    cfg = model.peft_config["default"]
    if cfg.rank_pattern or cfg.alpha_pattern:
        raise NotImplementedError("per-module LoRA ranks/alphas are not supported by adapter-only sync")
    return cfg.lora_alpha / (cfg.r ** 0.5 if cfg.use_rslora else cfg.r)


def write_adapter_dir(path: str, adapter: dict[str, torch.Tensor], adapter_config: dict) -> None:
    """A peft adapter directory (adapter_config.json + adapter_model.safetensors),
    written under a temporary name then renamed, so a reader never sees half of it."""
    parent = os.path.dirname(path) or "."
    tmp = tempfile.mkdtemp(prefix=".adapter-", dir=parent)
    with open(os.path.join(tmp, "adapter_config.json"), "w") as f:
        json.dump(adapter_config, f)
    save_file({k: v.contiguous() for k, v in adapter.items()}, os.path.join(tmp, "adapter_model.safetensors"))
    if os.path.exists(path):
        shutil.rmtree(path)
    os.rename(tmp, path)


def adapter_name(version: int) -> str:
    """The versioned adapter name a worker registers: requests say which policy made them."""
    return f"policy-v{version}"


# vLLM 0.32 accepts only these max_lora_rank values (vllm.config.lora.MaxLoRARanks).
_VLLM_MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def vllm_lora_engine_args(rank: int, max_loras: int = 2) -> dict:
    """Engine arguments that let a vLLM engine serve this run's adapters.

    `max_loras` ≥ 2 lets the next version load while the current one still serves
    (drain); in-flight updates keep requests of older versions alive and need
    max_staleness + 2 (TRL's rule)."""
    fitting = [r for r in _VLLM_MAX_LORA_RANKS if r >= rank]
    if not fitting:
        raise ValueError(f"lora.rank {rank} is above vLLM's largest max_lora_rank {_VLLM_MAX_LORA_RANKS[-1]}")
    return {"enable_lora": True, "max_lora_rank": fitting[0], "max_loras": max(2, max_loras)}


def swap_vllm_adapter(llm, name: str, lora_int_id: int, path: str, previous=None):
    """Register adapter `name` (a peft directory at `path`) with `llm` (a vllm.LLM) and
    drop `previous`; returns the LoRARequest that generate calls must pass from now on.
    Call between generate calls (drain), under the backend's engine lock."""
    from vllm.lora.request import LoRARequest

    request = LoRARequest(name, lora_int_id, path)
    llm.llm_engine.add_lora(request)  # loads it now, not at the first request
    if previous is not None and previous.lora_int_id != lora_int_id:
        llm.llm_engine.remove_lora(previous.lora_int_id)
    return request


class LoRASender(WeightSender):
    protocol = "lora"

    def __init__(self, store: Any | None = None) -> None:
        super().__init__()
        self.store = store if store is not None else RayStore()
        self._last_ref: Any = None

    def attach(self, model: torch.nn.Module) -> None:
        if not is_peft(model):
            raise TypeError(
                "sync.protocol 'lora' needs the trainer's model wrapped with a peft LoRA adapter "
                "(workers.sync.lora.apply_lora); enable LoRA or choose a full-weight protocol"
            )
        super().attach(model)
        self._adapter = adapter_parameters(model)

    def endpoint(self) -> dict[str, Any]:
        model = self._require_model()
        cfg = model.peft_config["default"]
        adapter_config = cfg.to_dict()
        adapter_config["target_modules"] = sorted(adapter_config["target_modules"] or [])
        adapter_config["peft_type"] = "LORA"
        adapter_config.pop("runtime_config", None)
        return {
            "protocol": self.protocol, "scaling": _scaling(model), "adapter_config": adapter_config,
            "base_checksum": state_checksum(base_state_dict(model)),
        }

    def send(self, version: int, notify: Notify) -> SyncReport:
        self._require_model()
        sent_at, clock = time.time(), Stopwatch()
        wire, nbytes = to_wire({k: p.detach() for k, p in self._adapter.items()})
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

    def __init__(self, base_dir: str, store: Any | None = None, adapter_root: str | None = None,
                 verify_base: bool = True) -> None:
        """`base_dir`: the model directory the worker's backend was built from (the base).
        `adapter_root`: where adapter directories for adapter-capable backends go."""
        self.base_dir = base_dir
        self.store = store if store is not None else RayStore()
        self._owns_root = adapter_root is None
        self.adapter_root = adapter_root
        self.verify_base = verify_base
        self.base: dict[str, torch.Tensor] | None = None
        self._merged: dict[str, torch.Tensor] = {}  # merge buffers, reused per version
        self._written: list[str] = []

    def connect(self, endpoint: dict[str, Any], rank: int = 1) -> None:
        super().connect(endpoint, rank)
        self.scaling = float(endpoint["scaling"])
        self.adapter_config = endpoint["adapter_config"]
        self.base = load_file(os.path.join(self.base_dir, "model.safetensors"))
        if self.verify_base and state_checksum(self.base) != endpoint["base_checksum"]:
            raise ValueError(
                f"the base weights in {self.base_dir} differ from the trainer's LoRA base: adapter-only "
                f"sync needs workers built from the same model directory as the trainer"
            )
        if self.adapter_root is None:
            shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
            self.adapter_root = tempfile.mkdtemp(prefix="rollway-adapters-", dir=shm)

    def receive(self, notice: Notice) -> StagedAdapter:
        if self.base is None:
            raise RuntimeError("LoRAReceiver.receive before connect(endpoint)")
        clock = Stopwatch()
        adapter = from_wire(self.store.get(notice.payload["ref"]))
        return StagedAdapter(notice, adapter, clock.ms())

    def apply(self, backend: Any, staged: StagedAdapter) -> SyncReport:
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
            # load_weights copies (both backends do), so the buffers are free again after.
            backend.load_weights(merge_adapter(self.base, staged.adapter, self.scaling, out=self._merged))
        return SyncReport(
            self.protocol, version, staged.notice.nbytes,
            inference_ms=staged.receive_ms + clock.ms(), end_to_end_ms=end_to_end_ms(staged.notice),
            receive_ms=staged.receive_ms,
            tensors=len(staged.adapter), messages=1,
        )

    def close(self) -> None:
        if self._owns_root and self.adapter_root:
            shutil.rmtree(self.adapter_root, ignore_errors=True)
