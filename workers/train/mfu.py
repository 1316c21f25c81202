"""Model FLOPs utilisation: the model's training FLOPs per second over the device's peak.

The model's FLOPs of one training pass over a sequence of T tokens (Kaplan et al. 2020,
§2.1; Chowdhery et al. 2022, PaLM, appendix B), per token:

    6·N + 12·L·d_attn·T

- N: the parameters a token's matmuls use, counted on the instantiated model (so every
  architecture transformers builds is counted as it is built: gated or plain MLPs, fused
  or separate projections, biases). Embedding tables are lookups, not matmuls, and are
  left out, save the one that is also the LM head (tied embeddings: counted once, as the
  head). In a mixture of experts only the active experts count: the experts' parameters
  × k/E, with k the experts each token is routed to (`num_experts_per_tok`, ...) and E
  the experts of a layer (`num_local_experts`, `num_experts`, ...), read from the
  config's text part; shared experts and the router always count.
- 6 = 2 (forward: a multiply and an add per parameter) + 4 (backward: the gradients of
  the activations and of the weights). A frozen parameter (a LoRA base) gets no weight
  gradient: 4 instead of 6.
- 12·L·d_attn·T: the attention scores and their weighted sum (QKᵀ and AV, 2·T·d_attn
  each per token in the forward, ×3 with the backward), L layers, d_attn = query heads ×
  head dim, over the full T × T square (no saving for the causal mask or a sliding
  window, as PaLM and verl's FlopsCounter count it).

A step's FLOPs sum this over its sequences (prompt + completion), `ModelFlops.of_sequences`: the
FLOPs the model needs for them, not what the hardware ran: recomputation (gradient
checkpointing), the extra forwards (pi_old with several minibatches, the KL reference)
and padding are not counted, and computing each distinct prompt once saves work that is
still counted.

MFU = the step's FLOPs ÷ its wall time ÷ (the peak of one device × the devices). The
peak is the vendor's dense (no sparsity) tensor figure for the trainer's dtype
(`PEAKS`), found by the name `torch.cuda.get_device_name()` gives; a device not in the
table, or the CPU, has none and no MFU is reported, unless the operator names it in
ROLLWAY_PEAK_TFLOPS (one device's peak, TFLOP/s, for the dtype the trainer computes in).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, cast

import torch

PEAK_SETTING = "ROLLWAY_PEAK_TFLOPS"

# The config attributes that name a MoE's routed experts per token and its experts per
# layer, across the families transformers ships.
EXPERTS_PER_TOKEN = ("num_experts_per_tok", "moe_topk", "num_selected_experts", "top_k_experts")
EXPERTS_PER_LAYER = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


@dataclass(frozen=True)
class Peak:
    """One device's dense peak, TFLOP/s: bfloat16 tensor cores (fp32 accumulate), TF32
    tensor cores, and plain fp32 (CUDA cores)."""

    bf16: float
    tf32: float
    fp32: float


# From the vendors' datasheets, dense figures (the datasheets' starred ones are with
# 2:4 sparsity, twice these). AWS's A10G has no NVIDIA datasheet and the figures
# published for it disagree: it is left out (ROLLWAY_PEAK_TFLOPS names it).
_H100_SXM = Peak(bf16=989.5, tf32=494.5, fp32=67.0)  # H100 SXM5, H200 SXM and GH200 alike
_H100_NVL = Peak(bf16=835.5, tf32=417.5, fp32=60.0)  # H100 NVL, H200 NVL
PEAKS: tuple[tuple[str, Peak], ...] = (
    # (pattern on torch.cuda.get_device_name(), peak): the first that matches; the more
    # specific names before the families they belong to.
    (r"\bGH200\b", _H100_SXM),
    (r"\bH200 NVL\b", _H100_NVL),
    (r"\bH200\b", _H100_SXM),
    (r"\bH100 NVL\b", _H100_NVL),
    (r"\bH100\b.*\bPCIe\b", Peak(bf16=756.5, tf32=378.0, fp32=51.0)),
    (r"\bH100\b", _H100_SXM),  # "NVIDIA H100 80GB HBM3" is the SXM5 board
    (r"\bA100\b", Peak(bf16=312.0, tf32=156.0, fp32=19.5)),  # 40 and 80 GB, SXM4 and PCIe
    (r"\bL40S\b", Peak(bf16=362.05, tf32=183.0, fp32=91.6)),
    (r"\bL40\b", Peak(bf16=181.05, tf32=90.5, fp32=90.5)),
    (r"\bL4\b", Peak(bf16=121.0, tf32=60.0, fp32=30.3)),
    (r"\bA10\b", Peak(bf16=125.0, tf32=62.5, fp32=31.2)),
    (r"\bRTX 4090\b", Peak(bf16=165.2, tf32=82.6, fp32=82.6)),
    (r"\bRTX 3090\b", Peak(bf16=71.0, tf32=35.6, fp32=35.6)),
)


def lookup_peak(device_name: str) -> Peak | None:
    """The table's peak for a device named as `torch.cuda.get_device_name()` names it
    ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB"), or None for one not in it."""
    for pattern, peak in PEAKS:
        if re.search(pattern, device_name, re.IGNORECASE):
            return peak
    return None


