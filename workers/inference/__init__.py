"""Inference backends behind one interface (workers.inference.base.InferenceBackend)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from workers.config import RunConfig
    from workers.inference.base import InferenceBackend


def make_backend(cfg: RunConfig, model_dir: str, scratch_dir: str | None = None) -> InferenceBackend:
    """The backend named by `inference.backend`, loaded from `model_dir`; files it stages
    go under `scratch_dir` (the worker's part of the run's scratch).

    vLLM is imported only when asked for: it is heavy and absent from torch-only images.
    """
    if cfg.inference.backend == "torch":
        from workers.inference.torch_backend import TorchBackend

        return TorchBackend(model_dir)
    if cfg.inference.backend == "vllm":
        from workers.inference.vllm_backend import VLLMBackend

        # Adapter-only sync serves the adapters natively; other protocols load full weights.
        lora_rank = cfg.lora.rank if cfg.sync.protocol == "lora" else None
        return VLLMBackend(
            model_dir,
            cfg.inference,
            lora_rank=lora_rank,
            exact_steps=cfg.sync.update_mode != "drain",
            scratch_dir=scratch_dir,
        )
    raise ValueError(f"unknown inference.backend {cfg.inference.backend!r}; choose 'torch' or 'vllm'")
