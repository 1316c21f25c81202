"""Truncated sampling (top-k, top-p, min-p) for the torch backends, as vLLM does it.

`inference.top_k`, `inference.top_p` and `inference.min_p` cut the sampling distribution
down after the temperature, in vLLM's order (min_p, then top_k, then top_p on what is
left), and the token is drawn from the rest, renormalised. The behaviour logprob a
rollout carries is the sampled token's under that truncated distribution: the
probability that actually chose it, which is what vLLM returns as "processed_logprobs"
(workers/inference/vllm_backend.py). The trainer's pi_old and pi_theta stay the full
softmax; the truncated-IS weight pi_old/mu then sees a kept token's mu raised by the cut.

The filters are transformers' own logits warpers (the semantics vLLM and `generate`
share: ties with the k-th logit kept, the smallest nucleus reaching top_p, at least one
token always kept), composed here in vLLM's order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch

if TYPE_CHECKING:
    from workers.config.run_config import InferenceConfig


@dataclass(frozen=True)
class Truncation:
    """The sampling filters after the temperature; the defaults filter nothing."""

    top_k: int | None = None
    top_p: float = 1.0
    min_p: float = 0.0

    @classmethod
    def of(cls, cfg: InferenceConfig) -> Truncation:
        return cls(cfg.top_k, cfg.top_p, cfg.min_p)

    @property
    def active(self) -> bool:
        return self.top_k is not None or self.top_p < 1.0 or self.min_p > 0.0

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """`logits` (rows × vocabulary, already divided by the temperature) with the
        tokens the filters cut set to −inf; unchanged (the same tensor) when none is on."""
        if not self.active:
            return logits
        from transformers.generation.logits_process import MinPLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

        # The warpers read no input ids: they filter scores alone. (transformers annotates
        # them with the legacy LongTensor / FloatTensor types.)
        ids = cast(torch.LongTensor, torch.empty((logits.shape[0], 0), dtype=torch.long, device=logits.device))
        scores = cast(torch.FloatTensor, logits)
        if self.min_p > 0.0:
            scores = MinPLogitsWarper(self.min_p)(ids, scores)
        if self.top_k is not None:
            scores = TopKLogitsWarper(self.top_k)(ids, scores)
        if self.top_p < 1.0:
            scores = TopPLogitsWarper(self.top_p)(ids, scores)
        return scores