def device_name(device: torch.device) -> str | None:
    """The name of the GPU `device` is, or None for the CPU (no peak is looked up)."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else None


def operator_peak(env: Any = os.environ) -> float | None:
    """ROLLWAY_PEAK_TFLOPS as FLOP/s, or None when unset."""
    raw = env.get(PEAK_SETTING, "").strip()
    if not raw:
        return None
    try:
        tflops = float(raw)
    except ValueError:
        tflops = 0.0
    if not tflops > 0 or tflops == float("inf"):
        raise ValueError(
            f"{PEAK_SETTING} must be one device's peak in TFLOP/s, a number > 0 (got {raw!r}); "
            "unset it to use the table of known devices"
        )
    return tflops * 1e12


def peak_flops(name: str | None, dtype: str, env: Any = os.environ) -> float | None:
    """One device's peak FLOP/s for a trainer computing in `dtype` ("bfloat16" or
    "float32") on the device named `name` (None: the CPU): the operator's
    ROLLWAY_PEAK_TFLOPS where set, else the table's (float32 at the TF32 figure when
    torch lets float32 matmuls use TF32, `torch.set_float32_matmul_precision`), else
    None: no MFU rather than a guess."""
    override = operator_peak(env)
    if override is not None:
        return override
    peak = lookup_peak(name) if name else None
    if peak is None:
        return None
    if dtype == "bfloat16":
        return peak.bf16 * 1e12
    return (peak.fp32 if torch.get_float32_matmul_precision() == "highest" else peak.tf32) * 1e12


def device_peak(device: torch.device, dtype: str) -> float | None:
    """`peak_flops` of the device a trainer computes on."""
    return peak_flops(device_name(device), dtype)


def _text_config(config: Any) -> Any:
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _first(config: Any, names: tuple[str, ...]) -> int | None:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


@dataclass(frozen=True)
class ModelFlops:
    """What a model's training FLOPs per token depend on (the module docstring's formula):
    `weight_flops` = Σ over active parameters of 6 (trained) or 4 (frozen), `layers` and
    `attn_width` (d_attn)."""

    weight_flops: float
    layers: int
    attn_width: int

    @classmethod
    def of(cls, model: torch.nn.Module) -> ModelFlops:
        """Counted on an instantiated model (any device, `meta` included; a LoRA
        wrapper's frozen base at 4, its adapter at 6)."""
        config = _text_config(model.config)
        top_k, experts = _first(config, EXPERTS_PER_TOKEN), _first(config, EXPERTS_PER_LAYER)
        expert_share = top_k / experts if top_k and experts and top_k < experts else 1.0
        head = cast(Any, model).get_output_embeddings()  # a transformers model, or peft's wrapper of one
        head_weight = head.weight if head is not None else None
        lookups = {
            id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding) and m.weight is not head_weight
        }
        total = 0.0
        for name, p in model.named_parameters():  # each shared tensor once
            if id(p) in lookups:
                continue
            share = expert_share if ".experts." in f".{name}" else 1.0
            total += (6 if p.requires_grad else 4) * p.numel() * share
        # A model with no attention heads in its config (a state-space model) has no
        # attention term.
        heads = getattr(config, "num_attention_heads", None) or 0
        head_dim = (getattr(config, "head_dim", None) or config.hidden_size // heads) if heads else 0
        return cls(total, int(getattr(config, "num_hidden_layers", 0) or 0), int(heads * head_dim))

    @classmethod
    def from_config(cls, config: Any) -> ModelFlops:
        """Counted on the model `config` builds, on the meta device (no memory, no
        weights), every parameter trained."""
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        return cls.of(model)

    def per_token(self, seq_len: int) -> float:
        """Training FLOPs of one token of a `seq_len`-token sequence."""
        return self.weight_flops + 12 * self.layers * self.attn_width * seq_len

    def of_sequences(self, lengths: list[int]) -> float:
        """Training FLOPs of one pass over sequences of these lengths."""
        return sum(t * self.per_token(t) for t in lengths)


def mfu(flops: float, seconds: float, peak: float, devices: int = 1) -> float:
    """The utilisation of `devices` devices of `peak` FLOP/s each that did `flops` in
    `seconds`."""
    return flops / seconds / (peak * devices)
