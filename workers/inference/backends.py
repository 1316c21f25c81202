"""Choosing a backend: `make_backend` builds the one `inference.backend` names,
`make_torch_backend` the torch reference backend fit for a model and device.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from workers.core.devices import assigned_device
from workers.inference.sampling import Truncation
from workers.inference.torch_backend import TorchBackend, fast_path_problem
from workers.inference.transformers_backend import TransformersBackend
from workers.inference.vllm_backend import VLLMBackend, serves_lora
from workers.sync import vllm_transfer_engine

if TYPE_CHECKING:
    from workers.config.run_config import RunConfig
    from workers.inference.base import InferenceBackend


def make_backend(
    cfg: RunConfig,
    model_dir: str,
    scratch_dir: str | None = None,
    *,
    exact_steps: bool = False,
    max_model_len: int | None = None,
) -> InferenceBackend:
    """The backend named by `inference.backend`, loaded from `model_dir`; files it stages
    go under `scratch_dir` (the inference worker's part of the run's scratch).
    `exact_steps`: weights may change between two decode steps of a call (the stepped
    update modes, workers/rollout/partial_rollouts.py), so one engine step must be one decode step.
    `max_model_len`: the tokens one sequence of the run holds, which a vLLM engine sizes its
    KV cache for (the caller works it out, workers/rollout/context.py); None: the model's
    whole context. The torch backends allocate per call and take no such bound.

    vLLM itself is imported only when an engine is built (workers/inference/vllm_backend.py):
    it is heavy and absent from torch-only images.
    """
    if cfg.inference.backend == "torch":
        return make_torch_backend(
            model_dir,
            cfg.inference.dtype,
            Truncation.of(cfg.inference),
            record_routing=cfg.correction.keep_routing,
            keep_sampling_mask=cfg.correction.keep_sampling_mask,
        )
    if cfg.inference.backend == "vllm":
        # Adapter-only sync serves the adapters natively where vLLM has LoRA layers for
        # the architecture; elsewhere the receiver merges them and loads full weights.
        lora_rank = cfg.lora.rank if cfg.sync.protocol == "lora" and serves_lora(model_dir) else None
        return VLLMBackend(
            model_dir,
            cfg.inference,
            lora_rank=lora_rank,
            dtype=cfg.inference.dtype,
            exact_steps=exact_steps,
            scratch_dir=scratch_dir,
            max_model_len=max_model_len,
            record_routing=cfg.correction.keep_routing,
            transfer_engine=vllm_transfer_engine(
                cfg.placement.devices,
                cfg.placement.mode,
                cfg.sync.protocol,
                tensor_parallel_size=cfg.inference.tensor_parallel_size,
            ),
        )
    raise ValueError(f"unknown inference.backend {cfg.inference.backend!r}; choose 'torch' or 'vllm'")


def make_torch_backend(
    model_dir: str,
    dtype: str = "float32",
    truncation: Truncation | None = None,
    *,
    record_routing: bool = False,
    keep_sampling_mask: bool = False,
) -> InferenceBackend:
    """The torch backend for `model_dir`: the hand-written Llama loop where it can run the
    model (float32 on the CPU, fastest at the tiny sizes), else the model's own
    transformers forward, on the device this process was given and in `dtype`, sampling
    with `truncation` (top-k / top-p / min-p; none by default). `record_routing`: an MoE
    model's sessions record the experts each token was routed to (the hand-written loop
    runs dense Llama models only); `keep_sampling_mask`: each sampled token's kept set."""
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    device = assigned_device()
    if fast_path_problem(config) is None and dtype == "float32" and device.type == "cpu":
        return TorchBackend(model_dir, truncation, keep_sampling_mask)

    return TransformersBackend(
        model_dir,
        dtype=dtype,
        device=device,
        truncation=truncation,
        record_routing=record_routing,
        keep_sampling_mask=keep_sampling_mask,
    )
