"""The trainer: one GRPO step per batch of groups, on a Hugging Face Llama in torch.

A step computes pi_old (the policy's logprobs before any update, detached), then runs
`trainer.minibatches` AdamW updates on whole-group minibatches with the PPO-clip +
truncated-IS loss of workers.loss, and advances the policy version by one.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import torch

from workers.config import RunConfig
from workers.loss import correction_loss, group_advantages
from workers.model import checkpoint_state_dict, load_model
from workers.rollout import Group


@dataclass
class PackedBatch:
    """Prompt+completion rows, right-padded, laid out for next-token logprobs.

    Token j of a row's completion sits at `targets[row, len(prompt) - 1 + j]`; `mask`
    marks those slots. Per-token fields (behaviour logprobs, versions) share the layout.
    """

    input_ids: torch.Tensor  # (N, T)
    attention_mask: torch.Tensor  # (N, T)
    targets: torch.Tensor  # (N, T-1) = input_ids[:, 1:]
    mask: torch.Tensor  # (N, T-1) bool: completion tokens (train_step: the trained ones)


def pack(prompts: list[list[int]], completions: list[list[int]], pad_id: int) -> PackedBatch:
    """Right-pad prompt+completion rows (positions then match unpadded sequences)."""
    rows = [p + c for p, c in zip(prompts, completions, strict=True)]
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), pad_id, dtype=torch.long)
    attn = torch.zeros((len(rows), T), dtype=torch.long)
    mask = torch.zeros((len(rows), T - 1), dtype=torch.bool)
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        ids[i, : len(p) + len(c)] = torch.tensor(p + c, dtype=torch.long)
        attn[i, : len(p) + len(c)] = 1
        mask[i, len(p) - 1 : len(p) - 1 + len(c)] = True
    return PackedBatch(ids, attn, ids[:, 1:], mask)


def spread(values: list[list[float]], batch: PackedBatch, dtype=torch.float32) -> torch.Tensor:
    """Lay per-completion-token values into the (N, T-1) target layout (0 elsewhere)."""
    out = torch.zeros(batch.mask.shape, dtype=dtype)
    out[batch.mask] = torch.tensor([v for row in values for v in row], dtype=dtype)
    return out


def token_logprobs(model: torch.nn.Module, batch: PackedBatch, temperature: float, with_entropy: bool = False):
    """log pi(target) under log_softmax(logits / temperature), (N, T-1); with
    `with_entropy`, also the entropy of that distribution at each slot."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    logp = torch.log_softmax(logits[:, :-1].float() / temperature, dim=-1)
    picked = logp.gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1)
    if not with_entropy:
        return picked
    return picked, -(logp.exp() * logp).sum(-1)


