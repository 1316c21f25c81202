"""Proof that a sync worked: checksums of the weights a backend actually computes with.

`state_checksum` (workers.sync.base) on the trainer's side; here, the worker's side read
back out of the backend. TorchBackend keeps fused, transposed copies (qkv, gate_up);
splitting and transposing them back is pure copying, so equal checksums mean the
backend's weights are bit-identical to the trainer's.
"""

from __future__ import annotations

import torch

from workers.sync.base import state_checksum


def torch_backend_state_dict(backend) -> dict[str, torch.Tensor]:
    """TorchBackend's weights under Hugging Face checkpoint names (views, no copy)."""
    H, KV, hd = backend.num_heads, backend.num_kv_heads, backend.head_dim
    out = {
        "model.embed_tokens.weight": backend.embed,
        "model.norm.weight": backend.final_norm,
        "lm_head.weight": backend.lm_head,
    }
    for i, layer in enumerate(backend.layers):
        p = f"model.layers.{i}."
        split = [H * hd, KV * hd, KV * hd]
        q, k, v = layer.qkv.t().split(split)
        gate, up = layer.gate_up.t().chunk(2)
        out.update(
            {
                p + "input_layernorm.weight": layer.in_norm,
                p + "post_attention_layernorm.weight": layer.post_norm,
                p + "self_attn.q_proj.weight": q,
                p + "self_attn.k_proj.weight": k,
                p + "self_attn.v_proj.weight": v,
                p + "self_attn.o_proj.weight": layer.o.t(),
                p + "mlp.gate_proj.weight": gate,
                p + "mlp.up_proj.weight": up,
                p + "mlp.down_proj.weight": layer.down.t(),
            }
        )
        # The bias terms a checkpoint has (Qwen2's q, k, v; a Llama's attention_bias / mlp_bias).
        if layer.qkv_b is not None:
            out.update(zip([p + f"self_attn.{n}_proj.bias" for n in "qkv"], layer.qkv_b.split(split), strict=True))
        if layer.o_b is not None:
            out[p + "self_attn.o_proj.bias"] = layer.o_b
        if layer.gate_up_b is not None:
            out.update(zip([p + "mlp.gate_proj.bias", p + "mlp.up_proj.bias"], layer.gate_up_b.chunk(2), strict=True))
        if layer.down_b is not None:
            out[p + "mlp.down_proj.bias"] = layer.down_b
    if backend.tie:
        del out["lm_head.weight"]  # the checkpoint has no separate head when tied
    return out


def backend_checksum(backend) -> str:
    """sha256 of what `backend` holds, comparable with the trainer's `state_checksum`."""
    if hasattr(backend, "layers") and hasattr(backend, "embed"):
        return state_checksum(torch_backend_state_dict(backend))
    raise TypeError(f"no weight read-back for {type(backend).__name__}; checksum the receiver's staged weights instead")
