"""Admission: will a run's config ever fit, on this cluster and within the operator's limits?

A config is hostile input: a thousand inference workers, a model of a million hidden
units, or 10^30 steps must be refused before anything reaches Ray, with a message that
names the field and the limit. Two checks, both pure functions of the config:

- **operator limits** (`Limits`, set by the site's settings): steps, minutes, inference
  workers, model parameters;
- **what the engine can run** (`engine_errors`): pool sizes it does not implement yet;
- **cluster capacity** (`Capacity`, what Ray reports the cluster has in total): the CPUs
  and GPUs the run's actors ask for (workers/placement.py, from the config), and an
  estimate of the memory they need (model, optimizer state, activations, KV cache,
  per-process overhead; `demand`).

The estimate is deliberately rough — the point is to refuse what can never run, not
to pack the cluster tightly. A run that fits but not now waits in the platform's queue.

This module imports neither Ray nor torch: the web process calls it on every launch.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from workers import placement

if TYPE_CHECKING:
    from workers.config import RunConfig

FLOAT_BYTES = 4  # the trainer and the torch backend hold float32 weights
# Resident memory of an actor process before its model: Python, torch, Ray's worker.
PROCESS_BYTES = 400 * 2**20
# vLLM's engine in a worker process: its own code, compiled graphs and buffers.
VLLM_ENGINE_BYTES = 1536 * 2**20
# vLLM batches up to this many sequences (workers/inference/vllm_backend.MAX_NUM_SEQS).
VLLM_MAX_NUM_SEQS = 256
# Adam keeps two moments per trainable parameter, the gradient a third copy.
OPTIMIZER_COPIES = 3


@dataclass(frozen=True)
class Limits:
    """What the operator allows one run. Settings: ROLLWAY_MAX_STEPS, ROLLWAY_MAX_MINUTES,
    ROLLWAY_MAX_WORKERS, ROLLWAY_MAX_MODEL_PARAMS."""

    max_steps: int = 100_000
    max_minutes: float = 24 * 60.0
    max_workers: int = 16
    max_model_params: int = 10_000_000_000


@dataclass(frozen=True)
class Capacity:
    """What the cluster has in total (Ray's `cluster_resources()`), not what is free now."""

    cpus: float
    memory_bytes: int
    gpus: float = 0.0


@dataclass(frozen=True)
class Demand:
    """What a run asks of the cluster, in total and per actor role."""

    params: int
    cpus: float
    memory_bytes: int
    gpus: float = 0.0
    per_role: dict[str, int] = field(default_factory=dict)  # role → bytes of one actor


def model_shape(cfg: RunConfig) -> dict[str, int]:
    """hidden, layers, intermediate, vocab and params of the run's policy: from the config
    for the tiny model, from the checkpoint's headers (no weights read) for a directory."""
    if cfg.model.source == "tiny":
        from workers.tokenizer import CharTokenizer

        m = cfg.model
        shape = {
            "hidden": m.hidden_size,
            "layers": m.num_layers,
            "intermediate": m.intermediate_size,
            "vocab": CharTokenizer().vocab_size,
        }
        h, n, i, v = shape["hidden"], shape["layers"], shape["intermediate"], shape["vocab"]
        # Untied embedding and head, per layer q/k/v/o + gate/up/down + two norms.
        shape["params"] = 2 * v * h + n * (4 * h * h + 3 * h * i + 2 * h) + h
        return shape
    if cfg.model.source == "hub":
        from workers.model import hub_metadata_dir  # the Hub model's config, fetched by the launch check

        return _checkpoint_shape(hub_metadata_dir(cfg.model.hub_id or ""))
    return _checkpoint_shape(cfg.model.path or "")


def _checkpoint_shape(model_dir: str) -> dict[str, int]:
    with open(os.path.join(model_dir, "config.json")) as f:
        hf = json.load(f)
    shape = {
        "hidden": int(hf.get("hidden_size", 0)),
        "layers": int(hf.get("num_hidden_layers", 0)),
        "intermediate": int(hf.get("intermediate_size", 0)),
        "vocab": int(hf.get("vocab_size", 0)),
    }
    shape["params"] = _checkpoint_params(model_dir) or (
        2 * shape["vocab"] * shape["hidden"]
        + shape["layers"] * (4 * shape["hidden"] ** 2 + 3 * shape["hidden"] * shape["intermediate"])
    )
    return shape


def _checkpoint_params(model_dir: str) -> int:
    """Parameters in the directory's safetensors files, from their headers alone."""
    from safetensors import safe_open

    total = 0
    for name in sorted(os.listdir(model_dir)):
        if name.endswith(".safetensors"):
            with safe_open(os.path.join(model_dir, name), framework="numpy") as f:
                for key in f.keys():
                    total += math.prod(f.get_slice(key).get_shape())
    return total


def demand(cfg: RunConfig) -> Demand:
    """The CPUs and GPUs the run's actors ask for (the driver and the buffer ask for
    none) and an estimate of the memory they need."""
    shape = model_shape(cfg)
    params, h, n, v = shape["params"], shape["hidden"], shape["layers"], shape["vocab"]
    weights = params * FLOAT_BYTES
    seq = cfg.task.max_len + 2 + cfg.inference.max_new_tokens  # BOS + prompt + "=" + completion
    samples = cfg.trainer.batch_groups * cfg.trainer.group_size

    # With LoRA every linear layer of a block is adapted: r · (in + out) per module.
    trainable = n * cfg.lora.rank * (11 * h + 3 * shape["intermediate"]) if cfg.lora.enabled else params
    # Logits dominate a small model's activations (three copies: logits, log-softmax,
    # their gradient); the blocks keep ~12 hidden-sized tensors per layer for backward.
    activations = samples * seq * (3 * v + 12 * h * n) * FLOAT_BYTES // max(cfg.trainer.minibatches, 1)
    trainer = PROCESS_BYTES + weights + trainable * OPTIMIZER_COPIES * FLOAT_BYTES + activations

    kv_per_token = n * 2 * h * FLOAT_BYTES
    workers = cfg.inference.num_workers
    if cfg.inference.backend == "vllm":
        worker = PROCESS_BYTES + VLLM_ENGINE_BYTES + weights + kv_per_token * seq * VLLM_MAX_NUM_SEQS
    else:
        rows = math.ceil(cfg.trainer.batch_groups / workers) * cfg.trainer.group_size
        worker = PROCESS_BYTES + weights + kv_per_token * seq * rows
    driver = PROCESS_BYTES  # the driver and the buffer, together
    asked = placement.totals(cfg)
    return Demand(
        params=params,
        cpus=asked.cpus,
        gpus=asked.gpus,
        memory_bytes=trainer + workers * worker + driver,
        per_role={"trainer": trainer, "inference worker": worker, "driver and buffer": driver},
    )


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def limit_errors(cfg: RunConfig, limits: Limits) -> dict[str, str]:
    """{dotted field: message} for each operator limit the config exceeds. Needs no
    model directory to be readable beyond its headers."""
    errors: dict[str, str] = {}
    if cfg.stop.max_steps > limits.max_steps:
        got = cfg.stop.max_steps
        shown = got if got < 1e12 else f"{got:.3g}"
        errors["stop.max_steps"] = f"at most {limits.max_steps} steps on this site (ROLLWAY_MAX_STEPS); got {shown}"
    if cfg.stop.max_minutes > limits.max_minutes:
        errors["stop.max_minutes"] = (
            f"at most {limits.max_minutes:g} minutes on this site (ROLLWAY_MAX_MINUTES); got {cfg.stop.max_minutes:g}"
        )
    if cfg.inference.num_workers > limits.max_workers:
        errors["inference.num_workers"] = (
            f"at most {limits.max_workers} inference workers per run on this site (ROLLWAY_MAX_WORKERS); "
            f"got {cfg.inference.num_workers}"
        )
    params = model_shape(cfg)["params"]
    if params > limits.max_model_params:
        field_name = {"path": "model.path", "hub": "model.hub_id"}.get(cfg.model.source, "model.hidden_size")
        errors[field_name] = (
            f"the model has {params:.3g} parameters; this site allows at most "
            f"{limits.max_model_params:.3g} (ROLLWAY_MAX_MODEL_PARAMS)"
        )
    return errors


def engine_errors(cfg: RunConfig) -> dict[str, str]:
    """{dotted field: message} for each pool size the engine cannot run yet."""
    errors: dict[str, str] = {}
    if cfg.inference.tensor_parallel_size > 1:
        errors["inference.tensor_parallel_size"] = (
            "inference.tensor_parallel_size > 1 needs an inference backend that shards a worker's model "
            f"across its devices, not available yet; got {cfg.inference.tensor_parallel_size}: set it to 1 "
            "and raise inference.num_workers instead"
        )
    return errors


def _gpu_error(cfg: RunConfig, need: Demand, capacity: Capacity) -> tuple[str, str]:
    """(field, message) for a run that asks for more GPUs than the cluster has: the field
    of the pool that asks for more."""
    w, tp, r = cfg.inference.num_workers, cfg.inference.tensor_parallel_size, cfg.trainer.num_ranks
    if cfg.placement.mode == "colocated":
        inference = w
        asked = f"max(inference.num_workers {w}, trainer.num_ranks {r}), colocated"
    else:
        inference = w * tp
        asked = f"inference.num_workers {w} × inference.tensor_parallel_size {tp} + trainer.num_ranks {r}"
    field_name = "inference.num_workers" if inference >= r else "trainer.num_ranks"
    return field_name, (
        f"the run asks for {need.gpus:g} GPUs ({asked}); the cluster has {capacity.gpus:g}: "
        "ask for fewer, or set placement.devices to 'cpu'"
    )


def capacity_errors(cfg: RunConfig, capacity: Capacity) -> dict[str, str]:
    """{dotted field: message} if the run could never fit on a cluster of `capacity`."""
    need = demand(cfg)
    errors: dict[str, str] = {}
    if need.cpus > capacity.cpus + 1e-9:
        errors["inference.num_workers"] = (
            f"{cfg.inference.num_workers} inference workers ask for {need.cpus:g} CPUs "
            f"(inference.cpus_per_worker {cfg.inference.cpus_per_worker:g} each + trainer.cpus_per_rank "
            f"{cfg.trainer.cpus_per_rank:g} × {cfg.trainer.num_ranks} for the trainer); "
            f"the cluster has {capacity.cpus:g}"
        )
    if need.gpus > capacity.gpus + 1e-9:
        field_name, message = _gpu_error(cfg, need, capacity)
        errors.setdefault(field_name, message)
    if need.memory_bytes > capacity.memory_bytes:
        roles = ", ".join(f"{role} {_gib(b)}" for role, b in need.per_role.items())
        workers = cfg.inference.num_workers * need.per_role["inference worker"]
        field_name = (
            "inference.num_workers" if workers > need.per_role["trainer"] and cfg.inference.num_workers > 1 else "model"
        )
        errors.setdefault(
            field_name,
            (
                f"the run needs about {_gib(need.memory_bytes)} of memory ({roles}; "
                f"{cfg.inference.num_workers} inference worker(s)); the cluster has {_gib(capacity.memory_bytes)}"
            ),
        )
    return errors


def admission_errors(cfg: RunConfig, limits: Limits, capacity: Capacity | None) -> dict[str, str]:
    """Operator limits and what the engine can run, then (when the cluster's capacity is
    known) what it can ever give. Empty: the run may be queued."""
    errors = {**engine_errors(cfg), **limit_errors(cfg, limits)}
    if capacity is not None and not errors:
        # Past a limit the estimate can be astronomically large: the limit's message says enough.
        errors.update(capacity_errors(cfg, capacity))
    return errors