class Trainer:
    """Holds the policy and its optimizer; `version` counts completed steps."""

    def __init__(self, cfg: RunConfig, model_dir: str, num_threads: int | None = None) -> None:
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        self.cfg = cfg
        torch.manual_seed(cfg.seed)
        self.model = load_model(model_dir).train()
        self.pad_id = self.model.config.pad_token_id or 0
        if cfg.lora.enabled:
            # Wrap before the optimizer: it must see only the adapter (the base is frozen).
            from workers.lora import apply_lora

            self.model = apply_lora(self.model, cfg.lora)
        tc = cfg.trainer
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad], lr=tc.lr, weight_decay=tc.weight_decay
        )
        self._rng = random.Random(cfg.seed)
        self.version = 0

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Current weights under HF checkpoint names (contiguous CPU copies); with LoRA,
        base and adapter merged (the policy the model computes)."""
        if self.cfg.lora.enabled:
            from workers.lora import effective_state_dict

            return {k: t.to("cpu").contiguous().clone() for k, t in effective_state_dict(self.model).items()}
        return checkpoint_state_dict(self.model)

    def train_step(self, groups: list[Group]) -> dict[str, float]:
        """One policy update on `groups`; returns metrics (workers/metric_names.py names)."""
        if not groups:
            raise ValueError("train_step needs at least one group")
        start = time.perf_counter()
        tc = self.cfg.trainer
        temperature = self.cfg.inference.temperature
        rollouts = [r for g in groups for r in g.rollouts]
        # Advantages per group (groups may differ in size, e.g. after filtering).
        advantages: list[float] = []
        for g in groups:
            rewards = torch.tensor([[r.reward for r in g.rollouts]], dtype=torch.float32)
            advantages += group_advantages(rewards)[0].tolist()

        batch = pack([r.prompt_ids for r in rollouts], [r.completion_ids for r in rollouts], self.pad_id)
        behaviour = spread([r.behaviour_logprobs for r in rollouts], batch)
        # The slots the loss counts: completion tokens the model produced (a multi-turn
        # episode's tool tokens are out: workers/rollout.py).
        trained = batch.mask & spread([r.trained for r in rollouts], batch, dtype=torch.bool)
        versions = [v for r in rollouts for v in r.model_versions]
        adv = torch.tensor(advantages)[:, None].expand_as(behaviour)

        # Minibatches of whole groups, in a seeded shuffled order.
        row_of_group, row = [], 0
        for g in groups:
            row_of_group.append(list(range(row, row + len(g.rollouts))))
            row += len(g.rollouts)
        order = list(range(len(groups)))
        self._rng.shuffle(order)
        n_mb = min(tc.minibatches, len(groups))
        minibatch_rows = [torch.tensor([r for gi in order[k::n_mb] for r in row_of_group[gi]]) for k in range(n_mb)]
        # pi_old, the policy at step start: the first minibatch's forward runs before any
        # update, so its logprobs, detached, are pi_old on its rows; only the other
        # minibatches' rows need a forward of their own (none with one minibatch).
        old_logp = torch.zeros(batch.mask.shape)
        if n_mb > 1:
            rest = torch.cat(minibatch_rows[1:])
            ids, attn, targets = batch.input_ids[rest], batch.attention_mask[rest], batch.targets[rest]
            others = PackedBatch(ids, attn, targets, batch.mask[rest])
            with torch.no_grad():
                old_logp[rest] = token_logprobs(self.model, others, temperature)
        losses, stats_acc, grad_norms = [], {}, []
        for k, rows in enumerate(minibatch_rows):
            sub = PackedBatch(batch.input_ids[rows], batch.attention_mask[rows], batch.targets[rows], trained[rows])
            logp, entropy = token_logprobs(self.model, sub, temperature, with_entropy=True)
            loss, stats = correction_loss(
                self.cfg.correction,
                logp,
                logp.detach() if k == 0 else old_logp[rows],
                behaviour[rows],
                adv[rows],
                sub.mask,
                tc.clip_eps,
                tc.tis_cap,
            )
            mean_entropy = (entropy * sub.mask).sum() / sub.mask.sum().clamp(min=1)
            stats["policy/entropy"] = mean_entropy.item()
            if tc.entropy_coef:
                # A small bonus keeps positions the policy has not solved from collapsing
                # onto one wrong token, where a group's samples agree and GRPO has no signal.
                loss = loss - tc.entropy_coef * mean_entropy
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norms.append(float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), tc.max_grad_norm)))
            self.optimizer.step()
            losses.append(loss.item())
            for key, val in stats.items():
                stats_acc[key] = stats_acc.get(key, 0.0) + val / n_mb

        staleness = [self.version - v for v in versions]
        self.version += 1
        metrics = {
            "loss": sum(losses) / len(losses),
            "reward/mean": sum(r.reward for r in rollouts) / len(rollouts),
            "staleness/mean": sum(staleness) / max(len(staleness), 1),
            "staleness/max": float(max(staleness, default=0)),
            # In-flight updates mix versions inside one sequence, and so do updates
            # between the turns of an episode; otherwise a sequence has one version.
            "rollout/mixed_version_frac": sum(len(set(r.model_versions)) > 1 for r in rollouts) / len(rollouts),
            "trainer/grad_norm": sum(grad_norms) / len(grad_norms),
            "policy/version": float(self.version),
            **stats_acc,
        }
        metrics["trainer/step_s"] = time.perf_counter() - start
        return metrics
