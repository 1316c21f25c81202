"""The data contract: one typed record from inference to loss.

A `Rollout` is one completion of one prompt. All completions of one prompt form a
`Group` (GRPO normalises advantages within it), and a group is the buffer's atomic
unit: trained whole or not at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Rollout:
    prompt_ids: list[int]
    completion_ids: list[int]
    # log mu(token) under the behaviour policy that sampled it, one per completion token
    behaviour_logprobs: list[float]
    # policy version that produced each completion token (in-flight updates mix versions)
    token_versions: list[int]
    finish_reason: str  # "stop" (EOS) | "length"
    reward: float = 0.0
    group_id: str = ""
    # Room for the rest of the contract (Keep Routing / Keep Sampling Mask).
    expert_routing: Any | None = None
    sampling_mask: Any | None = None

    @property
    def min_version(self) -> int:
        return min(self.token_versions) if self.token_versions else 0


@dataclass
class Group:
    group_id: str
    prompt: str
    answer: str
    rollouts: list[Rollout] = field(default_factory=list)

    @property
    def min_version(self) -> int:
        return min(r.min_version for r in self.rollouts)

    @property
    def num_tokens(self) -> int:
        return sum(len(r.completion_ids) for r in self.rollouts)
