"""Admission: will a run's config ever fit, on this cluster and within the operator's limits?

A config is hostile input: a thousand inference workers, a model of a million hidden
units, or 10^30 steps must be refused before anything reaches Ray, with a message that
names the field and the limit. Two checks, both pure functions of the config:

- **operator limits** (`Limits`, set by the site's settings): steps, minutes, inference
  workers, model parameters;
- **what the engine can run** (`engine_errors`): pool sizes it does not implement yet,
  vLLM's engine arguments where the backend or the device cannot take them;
- **what the model takes** (`model_errors`): LoRA target modules that match none of its
  modules, prompts and completions longer than its positions;
- **cluster capacity** (`Capacity`, what Ray reports the cluster has in total): the CPUs
  and GPUs the run's actors ask for (workers/run/placement.py, from the config: the inference
  workers, the trainer ranks and the reward workers), an estimate of the memory they
  need (model, optimizer state, activations, KV cache, per-process overhead; `demand`)
  and, on GPUs of known memory, of what one GPU of the inference and trainer pools holds
  (`gpu_demand`).

The estimate is deliberately rough — the point is to refuse what can never run, not
to pack the cluster tightly. A run that fits but not now waits in the platform's queue.

This module imports neither Ray nor torch at import time: the web process calls it on
every launch. Reading a checkpoint's config (transformers) and building a model on the
meta device to list its modules (no weights) happen inside the functions that need them.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from workers.config.capabilities import refusals
from workers.inference.base import ROUTED_EXPERTS_ON_CPU, VLLM_MAX_NUM_SEQS, vllm_cpu_kv_cache_bytes
from workers.model.loading import ModelDims, build_tiny, hub_metadata_dir, meta_model, model_config, model_dims
from workers.model.tokenizer import CharTokenizer, load_tokenizer
from workers.rollout.context import context_tokens
from workers.rollout.task_data import DatasetError
from workers.run import placement
from workers.run.colocation import SharedGpu, shared_gpu

if TYPE_CHECKING:
    from workers.config.run_config import RunConfig

FLOAT_BYTES = 4  # the trainer and the torch backend hold float32 weights
# Resident memory of an actor process before its model: Python, torch, Ray's worker.
PROCESS_BYTES = 400 * 2**20
# vLLM's engine in an inference worker's process: its own code, compiled graphs and buffers.
VLLM_ENGINE_BYTES = 1536 * 2**20
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
    # Memory of one GPU (the smallest the cluster has), or 0 when not known: then no run
    # is held to it.
    gpu_memory_bytes: int = 0


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
        shape["kv_width"] = h  # as many key/value heads as query heads
        return shape
    return _checkpoint_shape(_model_dir(cfg))


def _model_dir(cfg: RunConfig) -> str:
    """Where the run's checkpoint's config and tokenizer are: model.path, or the Hub
    model's (fetched by the launch check, no weights)."""
    if cfg.model.source == "hub":
        return hub_metadata_dir(cfg.model.hub_id or "")
    return cfg.model.path or ""


def _dims(cfg: RunConfig) -> ModelDims:
    """The run's model's sizes: from the config for the tiny model, else as transformers
    reads the checkpoint's config for its architecture."""
    if cfg.model.source != "tiny":
        return model_dims(model_config(_model_dir(cfg)))

    m = cfg.model
    return ModelDims(
        hidden=m.hidden_size,
        layers=m.num_layers,
        heads=m.num_heads,
        kv_heads=m.num_heads,
        head_dim=m.hidden_size // m.num_heads,
        intermediate=m.intermediate_size,
        vocab=CharTokenizer().vocab_size,
        positions=m.max_position_embeddings,
        tied=False,
    )


def _checkpoint_shape(model_dir: str) -> dict[str, int]:
    dims = model_dims(model_config(model_dir))
    shape = {"hidden": dims.hidden, "layers": dims.layers, "intermediate": dims.intermediate, "vocab": dims.vocab}
    # Width of one token's keys (or values) in one layer: grouped-query attention keeps
    # fewer key/value heads than query heads.
    shape["kv_width"] = dims.kv_heads * dims.head_dim
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


def _tokenizer(cfg: RunConfig):
    return CharTokenizer() if cfg.model.source == "tiny" else load_tokenizer(_model_dir(cfg))


