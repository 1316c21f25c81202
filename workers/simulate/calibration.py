"""The published figures the cost models are checked against.

`SEED_GENERATION`: wall time of 512 rollouts of a fixed length on one H100, as Hugging
Face's blog post "Keep the Tokens Flowing: Lessons from 16 Open-Source RL Libraries"
(March 2026) published it: 7B ≈ 3 / 11 / 45 min and 32B ≈ 14 / 56 min / 3.7 h at 2K /
8K / 32K tokens. The table is linear
in length (a constant ~6.3K tok/s for 7B, ~1.2K for 32B); the decode roofline is not,
and `generation_seconds` says what it predicts for the same batch — or that it cannot
run on that GPU (`None`).
"""

from __future__ import annotations

import numpy as np

from workers.simulate.costs import H100, QWEN25_7B, QWEN25_32B, DecodeCost, Device, ModelShape

ROLLOUTS = 512
SEED_SOURCE = "Hugging Face, Keep the Tokens Flowing (Mar 2026): one H100, 512 rollouts"
# (model, completion tokens) → published seconds.
SEED_GENERATION: dict[tuple[ModelShape, int], float] = {
    (QWEN25_7B, 2048): 3 * 60,
    (QWEN25_7B, 8192): 11 * 60,
    (QWEN25_7B, 32768): 45 * 60,
    (QWEN25_32B, 2048): 14 * 60,
    (QWEN25_32B, 8192): 56 * 60,
    (QWEN25_32B, 32768): 3.7 * 3600,
}


def generation_seconds(
    model: ModelShape, tokens: int, rollouts: int = ROLLOUTS, device: Device = H100, prompt_tokens: int = 512
) -> float | None:
    """Predicted wall time of `rollouts` completions of `tokens` each on one GPU (one
    generate call, continuous batching); None when the weights and one sequence's KV
    cache do not fit on it."""
    decode = DecodeCost(model, device, 1, prompt_tokens)
    try:
        slots = decode.slots(tokens)
    except ValueError:
        return None
    return decode.call(np.full(rollouts, tokens, dtype=np.int64), slots).seconds


def kv_read_floor_seconds(model: ModelShape, tokens: int, rollouts: int = ROLLOUTS, device: Device = H100) -> float:
    """The least time decode can take on one GPU, whatever the batch: every step of every
    sequence reads its KV cache so far, at the GPU's full memory bandwidth."""
    per_sequence = model.kv_bytes_per_token() * tokens * (tokens + 1) / 2
    return rollouts * per_sequence / device.hbm_bytes_per_s
