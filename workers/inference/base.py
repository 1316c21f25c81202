"""One interface for every inference backend (vLLM, torch reference)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[float]  # log-prob of each sampled token under the sampling policy
    finish_reason: str  # "stop" | "length"


class InferenceBackend(Protocol):
    """Generates completions with per-token logprobs and takes new weights.

    `generate` returns, for each prompt, `n` completions (prompt-major order). Sampling is
    plain temperature sampling (no top-k/top-p), stopping at `eos_id` or `max_new_tokens`.
    """

    def generate(
        self, prompts: list[list[int]], n: int, max_new_tokens: int, temperature: float, seed: int
    ) -> list[list[Completion]]: ...

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Full reload: replace every weight with the trainer's (checkpoint-format names)."""
        ...

    def close(self) -> None: ...