def run_context(cfg: RunConfig, dims: ModelDims | None = None) -> int:
    """Tokens one sequence of the run holds (workers/rollout/context.py): what a vLLM engine's
    max_model_len and KV cache are sized for. ValueError when it exceeds the model's
    positions (`model_errors` names the field)."""
    dims = dims or _dims(cfg)
    return context_tokens(cfg, _tokenizer(cfg), dims.positions)


def sequence_tokens(cfg: RunConfig, dims: ModelDims | None = None) -> int:
    """Tokens one sequence holds, for the memory estimates: the run's context (its
    longest prompt as its tokenizer renders it, plus inference.max_new_tokens:
    `run_context`); where that is past the model's positions, or its dataset cannot be
    read (`model_errors` and the dataset's check name the field), the positions, or the
    completion alone where the model has none."""
    dims = dims or _dims(cfg)
    try:
        return run_context(cfg, dims)
    except ValueError:
        return dims.positions or cfg.inference.max_new_tokens


def demand(cfg: RunConfig) -> Demand:
    """The CPUs and GPUs the run's actors ask for (the driver and the buffer ask for
    none) and an estimate of the memory they need."""
    shape = model_shape(cfg)
    params, h, n, v = shape["params"], shape["hidden"], shape["layers"], shape["vocab"]
    weights = params * FLOAT_BYTES
    dims = _dims(cfg)
    seq = sequence_tokens(cfg, dims)
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
        # What the engine reserves: inference.max_num_seqs sequences of the run's context.
        seqs = cfg.inference.max_num_seqs or VLLM_MAX_NUM_SEQS
        worker = PROCESS_BYTES + VLLM_ENGINE_BYTES + weights + vllm_cpu_kv_cache_bytes(dims, seq, seqs)
    else:
        rows = math.ceil(cfg.trainer.batch_groups / workers) * cfg.trainer.group_size
        worker = PROCESS_BYTES + weights + kv_per_token * seq * rows
    driver = PROCESS_BYTES  # the driver and the buffer, together
    per_role = {"trainer": trainer, "inference worker": worker, "driver and buffer": driver}
    # A reward worker's process; its reward model (rewards.model_path) is not read here.
    scorers = cfg.rewards.workers
    if scorers:
        per_role["reward worker"] = PROCESS_BYTES
    asked = placement.totals(cfg)
    return Demand(
        params=params,
        cpus=asked.cpus,
        gpus=asked.gpus,
        memory_bytes=trainer + workers * worker + scorers * PROCESS_BYTES + driver,
        per_role=per_role,
    )


# -- GPU memory, per GPU of each pool --------------------------------------------------

# Memory of the GPUs Ray names by type (its `accelerator_type:<type>` resource), GiB. An
# A100 reports "A100" whether it has 40 or 80 GB: the smaller is assumed, and the
# operator's ROLLWAY_GPU_MEMORY_GB says otherwise.
ACCELERATOR_MEMORY_GIB = {
    "H100": 80,
    "H200": 141,
    "H20": 96,
    "B200": 180,
    "A100": 40,
    "A100-40G": 40,
    "A100-80G": 80,
    "L40S": 48,
    "L4": 24,
    "A10G": 24,
    "T4": 16,
    "V100": 16,
}
# A CUDA process before its tensors: the context, cuBLAS workspaces, allocator slack.
CUDA_PROCESS_BYTES = 1 << 30
# Activations a transformer block keeps per token for its backward, × hidden, in 16-bit
# (Korthikanti et al. 2022, with fused attention: no sequence² term); 32-bit doubles it.
ACTIVATION_BYTES_PER_HIDDEN = 34
# workers.model.logprobs: the float32 chunk of the log-softmax (its bound, per pass).
LOGPROB_CHUNK_BYTES = 256 << 20


def gpu_memory_of(resources: dict[str, float]) -> int:
    """The memory of one GPU of a cluster whose resources are `resources` (Ray's
    `cluster_resources()`): the smallest known type's, or 0 when no type is known."""
    known = [
        ACCELERATOR_MEMORY_GIB[key.removeprefix("accelerator_type:")]
        for key in resources
        if key.startswith("accelerator_type:") and key.removeprefix("accelerator_type:") in ACCELERATOR_MEMORY_GIB
    ]
    return min(known) * 2**30 if known else 0


@dataclass(frozen=True)
class GpuDemand:
    """Bytes one GPU of each pool holds at its peak, and what they are made of."""

    trainer: int
    inference: int
    trainer_parts: dict[str, int]
    inference_parts: dict[str, int]


