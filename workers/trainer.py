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
from workers.devices import assigned_device, autocast
from workers.logprobs import chosen_logprobs
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
    """log pi(target) under log_softmax(logits / temperature), (N, T-1), float32, on the
    model's device; with `with_entropy`, also the entropy of that distribution at each
    slot. Never holds a float32 copy of the full-vocabulary logits (workers.logprobs)."""
    device = next(model.parameters()).device
    logits = model(input_ids=batch.input_ids.to(device), attention_mask=batch.attention_mask.to(device)).logits
    # The last position predicts nothing: its dummy target keeps the logits contiguous
    # (slicing them to T-1 positions first would copy the whole tensor).
    targets = torch.nn.functional.pad(batch.targets.to(device), (0, 1))
    out = chosen_logprobs(logits, targets, temperature, with_entropy)
    if not with_entropy:
        return out[:, :-1]
    return out[0][:, :-1], out[1][:, :-1]


class Trainer:
    """Holds the policy and its optimizer; `version` counts completed steps.

    The model lives on the device this process was given (workers.devices) in float32:
    with `trainer.dtype` "bfloat16" the forward and backward run under bf16 autocast
    while weights, gradients and AdamW's moments stay float32 (mixed precision)."""

    def __init__(
        self, cfg: RunConfig, model_dir: str, num_threads: int | None = None, device: torch.device | None = None
    ) -> None:
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        self.cfg = cfg
        self.device = device if device is not None else assigned_device()
        torch.manual_seed(cfg.seed)
        model = load_model(model_dir).train()
        tc = cfg.trainer
        if tc.gradient_checkpointing:
            # Non-reentrant: works with frozen inputs (a LoRA base) and under autocast.
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.config.use_cache = False
        self.model = model.to(self.device)
        self.pad_id = self.model.config.pad_token_id or 0
        if cfg.lora.enabled:
            # Wrap before the optimizer: it must see only the adapter (the base is frozen).
            from workers.lora import apply_lora

            self.model = apply_lora(self.model, cfg.lora)
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

    def _logprobs(self, batch: PackedBatch, with_entropy: bool = False):
        with autocast(self.device, self.cfg.trainer.dtype):
            return token_logprobs(self.model, batch, self.cfg.inference.temperature, with_entropy)

    def _micro_batches(self, rows: torch.Tensor) -> list[torch.Tensor]:
        """`rows` cut into `trainer.micro_batch_rows`-row pieces (whole when unset)."""
        size = self.cfg.trainer.micro_batch_rows
        return [rows] if size is None or size >= len(rows) else list(rows.split(size))

    def train_step(self, groups: list[Group]) -> dict[str, float]:
        """One policy update on `groups`; returns metrics (workers/metric_names.py names)."""
        if not groups:
            raise ValueError("train_step needs at least one group")
        start = time.perf_counter()
        tc = self.cfg.trainer
        rollouts = [r for g in groups for r in g.rollouts]
        # Advantages per group (groups may differ in size, e.g. after filtering).
        advantages: list[float] = []
        for g in groups:
            rewards = torch.tensor([[r.reward for r in g.rollouts]], dtype=torch.float32)
            advantages += group_advantages(rewards)[0].tolist()

        dev = self.device
        batch = pack([r.prompt_ids for r in rollouts], [r.completion_ids for r in rollouts], self.pad_id)
        behaviour = spread([r.behaviour_logprobs for r in rollouts], batch).to(dev)
        # The slots the loss counts: completion tokens the model produced (a multi-turn
        # episode's tool tokens are out: workers/rollout.py).
        trained = (batch.mask & spread([r.trained for r in rollouts], batch, dtype=torch.bool)).to(dev)
        versions = [v for r in rollouts for v in r.model_versions]
        adv = torch.tensor(advantages, device=dev)[:, None].expand_as(behaviour)
        batch = PackedBatch(*(t.to(dev) for t in (batch.input_ids, batch.attention_mask, batch.targets, batch.mask)))

        def rows_of(rows: torch.Tensor, mask: torch.Tensor) -> PackedBatch:
            return PackedBatch(batch.input_ids[rows], batch.attention_mask[rows], batch.targets[rows], mask[rows])

        # Minibatches of whole groups, in a seeded shuffled order.
        row_of_group, row = [], 0
        for g in groups:
            row_of_group.append(list(range(row, row + len(g.rollouts))))
            row += len(g.rollouts)
        order = list(range(len(groups)))
        self._rng.shuffle(order)
        n_mb = min(tc.minibatches, len(groups))
        minibatch_rows = [
            torch.tensor([r for gi in order[k::n_mb] for r in row_of_group[gi]], device=dev) for k in range(n_mb)
        ]
        # pi_old, the policy at step start: the first minibatch's forward runs before any
        # update, so its logprobs, detached, are pi_old on its rows; only the other
        # minibatches' rows need a forward of their own (none with one minibatch).
        old_logp = torch.zeros(batch.mask.shape, device=dev)
        if n_mb > 1:
            with torch.no_grad():
                for micro in self._micro_batches(torch.cat(minibatch_rows[1:])):
                    old_logp[micro] = self._logprobs(rows_of(micro, batch.mask))
        losses, stats_acc, grad_norms = [], {}, []
        for k, rows in enumerate(minibatch_rows):
            self.optimizer.zero_grad(set_to_none=True)
            # The loss is a token mean over the minibatch: each micro-batch's own token
            # mean, weighted by its share of the tokens, sums to it (and so do the grads).
            total = trained[rows].sum().clamp(min=1)
            loss_sum, stats_mb = 0.0, {}
            for micro in self._micro_batches(rows):
                sub = rows_of(micro, trained)
                share = float(sub.mask.sum() / total)
                logp, entropy = self._logprobs(sub, with_entropy=True)
                loss, stats = correction_loss(
                    self.cfg.correction,
                    logp,
                    logp.detach() if k == 0 else old_logp[micro],
                    behaviour[micro],
                    adv[micro],
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
                (loss * share).backward()
                loss_sum += loss.item() * share
                for key, val in stats.items():
                    stats_mb[key] = stats_mb.get(key, 0.0) + val * share
            grad_norms.append(float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), tc.max_grad_norm)))
            self.optimizer.step()
            losses.append(loss_sum)
            for key, val in stats_mb.items():
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
