"""The data contract: one typed record from inference to loss.

A `Rollout` is one completion of one prompt. All completions of one prompt form a
`Group` (GRPO normalises advantages within it), and a group is the buffer's atomic
unit: trained whole or not at all.

A multi-turn episode (workers/rollout/episodes.py) is one rollout too: its model turns and the
environment's turns (tool results) interleave in `completion_ids`, and `loss_mask`
marks which tokens the model produced (1) and which the environment wrote (0). Only
model tokens are trained and counted:

- a tool token's `behaviour_logprobs` entry is a placeholder (0.0): the policy did not
  sample it, so it has no behaviour probability. The trainer never reads it (no loss,
  no importance weight, no mismatch KL);
- a tool token's `token_versions` entry is the version of the model turn whose call it
  answers (the weights that wrote the context it was appended to). Staleness counts
  model tokens only (`min_version`, the trainer's staleness metrics).

A single-turn rollout leaves `loss_mask` None: every completion token is the model's.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

# Rewards closer than this count as equal (math.isclose's relative tolerance, with an
# absolute floor for rewards at 0, as torch.isclose's atol).
REWARD_ATOL = 1e-8


@dataclass
class Rollout:
    prompt_ids: list[int]
    completion_ids: list[int]
    # log mu(token) under the behaviour policy that sampled it, one per completion token
    behaviour_logprobs: list[float]
    # policy version that produced each completion token (in-flight updates mix versions)
    token_versions: list[int]
    finish_reason: str  # "stop" (EOS) | "length" (token budget or turn limit)
    reward: float = 0.0
    group_id: str = ""
    # Room for the rest of the contract (Keep Routing / Keep Sampling Mask).
    expert_routing: Any | None = None
    sampling_mask: Any | None = None
    # 1 for a token the model produced, 0 for an environment (tool) token; None: all 1.
    loss_mask: list[int] | None = None
    # Each task.reward_funcs function's value ({} without them; None: not applicable).
    reward_parts: dict[str, float | None] = field(default_factory=dict)
    # Process credit (rewards.credit "process"): the reasoning steps the reward stage
    # scored, as the completion-token count at the end of each (increasing, the last one
    # the completion's length) and each step's score (the last one the final chunk's).
    # Empty for an outcome run: its advantages need only `reward`.
    step_ends: list[int] = field(default_factory=list)
    step_scores: list[float] = field(default_factory=list)
    # The agent whose turn this is in a multi-agent episode (workers/rollout/episode_scheduler.py):
    # advantages are normalised per agent within the group. "" for a single-agent task.
    agent: str = ""

    def __post_init__(self) -> None:
        if self.loss_mask is not None and len(self.loss_mask) != len(self.completion_ids):
            raise ValueError(
                f"Rollout.loss_mask has {len(self.loss_mask)} entries for {len(self.completion_ids)} "
                f"completion tokens: give one 0/1 per completion token, or None to train them all"
            )
        if len(self.step_ends) != len(self.step_scores):
            raise ValueError(
                f"Rollout.step_ends has {len(self.step_ends)} entries and step_scores {len(self.step_scores)}: "
                "give one score per step"
            )
        if self.step_ends and (
            self.step_ends[-1] != len(self.completion_ids)
            or any(b <= a for a, b in zip(self.step_ends, self.step_ends[1:], strict=False))
        ):
            raise ValueError(
                f"Rollout.step_ends {self.step_ends} must increase and end at the completion's "
                f"{len(self.completion_ids)} tokens"
            )

    @property
    def trained(self) -> list[bool]:
        """Per completion token: does the loss (and staleness) count it?"""
        if self.loss_mask is None:
            return [True] * len(self.completion_ids)
        return [bool(m) for m in self.loss_mask]

    @property
    def model_versions(self) -> list[int]:
        """Versions of the model's own tokens (tool tokens left out)."""
        if self.loss_mask is None:
            return self.token_versions
        return [v for v, m in zip(self.token_versions, self.loss_mask, strict=True) if m]

    @property
    def min_version(self) -> int:
        versions = self.model_versions
        return min(versions) if versions else 0


def call_seed(run_seed: int, worker: int, call: int) -> int:
    """The seed of inference worker `worker`'s `call`-th generate call in a run seeded
    `run_seed`: unique in a run of fewer than 1,000 workers each making fewer than 10**6
    calls. Its groups' ids derive from it (`group_id`)."""
    return run_seed * 10**9 + worker * 10**6 + call


def group_id(seed: int, index: int) -> str:
    """The id of the `index`-th group of a generate call seeded `seed`: unique in a run,
    and known before the group exists (what an inference worker's in-flight rows are
    kept under, workers/run/ledger.py)."""
    return f"{seed}-{index}"


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

    @property
    def uniform(self) -> bool:
        """Every reward equal (within REWARD_ATOL): GRPO's advantages are all zero, so the
        group teaches nothing (what dynamic sampling drops and reward/zero_std_frac counts).
        Under process credit the step scores are what is normalised: equal rewards with
        steps scored apart still teach, so every step score must be equal too."""
        rewards = [s for r in self.rollouts for s in (r.step_scores or [r.reward])]
        return all(math.isclose(r, rewards[0], abs_tol=REWARD_ATOL) for r in rewards[1:])

    def agent_parts(self) -> list[list[int]]:
        """The indices of the group's rollouts per agent, in order of first appearance
        (one part, every rollout, for a single-agent task): what GRPO's advantages are
        normalised within, since agents' rewards measure different things."""
        parts: dict[str, list[int]] = {}
        for i, r in enumerate(self.rollouts):
            parts.setdefault(r.agent, []).append(i)
        return list(parts.values())

    def to_json(self) -> dict[str, Any]:
        """The group as plain JSON data (a checkpoint's buffer.json); a routing record as
        its fields with the packed bytes in base64."""
        data = dataclasses.asdict(self)
        for rollout, out in zip(self.rollouts, data["rollouts"], strict=True):
            if rollout.expert_routing is not None:
                out["expert_routing"] = rollout.expert_routing.to_json()
            if rollout.sampling_mask is not None:
                out["sampling_mask"] = rollout.sampling_mask.to_json()
            # An outcome run's checkpoint stays as it was (from_json defaults them).
            for name in ("step_ends", "step_scores", "agent"):
                if not out[name]:
                    del out[name]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Group:
        # Imported here: both hold torch tensors, and this module is read where torch is
        # not (the buffer's accounting in the site's simulator).
        from workers.core.routing import RoutingRecord
        from workers.core.sampling_mask import SamplingMask

        rollouts = []
        for r in data["rollouts"]:
            routing, mask = r.get("expert_routing"), r.get("sampling_mask")
            rollouts.append(
                Rollout(
                    **{
                        **r,
                        "expert_routing": RoutingRecord.from_json(routing) if routing else None,
                        "sampling_mask": SamplingMask.from_json(mask) if mask else None,
                    }
                )
            )
        return cls(group_id=data["group_id"], prompt=data["prompt"], answer=data["answer"], rollouts=rollouts)