def gpu_demand(cfg: RunConfig, shape: dict[str, int] | None = None) -> GpuDemand:
    """A rough peak of one trainer rank's GPU and one inference worker's (per GPU of its
    tensor-parallel group). Trainer: float32 master weights, float32 gradients and AdamW
    moments of the trained parameters (fsdp2: 1/N of each, plus the layers it gathers),
    the frozen KL reference when trainer.kl_coef > 0 without LoRA (a whole float32 copy
    on every rank; with LoRA the base is the reference, no copy),
    the activations of one micro-batch (checkpointed: a layer's worth and every layer's
    input) and its logits, and the version a cuda_ipc sender keeps;
    inference: the weights in inference.dtype and the KV cache of its share of a batch
    (vLLM takes inference.gpu_memory_utilization of the GPU whatever it holds)."""
    shape = shape or model_shape(cfg)
    tc, inf = cfg.trainer, cfg.inference
    params, h, n, v = shape["params"], shape["hidden"], shape["layers"], shape["vocab"]
    sharded = tc.num_ranks if tc.backend == "fsdp2" else 1
    trained = n * cfg.lora.rank * (11 * h + 3 * shape["intermediate"]) if cfg.lora.enabled else params
    seq = sequence_tokens(cfg)
    rows = math.ceil(tc.batch_groups * tc.group_size / tc.minibatches / tc.num_ranks)
    rows = min(rows, tc.micro_batch_rows or rows)
    width = 2 if tc.dtype == "bfloat16" else 4
    per_layer = rows * seq * ACTIVATION_BYTES_PER_HIDDEN * h * width // 2
    # Checkpointed, a layer's activations live only while it is recomputed, but every
    # layer's input is kept until its backward.
    checkpoints = rows * seq * h * width * n if tc.gradient_checkpointing else 0
    dtype = 2 if inf.dtype in ("bfloat16", "auto") else 4
    # The project's own cuda_ipc sender (into the torch backend) keeps the newest version
    # in inference.dtype until its next send; vLLM's ipc engine frees its exports once
    # the worker has loaded them.
    kept = params * dtype if cfg.sync.protocol == "cuda_ipc" and inf.backend == "torch" else 0
    trainer_parts = {
        "weights": params * FLOAT_BYTES // sharded + (2 * params * FLOAT_BYTES // max(n, 1) if sharded > 1 else 0),
        "gradients and AdamW state": trained * OPTIMIZER_COPIES * FLOAT_BYTES // sharded,
        "KL reference": params * FLOAT_BYTES if tc.kl_coef and not cfg.lora.enabled else 0,
        "activations": per_layer * (1 if tc.gradient_checkpointing else n) + checkpoints,
        "logits": 2 * rows * seq * v * width + LOGPROB_CHUNK_BYTES,
        "sync buffer": kept,
        "CUDA": CUDA_PROCESS_BYTES,
    }
    share = math.ceil(tc.batch_groups / inf.num_workers) * tc.group_size
    inference_parts = {
        "weights": params * dtype // inf.tensor_parallel_size,
        "KV cache": share * seq * n * 2 * shape.get("kv_width", h) * dtype // inf.tensor_parallel_size,
        "CUDA": CUDA_PROCESS_BYTES,
    }
    return GpuDemand(sum(trainer_parts.values()), sum(inference_parts.values()), trainer_parts, inference_parts)


def trainer_resident(need: GpuDemand) -> int:
    """What a trainer rank keeps on its GPU between steps when it takes turns with vLLM:
    its weights (and KL reference), a sync buffer it keeps, and its CUDA context; the
    optimizer state, gradients and activations are what it offloads or frees
    (workers/train/offload.py)."""
    return sum(need.trainer_parts[k] for k in ("weights", "KL reference", "sync buffer", "CUDA"))


def colocated_gpu(
    cfg: RunConfig,
    gpu_memory_bytes: int,
    shape: dict[str, int] | None = None,
    level: int | None = None,
    need: GpuDemand | None = None,
) -> SharedGpu:
    """One GPU a vLLM worker and a trainer rank share (placement.mode 'colocated'), phase
    by phase, at inference.sleep_level (or `level`): vLLM holds its share
    (inference.gpu_memory_utilization of `gpu_memory_bytes`) while awake and its CUDA
    context while asleep. `need`: the run's `gpu_demand`, where the caller has it."""
    need = need or gpu_demand(cfg, shape)
    share = int(cfg.inference.gpu_memory_utilization * gpu_memory_bytes)
    level = cfg.inference.sleep_level if level is None else level
    return shared_gpu(level, share, CUDA_PROCESS_BYTES, need.trainer, trainer_resident(need))


def _parts(parts: dict[str, int]) -> str:
    return ", ".join(f"{name} {_gib(b)}" for name, b in parts.items() if b)


def gpu_memory_errors(cfg: RunConfig, gpu_memory_bytes: int, shape: dict[str, int] | None = None) -> dict[str, str]:
    """{dotted field: message} for a pool whose GPU would not hold what it needs
    (`gpu_demand`) on GPUs of `gpu_memory_bytes` each."""
    if cfg.placement.devices != "gpu" or not gpu_memory_bytes:
        return {}
    shape = shape or model_shape(cfg)  # read once: the checkpoint's headers
    need, have = gpu_demand(cfg, shape), _gib(gpu_memory_bytes)
    errors: dict[str, str] = {}
    vllm = cfg.inference.backend == "vllm"
    # vLLM takes its share of the GPU whatever the model: the weights must fit in it.
    inference_room = cfg.inference.gpu_memory_utilization * gpu_memory_bytes if vllm else gpu_memory_bytes
    trainer_room: float = gpu_memory_bytes
    level = cfg.inference.sleep_level
    shared = ""
    if cfg.placement.mode == "colocated":
        trainer_room = gpu_memory_bytes - (inference_room if vllm else need.inference)
        shared = " beside its colocated inference worker"
    if cfg.placement.mode == "colocated" and vllm:
        resident = trainer_resident(need)
        turns = colocated_gpu(cfg, gpu_memory_bytes, shape, level=1, need=need)
        if level:
            # Time-shared: the trainer's step has the GPU but for a sleeping vLLM's context.
            trainer_room, shared = gpu_memory_bytes - CUDA_PROCESS_BYTES, " beside its sleeping inference worker"
            if turns.generating > gpu_memory_bytes:
                errors["inference.gpu_memory_utilization"] = (
                    f"while vLLM generates, its share (inference.gpu_memory_utilization "
                    f"{cfg.inference.gpu_memory_utilization:g} of {have}) and what the trainer keeps between steps "
                    f"(its weights and CUDA context, {_gib(resident)}) need {_gib(turns.generating)}; "
                    f"the GPU has {have}: lower inference.gpu_memory_utilization"
                )
        elif need.trainer > trainer_room and turns.peak <= gpu_memory_bytes:
            both = colocated_gpu(cfg, gpu_memory_bytes, shape, level=0, need=need)
            errors["inference.sleep_level"] = (
                f"vLLM's share and the trainer's step need {_gib(both.peak)} of one GPU at once; the GPU has {have}. "
                f"Taking turns (vLLM asleep while the trainer steps) needs {_gib(turns.peak)}: set "
                "inference.sleep_level to 1 (or 2) and mode to 'sync', or shard the trainer (trainer.backend "
                "'fsdp2' over more trainer.num_ranks)"
            )
            trainer_room = need.trainer  # said above, once
    if need.trainer > trainer_room:
        errors["trainer.num_ranks" if cfg.trainer.backend == "fsdp2" else "trainer.backend"] = (
            f"each trainer rank needs about {_gib(need.trainer)} of GPU memory ({_parts(need.trainer_parts)}); "
            f"a GPU here has {have}{shared}: shard the trainer (trainer.backend 'fsdp2' over more "
            "trainer.num_ranks), train a LoRA adapter (lora.enabled), or cut activations "
            "(trainer.micro_batch_rows, trainer.gradient_checkpointing)"
        )
    needed = need.inference_parts["weights"] + need.inference_parts["CUDA"] if vllm else need.inference
    if needed > inference_room:
        where = f"inference.gpu_memory_utilization {cfg.inference.gpu_memory_utilization:g} of {have}" if vllm else have
        errors["inference.tensor_parallel_size"] = (
            f"each inference GPU needs about {_gib(needed)} ({_parts(need.inference_parts)}); it has {where}: "
            "split the model over more GPUs (inference.tensor_parallel_size), serve it in bfloat16 "
            "(inference.dtype), or give vLLM more of the GPU (inference.gpu_memory_utilization)"
        )
    return errors


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
    """{dotted field: message} for each field set where nothing reads it and the run would
    not be what the config says (workers/config/capabilities.py `refusals`: vLLM's engine
    arguments and a tensor-parallel split on the torch backend, a reward stage's fields
    without that stage), chunked prefill on vLLM-CPU, and a sleep level the run cannot
    take."""
    errors = refusals(cfg)
    if cfg.inference.backend == "vllm" and cfg.inference.enable_chunked_prefill and cfg.placement.devices == "cpu":
        # workers/inference/vllm_backend.py's engine arguments say how it fails.
        errors["inference.enable_chunked_prefill"] = (
            "inference.enable_chunked_prefill true cannot run on vLLM-CPU: a prompt left half prefilled rewinds "
            "its seeded generator, which a CPU generator cannot do; leave it null (off on the CPU), or set "
            "placement.devices to 'gpu'"
        )
    sleep = sleep_level_error(cfg)
    if sleep:
        errors["inference.sleep_level"] = sleep
    return errors


def sleep_level_error(cfg: RunConfig) -> str | None:
    """Why inference.sleep_level cannot apply to this run, or None (workers/run/colocation.py)."""
    inf, level = cfg.inference, cfg.inference.sleep_level
    if not level:
        return None
    fix = "or set inference.sleep_level to 0"
    if cfg.placement.devices == "cpu":
        # vLLM's CPU platform reports is_sleep_mode_available() False (sleep needs CUDA's
        # virtual memory allocator, CuMemAllocator) and its CPU worker ignores sleep/wake_up.
        return (
            f"inference.sleep_level {level} frees a GPU between generation and training, and vLLM on CPU has no "
            f"sleep mode (it needs CUDA's memory allocator): set placement.devices to 'gpu' and placement.mode "
            f"to 'colocated', {fix}"
        )
    if cfg.placement.mode != "colocated":
        return (
            f"inference.sleep_level {level} frees each GPU for the trainer rank sharing it, and placement.mode "
            f"'disaggregated' shares none: set placement.mode to 'colocated', {fix}"
        )
    if inf.backend != "vllm":
        return (
            f"inference.sleep_level {level} is vLLM's sleep mode, which inference.backend {inf.backend!r} does not "
            f"have: set inference.backend to 'vllm', {fix}"
        )
    if cfg.mode != "sync":
        return (
            f"inference.sleep_level {level} makes generation and training take turns on each GPU, and mode "
            f"'async' runs them side by side: set mode to 'sync', {fix}"
        )
    if level == 2 and cfg.sync.protocol == "lora":
        return (
            "inference.sleep_level 2 drops vLLM's weights each step and sync.protocol 'lora' sends the adapter only, "
            "so the base weights would never come back: set inference.sleep_level to 1 (weights kept in host "
            "memory), or a full-weight sync.protocol"
        )
    return None


def model_errors(cfg: RunConfig) -> dict[str, str]:
    """{dotted field: message} for settings the run's model cannot take: LoRA target
    modules that match none of its modules (the model is built on the meta device from
    its config: module names, no weights), and a longest prompt + inference.max_new_tokens
    past its positions (a checkpoint's; the tiny model's is checked by RunConfig)."""
    errors: dict[str, str] = {}
    if cfg.lora.enabled:
        # Imported here (torch): the site's web process imports this module and no torch.
        from workers.model.lora import target_problem

        problem = target_problem(_meta_model(cfg), cfg.lora)
        if problem:
            errors["lora.target_modules"] = problem
    if cfg.correction.keep_routing:
        # Imported here (torch): the site's web process imports this module and no torch.
        from workers.core.routing import routers

        if cfg.inference.backend == "vllm" and cfg.placement.devices == "cpu":
            errors["correction.keep_routing"] = ROUTED_EXPERTS_ON_CPU
        elif cfg.inference.backend == "vllm" and cfg.inference.enable_prefix_caching is False:
            # vLLM serves routed experts from prefix-cached blocks too, and refuses them without it.
            errors["inference.enable_prefix_caching"] = (
                "correction.keep_routing on vLLM needs prefix caching (vLLM returns routed experts only with it): "
                "leave inference.enable_prefix_caching null or true, or set correction.keep_routing to false"
            )
        elif not routers(_meta_model(cfg)):
            errors["correction.keep_routing"] = (
                "this model has no mixture-of-experts router to replay: set correction.keep_routing to false, "
                "or use an MoE checkpoint (Qwen2-MoE, Mixtral, …) through model.path"
            )
    # Mixture-of-experts configs name their routing width num_experts_per_tok
    # (Mixtral, Qwen2/3-MoE, OLMoE, DeepSeek, GPT-OSS). vLLM-CPU 0.32 keeps part of
    # the old expert weights after a reload, so its samples would silently come from
    # a policy the trainer no longer has.
    if (
        cfg.model.source != "tiny"
        and cfg.inference.backend == "vllm"
        and cfg.placement.devices == "cpu"
        and getattr(model_config(_model_dir(cfg)).get_text_config(), "num_experts_per_tok", None)
    ):
        errors["inference.backend"] = (
            "this checkpoint is a mixture of experts, and vLLM on CPU does not reload its experts' weights "
            "after a weight sync: set inference.backend to 'torch' on CPU hosts, or placement.devices to 'gpu'"
        )
    if cfg.model.source != "tiny":
        try:
            run_context(cfg)
        except DatasetError:
            pass  # the dataset's own check names its field
        except ValueError as exc:
            errors["inference.max_new_tokens"] = str(exc)
    return errors


def _meta_model(cfg: RunConfig):
    """The run's model on the meta device: its modules, no weights allocated."""
    import torch

    if cfg.model.source == "tiny":
        with torch.device("meta"):
            return build_tiny(cfg.model, CharTokenizer(), cfg.seed)

    return meta_model(_model_dir(cfg))


def _gpu_error(cfg: RunConfig, need: Demand, capacity: Capacity) -> tuple[str, str]:
    """(field, message) for a run that asks for more GPUs than the cluster has: the field
    of the pool that asks for the most."""
    w, tp, r = cfg.inference.num_workers, cfg.inference.tensor_parallel_size, cfg.trainer.num_ranks
    if cfg.placement.mode == "colocated":
        inference = w
        asked = f"max(inference.num_workers {w}, trainer.num_ranks {r}), colocated"
    else:
        inference = w * tp
        asked = f"inference.num_workers {w} × inference.tensor_parallel_size {tp} + trainer.num_ranks {r}"
    rewards = placement.totals(cfg).rewards_gpus
    if rewards:
        asked += f" + rewards.workers {cfg.rewards.workers} × rewards.gpus_per_worker {cfg.rewards.gpus_per_worker:g}"
    pools = {"inference.num_workers": inference, "trainer.num_ranks": r, "rewards.workers": rewards}
    field_name = max(pools, key=lambda name: pools[name])  # the first of equals: inference, then the trainer
    return field_name, (
        f"the run asks for {need.gpus:g} GPUs ({asked}); the cluster has {capacity.gpus:g}: "
        "ask for fewer, or set placement.devices to 'cpu'"
    )


def capacity_errors(cfg: RunConfig, capacity: Capacity) -> dict[str, str]:
    """{dotted field: message} if the run could never fit on a cluster of `capacity`."""
    need = demand(cfg)
    errors: dict[str, str] = {}
    if need.cpus > capacity.cpus + 1e-9:
        inf, rw = cfg.inference, cfg.rewards
        who, pool = f"{inf.num_workers} inference workers", ""
        if rw.workers:
            who += f" and {rw.workers} reward workers"
            pool = f" + rewards.cpus_per_worker {rw.cpus_per_worker:g} × {rw.workers} for the reward pool"
        field_name = (
            "rewards.workers"
            if rw.workers * rw.cpus_per_worker > inf.num_workers * inf.cpus_per_worker
            else "inference.num_workers"
        )
        errors[field_name] = (
            f"{who} ask for {need.cpus:g} CPUs "
            f"(inference.cpus_per_worker {inf.cpus_per_worker:g} each + trainer.cpus_per_rank "
            f"{cfg.trainer.cpus_per_rank:g} × {cfg.trainer.num_ranks} for the trainer{pool}); "
            f"the cluster has {capacity.cpus:g}"
        )
    if need.gpus > capacity.gpus + 1e-9:
        field_name, message = _gpu_error(cfg, need, capacity)
        errors.setdefault(field_name, message)
    for field_name, message in gpu_memory_errors(cfg, capacity.gpu_memory_bytes).items():
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
    for field_name, message in model_errors(cfg).items():
        errors.setdefault(field_name, message)
    if capacity is not None and not errors:
        # Past a limit the estimate can be astronomically large: the limit's message says enough.
        errors.update(capacity_errors(cfg, capacity))
    return errors
