"""The trainer: one GRPO step per batch of groups, on a Hugging Face causal LM in torch.

A step computes the batch's advantages (`trainer.advantage_scaling`; with
`rewards.credit` "process", one per token from the rollouts' step scores), masks truncated
completions out of the loss if asked (`trainer.mask_truncated`), computes pi_old (the
policy's logprobs before any update, detached), then runs `trainer.minibatches` AdamW
updates on whole-group minibatches with the PPO-clip + truncated-IS loss of
workers.train.loss (aggregated as `trainer.loss_aggregation` says, plus the KL penalty to the
frozen reference policy when `trainer.kl_coef` > 0), and advances the policy version by one.
Each forward runs every distinct prompt once and scores completion slots only
(workers/train/shared_prefix.py) where that computes what a padded forward would.

One process (`trainer.backend` "single") or a pool of ranks (workers/train/trainer_pool.py):
the step is planned once (workers/train/step_plan.py: minibatches, and each rank's share of
them), every rank runs its share (`train_rank`), and the ranks' partial sums make the
step's metrics (`step_metrics`). With one rank the plan is the whole batch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch

from workers.config.run_config import RunConfig
from workers.core.devices import assigned_device, autocast
from workers.core.metric_names import rank_series
from workers.core.records import Group, Rollout
from workers.core.routing import Agreement, Replay, batch_routing
from workers.core.sampling_mask import KeptLayout
from workers.model.loading import checkpoint_state_dict, load_model
from workers.model.logprobs import chosen_logprobs
from workers.model.lora import apply_lora, base_model_of, effective_live_state, effective_state_dict
from workers.sync.lora import base_checksum
from workers.train.batch_stats import batch_metrics
from workers.train.loss import Aggregation, correction_loss, process_advantages, scaled_advantages
from workers.train.mfu import ModelFlops, device_peak, mfu
from workers.train.offload import OptimizerOffload
from workers.train.shared_prefix import completion_view
from workers.train.step_plan import RankStep, plan_step
from workers.train.trainer_pool import busy_seconds

if TYPE_CHECKING:
    from workers.train.trainer_pool import Pool


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
    # correction.keep_routing: the experts generation chose, (N, T, layers, top_k).
    routing: torch.Tensor | None = None
    # correction.keep_sampling_mask: each completion token's kept set, by position.
    kept: KeptLayout | None = None
    # (N,) each row's prompt length: what workers.train.shared_prefix needs to run each
    # distinct prompt once (None: only the padded forward).
    prompt_lengths: torch.Tensor | None = None


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
    lengths = torch.tensor([len(p) for p in prompts], dtype=torch.long)
    return PackedBatch(ids, attn, ids[:, 1:], mask, prompt_lengths=lengths)


def spread(values: Sequence[Sequence[float]], batch: PackedBatch, dtype=torch.float32) -> torch.Tensor:
    """Lay per-completion-token values into the (N, T-1) target layout (0 elsewhere)."""
    out = torch.zeros(batch.mask.shape, dtype=dtype)
    out[batch.mask] = torch.tensor([v for row in values for v in row], dtype=dtype)
    return out


def token_logprobs(
    model: torch.nn.Module,
    batch: PackedBatch,
    temperature: float,
    with_entropy: bool = False,
    replay: Replay | None = None,
    share_prompts: bool = False,
):
    """log pi(target) under log_softmax(logits / temperature), (N, T-1), float32, on the
    model's device; with `with_entropy`, also the entropy of that distribution at each
    slot. Never holds a float32 copy of the full-vocabulary logits (workers.model.logprobs).
    With `replay` (hooked on `model`'s routers) the forward takes the batch's recorded
    routing; with the batch's `kept` sets the softmax is over each token's kept set.

    `share_prompts` (valid only as `Trainer.share_prompts` says): each distinct prompt
    runs once and only completion slots get logits (workers.train.shared_prefix); every other
    slot is then 0, where the padded forward gives the prompt's own logprobs."""
    device = next(model.parameters()).device
    if share_prompts and batch.prompt_lengths is not None and replay is None:
        view = completion_view(model, batch.input_ids.to(device), batch.attention_mask.to(device), batch.prompt_lengths)
        if view is not None:
            width = batch.targets.shape[1]
            kept = batch.kept.in_completions(view.logits.shape[1]) if batch.kept is not None else None
            out = chosen_logprobs(view.logits, view.targets, temperature, with_entropy, kept)
            if isinstance(out, tuple):
                return view.spread(out[0], width), view.spread(out[1], width)
            return view.spread(out, width)
    with replay.use(batch.routing) if replay is not None else contextlib.nullcontext():
        logits = model(input_ids=batch.input_ids.to(device), attention_mask=batch.attention_mask.to(device)).logits
    # The last position predicts nothing: its dummy target keeps the logits contiguous
    # (slicing them to T-1 positions first would copy the whole tensor).
    targets = torch.nn.functional.pad(batch.targets.to(device), (0, 1))
    out = chosen_logprobs(logits, targets, temperature, with_entropy, batch.kept)
    if isinstance(out, tuple):  # with_entropy
        return out[0][:, :-1], out[1][:, :-1]
    return out[:, :-1]


@dataclass
class RowTensors:
    """A rank's rows of one step on its device: the packed batch and, in its (N, T-1)
    layout, the behaviour logprobs, the trained-token mask and the advantages."""

    batch: PackedBatch
    behaviour: torch.Tensor
    trained: torch.Tensor
    advantages: torch.Tensor

    def select(self, rows: torch.Tensor, mask: torch.Tensor) -> PackedBatch:
        """The batch's `rows`, with `mask` (the completion or the trained slots) on them."""
        b = self.batch
        return PackedBatch(
            b.input_ids[rows],
            b.attention_mask[rows],
            b.targets[rows],
            mask[rows],
            b.routing[rows.cpu()] if b.routing is not None else None,
            b.kept.select(rows.cpu()) if b.kept is not None else None,
            b.prompt_lengths[rows.cpu()] if b.prompt_lengths is not None else None,
        )


@dataclass
class RankRows:
    """A rank's part of one step: how many rows, each minibatch's row indices, and the
    rows' tensors (None for a rank without rows, which joins the collectives with empty
    passes)."""

    count: int
    minibatches: list[torch.Tensor]
    tensors: RowTensors | None

    def need(self) -> RowTensors:
        if self.tensors is None:
            raise RuntimeError("this rank has no rows in this step")
        return self.tensors


@dataclass
class RankResult:
    """One rank's part of a step, as the step's metrics need it: per minibatch, its loss
    and loss statistics already weighted by its share of the minibatch's trained tokens
    (summed over the ranks they are the minibatch's token means); and where its time went."""

    loss_sums: list[float]
    stats: list[dict[str, float]]
    grad_norms: list[float]
    step_s: float = 0.0  # wall time of its part
    comm_s: float = 0.0  # of which at least one collective was in flight
    comm_bytes: int = 0  # payload of the collectives it issued since its previous part
    rows: int = 0  # completions it trained on
    extra: dict[str, float] = field(default_factory=dict)
    # Keep Routing: token × layer selections replayed, and how many of them the
    # trainer's own router would have made too (routing/agreement).
    routing_counted: int = 0
    routing_agreed: int = 0


class TrainerProgress:
    """Where a trainer is in its run, besides its weights and optimizer: `version`, the
    steps completed (the policy version), and `plan_rng`, the seeded RNG that shuffles
    each step's minibatches (workers/train/step_plan.py). Its `state_dict` also holds this
    process's torch RNG states, which the trainer seeded: a resumed run draws on as the
    uninterrupted one would."""

    def __init__(self, seed: int) -> None:
        self.version = 0
        self.plan_rng = random.Random(seed)

    def state_dict(self) -> dict[str, Any]:
        """Version and RNG states (a checkpoint's trainer.pt, which torch.save writes)."""
        state: dict[str, Any] = {
            "version": self.version,
            "torch_rng": torch.get_rng_state(),
            "python_rng": self.plan_rng.getstate(),
        }
        if torch.cuda.is_available():
            state["cuda_rng"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take a `state_dict`'s version and RNG states (other keys are not read)."""
        self.version = int(state["version"])
        torch.set_rng_state(state["torch_rng"])
        if "cuda_rng" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        self.plan_rng.setstate(state["python_rng"])


class Trainer:
    """Holds the policy and its optimizer; `version` counts completed steps.

    The model lives on the device this process was given (workers.core.devices) in float32:
    with `trainer.dtype` "bfloat16" the forward and backward run under bf16 autocast
    while weights, gradients and AdamW's moments stay float32 (mixed precision).

    `pool` (workers/train/trainer_pool.py): this process is one rank of a trainer pool. Then
    `model` is the policy as this rank holds it (a whole replica for ddp, sharded in
    place for fsdp2) and `forward_model` what a step runs through (the DDP wrapper, or
    the sharded model itself)."""

    def __init__(
        self,
        cfg: RunConfig,
        model_dir: str,
        num_threads: int | None = None,
        device: torch.device | None = None,
        pool: Pool | None = None,
    ) -> None:
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        self.cfg = cfg
        self.model_dir = model_dir  # the policy's config and tokenizer, which checkpoints carry
        self.device = device if device is not None else assigned_device()
        torch.manual_seed(cfg.seed)
        tc = cfg.trainer
        model = load_model(model_dir, dropout=not tc.disable_dropout).train()
        if tc.gradient_checkpointing:
            # Non-reentrant: works with frozen inputs (a LoRA base) and under autocast.
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.config.use_cache = False
        self.model = model.to(self.device)
        self.pad_id = self.model.config.pad_token_id or 0
        if cfg.lora.enabled:
            # Wrap before the optimizer: it must see only the adapter (the base is frozen).
            self.model = apply_lora(self.model, cfg.lora)
        self.pool = pool
        # Counted before a pool shards the model in place; the peak of this process's
        # device stands for every rank's (a pool's ranks are alike).
        self.flops = ModelFlops.of(self.model)
        self.peak_flops = device_peak(self.device, tc.dtype)
        # Once sharded no rank holds the whole LoRA base, whose checksum adapter-only
        # sync publishes: take it now.
        self.base_checksum: str | None = None
        if pool is not None and pool.sharded and cfg.lora.enabled:
            self.base_checksum = base_checksum(self.model)
        self.forward_model = pool.wrap(self.model) if pool is not None else self.model
        # The KL penalty's reference: the initial policy, frozen. With LoRA it is the base,
        # the policy with its adapter switched off (peft's disable_adapter): no copy.
        # Otherwise a copy of the initial weights, whole on every rank (never sharded:
        # its forward is then no collective, and an empty pass need not join one).
        self.ref_model: torch.nn.Module | None = None
        if tc.kl_coef and not cfg.lora.enabled:
            ref: torch.nn.Module = load_model(model_dir)
            self.ref_model = ref.to(self.device).requires_grad_(False)
        self.aggregation = Aggregation.of(tc, cfg.inference.max_new_tokens)
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad], lr=tc.lr, weight_decay=tc.weight_decay
        )
        # Colocated, taking turns (workers/run/colocation.py): the optimizer state lives in
        # host memory while the GPU's vLLM generates, and comes back for the step only.
        self.offload = (
            OptimizerOffload(self.optimizer) if cfg.inference.sleep_level > 0 and self.device.type == "cuda" else None
        )
        self.progress = TrainerProgress(cfg.seed)
        # Keep Routing: hooks on the policy's routers for the trainer's life, forcing a
        # forward's routing only while a batch's record is set (token_logprobs).
        self.replay: Replay | None = None
        if cfg.correction.keep_routing:
            self.replay = Replay(self.model).__enter__()
        # Each distinct prompt once per forward (workers.train.shared_prefix), where a row's
        # forward depends on its own tokens alone: no dropout (the model's, or LoRA's
        # own, which disable_dropout leaves as lora.dropout sets it), no routing replayed,
        # gradient checkpointing off (it turns off the KV cache), and one process (a DDP
        # or sharded wrapper expects one forward per backward).
        lora_dropout = cfg.lora.enabled and cfg.lora.dropout > 0
        self.share_prompts = (
            tc.disable_dropout
            and not lora_dropout
            and self.replay is None
            and not tc.gradient_checkpointing
            and pool is None
        )

    @property
    def version(self) -> int:
        """Steps completed: the version of the policy the trainer holds."""
        return self.progress.version

    @version.setter
    def version(self, version: int) -> None:
        self.progress.version = version

    @property
    def world_size(self) -> int:
        return self.pool.world_size if self.pool is not None else 1

    @property
    def sharded(self) -> bool:
        return self.pool is not None and self.pool.sharded

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Current weights under HF checkpoint names (contiguous CPU copies); with LoRA,
        base and adapter merged (the policy the model computes). Sharded (fsdp2): a
        collective every rank calls, gathering the whole policy into each rank's host
        memory (tests compare it; a run's checksum, export, checkpoints and weight sync
        gather a module or a bucket at a time: workers/sync/weights.py)."""
        if self.sharded:
            full = effective_live_state(self.gathered_state(), self.model)
            return {k: t.contiguous().clone() for k, t in full.items()}
        if self.cfg.lora.enabled:
            return {k: t.to("cpu").contiguous().clone() for k, t in effective_state_dict(self.model).items()}
        return checkpoint_state_dict(self.model)

    def gathered_state(self) -> dict[str, torch.Tensor]:
        """A sharded model's whole state dict under its live names, gathered into host
        memory (a collective every rank calls; ranks 1.. get an empty dict)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return cast(dict[str, torch.Tensor], state)

    def _logprobs(self, batch: PackedBatch, with_entropy: bool = False):
        with autocast(self.device, self.cfg.trainer.dtype):
            return token_logprobs(
                self.forward_model,
                batch,
                self.cfg.inference.temperature,
                with_entropy,
                self.replay,
                share_prompts=self.share_prompts,
            )

    def _ref_logprobs(self, batch: PackedBatch) -> torch.Tensor:
        """log pi_ref(target) of the frozen reference policy (no gradient)."""
        with torch.no_grad(), autocast(self.device, self.cfg.trainer.dtype):
            if self.ref_model is not None:
                # A model of its own (not hooked): the reference routes as it would.
                return token_logprobs(
                    self.ref_model, batch, self.cfg.inference.temperature, share_prompts=self.share_prompts
                )

            # Through the model, not a DDP wrapper: a replica's forward is then no
            # collective; a sharded (fsdp2) one's is, and an empty pass joins it.
            with base_model_of(self.model):
                return token_logprobs(
                    self.model,
                    batch,
                    self.cfg.inference.temperature,
                    replay=self.replay,
                    share_prompts=self.share_prompts,
                )

    def _pieces(self, rows: torch.Tensor, passes: int) -> list[torch.Tensor]:
        """`rows` cut into `trainer.micro_batch_rows`-row pieces (whole when unset), then
        empty ones up to `passes`: every rank of a pool runs the same number."""
        size = self.cfg.trainer.micro_batch_rows
        pieces = [rows] if size is None or size >= len(rows) else list(rows.split(size))
        pieces = [p for p in pieces if len(p)]
        return pieces + [rows[:0]] * (passes - len(pieces))

    def _empty_pass(self, backward: bool) -> None:
        """A pass that moves nothing: a rank with no rows in a micro-batch still joins
        its collectives (a sharded forward's all-gathers, the backward's gradient sync)."""
        ids = torch.full((1, 2), self.pad_id, dtype=torch.long, device=self.device)
        with autocast(self.device, self.cfg.trainer.dtype):
            logits = self.forward_model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
        if backward and self.cfg.trainer.kl_coef:
            # The reference's forward, after the policy's as in a full pass (`_loss`): a
            # collective for a sharded LoRA base.
            attn = torch.ones_like(ids)
            self._ref_logprobs(PackedBatch(ids, attn, ids[:, 1:], torch.zeros_like(ids[:, 1:], dtype=torch.bool)))
        if backward:
            (logits.float().sum() * 0.0).backward()

    def _gradient_sync(self, last: bool):
        """A pool syncs gradients on a minibatch's last backward only; the earlier ones
        accumulate locally."""
        return self.pool.gradient_sync(self.forward_model, last) if self.pool is not None else contextlib.nullcontext()

    def plan(self, groups: list[Group]) -> list[RankStep]:
        """Each rank's part of a step on `groups` (workers/train/step_plan.py), with their
        advantages (over the whole batch) and truncated completions masked out when
        `trainer.mask_truncated`; advances the shuffle RNG, so only the process that runs
        the step plans it."""
        tc = self.cfg.trainer
        token_advantages = None
        if self.cfg.rewards.credit == "process":
            token_advantages = process_advantages(
                [[steps_of(r) for r in g.rollouts] for g in groups], tc.advantage_scaling
            )
            # A rollout's own figure (what per-rollout consumers see): its first token's,
            # the sum of all its normalised step scores.
            advantages = [[a[0] if a else 0.0 for a in g] for g in token_advantages]
        else:
            advantages = agent_advantages(groups, tc.advantage_scaling)
        if tc.mask_truncated:
            groups = [without_truncated(g) for g in groups]
        return plan_step(
            groups,
            advantages,
            self.progress.plan_rng,
            tc.minibatches,
            self.world_size,
            tc.micro_batch_rows,
            token_advantages,
        )

    def train_step(self, groups: list[Group], peers: Peers | None = None) -> dict[str, float]:
        """One policy update on `groups`; returns metrics (workers/core/metric_names.py names).
        In a pool this process is rank 0 and `peers` runs the other ranks' parts."""
        if not groups:
            raise ValueError("train_step needs at least one group")
        start = time.perf_counter()
        steps = self.plan(groups)
        if peers is not None:
            peers.start(steps[1:])
        results = [self.train_rank(steps[0])]
        if peers is not None:
            results += peers.results()
        return self.step_metrics(groups, results, start)

    def train_rank(self, step: RankStep) -> RankResult:
        """This rank's part of a step: pi_old, then one AdamW update per minibatch."""
        t_start = time.perf_counter()
        if self.replay is not None:
            self.replay.agreement = Agreement()
        rows = self._rank_rows(step)
        old_logp = self._old_logprobs(rows, step.old_micro_batches)
        loss_sums, stats_list, grad_norms = [], [], []
        if self.offload is not None:
            self.offload.load(self.device)
        for k, minibatch in enumerate(rows.minibatches):
            units = step.trained_tokens[k] if self.aggregation.mode == "token_mean" else step.trained_rows[k]
            loss_sum, stats, grad_norm = self._update(
                rows, minibatch, old_logp, k == 0, step.trained_tokens[k], units, step.micro_batches[k]
            )
            loss_sums.append(loss_sum)
            stats_list.append(stats)
            grad_norms.append(grad_norm)
        if self.offload is not None:
            self.optimizer.zero_grad(set_to_none=True)  # the next step starts from none anyway
            self.offload.offload(self.device)
        self.version += 1
        end = time.perf_counter()
        result = RankResult(loss_sums, stats_list, grad_norms, step_s=end - t_start, rows=rows.count)
        if self.replay is not None:
            result.routing_counted = self.replay.agreement.counted
            result.routing_agreed = self.replay.agreement.agreed
        if self.pool is not None:
            result.comm_bytes, intervals = self.pool.meter.drain()
            result.comm_s = busy_seconds(intervals, t_start, end)
        return result

    def _rank_rows(self, step: RankStep) -> RankRows:
        """This rank's groups as rows on its device, with their advantages (computed with
        the plan, over the whole batch) and each minibatch's rows."""
        dev = self.device
        rollouts = [r for g in step.groups for r in g.rollouts]
        advantages = [a for group in step.advantages for a in group]
        tensors = None
        if rollouts:
            batch = pack([r.prompt_ids for r in rollouts], [r.completion_ids for r in rollouts], self.pad_id)
            behaviour = spread([r.behaviour_logprobs for r in rollouts], batch).to(dev)
            # The slots the loss counts: completion tokens the model produced (a multi-turn
            # episode's tool tokens are out: workers/core/records.py).
            trained = (batch.mask & spread([r.trained for r in rollouts], batch, dtype=torch.bool)).to(dev)
            if step.token_advantages is None:
                adv = torch.tensor(advantages, device=dev)[:, None].expand_as(behaviour)
            else:  # process credit: each token its own (the loss takes them per token either way)
                adv = spread([a for group in step.token_advantages for a in group], batch).to(dev)
            on_device = PackedBatch(
                batch.input_ids.to(dev),
                batch.attention_mask.to(dev),
                batch.targets.to(dev),
                batch.mask.to(dev),
                self._routing(rollouts, batch),
                self._kept(rollouts, batch),
                batch.prompt_lengths,
            )
            tensors = RowTensors(on_device, behaviour, trained, adv)
        row_of_group: list[list[int]] = []
        row = 0
        for g in step.groups:
            row_of_group.append(list(range(row, row + len(g.rollouts))))
            row += len(g.rollouts)
        minibatches = [
            torch.tensor([r for gi in mb for r in row_of_group[gi]], dtype=torch.long, device=dev)
            for mb in step.minibatches
        ]
        return RankRows(len(rollouts), minibatches, tensors)

    def _routing(self, rollouts: list[Rollout], batch: PackedBatch) -> torch.Tensor | None:
        """The rows' recorded routing in the batch's layout (correction.keep_routing), on
        the CPU: the replay hook moves each router's slice where its logits are."""
        if self.replay is None:
            return None

        layers, top_k = self.replay.layers, self.replay.top_k
        lengths = [len(r.prompt_ids) + len(r.completion_ids) for r in rollouts]
        records = [r.expert_routing for r in rollouts]
        return batch_routing(records, lengths, batch.input_ids.shape[1], layers, top_k)

    def _kept(self, rollouts: list[Rollout], batch: PackedBatch) -> KeptLayout | None:
        """Each row's sampling mask placed at its completion's positions
        (correction.keep_sampling_mask); None when off or nothing was recorded."""
        if not self.cfg.correction.keep_sampling_mask or all(r.sampling_mask is None for r in rollouts):
            return None

        starts = [len(r.prompt_ids) - 1 for r in rollouts]
        return KeptLayout([r.sampling_mask for r in rollouts], starts, batch.input_ids.shape[1])

    def _old_logprobs(self, rows: RankRows, passes: int) -> torch.Tensor:
        """pi_old, the policy at step start, on the rows of minibatches after the first
        (zeros elsewhere; empty for a rank without rows). The first minibatch's forward
        runs before any update, so its logprobs, detached, are pi_old on its rows: only
        the other minibatches' rows need a forward of their own (none with one)."""
        shape = rows.tensors.batch.mask.shape if rows.tensors is not None else (0,)
        old_logp = torch.zeros(shape, device=self.device)
        if passes:
            later = torch.cat(rows.minibatches[1:])
            with torch.no_grad():
                for micro in self._pieces(later, passes):
                    if len(micro):
                        t = rows.need()
                        old_logp[micro] = self._logprobs(t.select(micro, t.batch.mask))
                    else:
                        self._empty_pass(backward=False)
        return old_logp

    def _update(
        self,
        rows: RankRows,
        minibatch: torch.Tensor,
        old_logp: torch.Tensor,
        first: bool,
        trained_tokens: int,
        units: int,
        passes: int,
    ) -> tuple[float, dict[str, float], float]:
        """One AdamW update on `minibatch` (row indices), in `passes` micro-batches;
        returns this rank's share of its loss and statistics, and the gradient norm.
        `first`: the step's first minibatch, whose own logprobs are pi_old. `units`: the
        minibatch's trained tokens, or its trained sequences for a per-sequence
        aggregation (`Aggregation.units`), on all ranks."""
        self.optimizer.zero_grad(set_to_none=True)
        # The loss aggregates over the minibatch, all ranks: each micro-batch's own
        # aggregate, weighted by its share of the units (tokens for a token mean,
        # sequences else), sums to it (and so do the grads); the statistics are token
        # means, weighted by the share of the tokens. A pool averages gradients over its
        # ranks: × world undoes that.
        total, total_units = max(trained_tokens, 1), max(units, 1)
        loss_sum, stats_mb = 0.0, dict[str, float]()
        pieces = self._pieces(minibatch, passes)
        for i, micro in enumerate(pieces):
            with self._gradient_sync(last=i == len(pieces) - 1):
                if not len(micro):
                    self._empty_pass(backward=True)
                    continue
                t = rows.need()
                sub = t.select(micro, t.trained)
                share = float(sub.mask.sum() / total)
                loss_share = (
                    share if self.aggregation.mode == "token_mean" else self.aggregation.units(sub.mask) / total_units
                )
                loss, stats = self._loss(sub, t, micro, None if first else old_logp)
                (loss * (loss_share * self.world_size)).backward()
            loss_sum += loss.item() * loss_share
            for key, val in stats.items():
                stats_mb[key] = stats_mb.get(key, 0.0) + val * share
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.trainer.max_grad_norm)
        grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        self.optimizer.step()
        return loss_sum, stats_mb, grad_norm

    def _loss(
        self, sub: PackedBatch, rows: RowTensors, micro: torch.Tensor, old_logp: torch.Tensor | None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The policy loss of micro-batch `sub` (rows `micro`) and its statistics; pi_old
        is `old_logp` on those rows, or (None) the micro-batch's own logprobs, detached."""
        tc = self.cfg.trainer
        logp, entropy = self._logprobs(sub, with_entropy=True)
        loss, stats = correction_loss(
            tc,
            self.cfg.correction,
            logp,
            logp.detach() if old_logp is None else old_logp[micro],
            rows.behaviour[micro],
            rows.advantages[micro],
            sub.mask,
            aggregation=self.aggregation,
            ref_logp=self._ref_logprobs(sub) if tc.kl_coef else None,
        )
        mean_entropy = (entropy * sub.mask).sum() / sub.mask.sum().clamp(min=1)
        stats["policy/entropy"] = mean_entropy.item()
        if tc.entropy_coef:
            # A small bonus keeps positions the policy has not solved from collapsing
            # onto one wrong token, where a group's samples agree and GRPO has no signal.
            loss = loss - tc.entropy_coef * mean_entropy
        return loss, stats

    def step_metrics(self, groups: list[Group], results: list[RankResult], start: float) -> dict[str, float]:
        """The step's metrics from every rank's part (`results`, rank 0 first)."""
        rollouts = [r for g in groups for r in g.rollouts]
        n_mb = len(results[0].loss_sums)
        losses = [sum(res.loss_sums[k] for res in results) for k in range(n_mb)]
        stats_acc: dict[str, float] = {}
        for k in range(n_mb):
            merged: dict[str, float] = {}
            for res in results:
                for key, val in res.stats[k].items():
                    merged[key] = merged.get(key, 0.0) + val
            for key, val in merged.items():
                stats_acc[key] = stats_acc.get(key, 0.0) + val / n_mb
        grad_norms = results[0].grad_norms  # the same on every rank: gradients are synced
        versions = [v for r in rollouts for v in r.model_versions]
        staleness = [self.version - 1 - v for v in versions]
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
            "trainer/lr": self.optimizer.param_groups[0]["lr"],
            **batch_metrics(groups),
            **stats_acc,
        }
        counted = sum(res.routing_counted for res in results)
        if counted:  # keep_routing, and some rollout carried a record
            metrics["routing/agreement"] = sum(res.routing_agreed for res in results) / counted
        if self.pool is not None:
            for r, res in enumerate(results):
                metrics[rank_series("trainer/rank_compute_s", r)] = res.step_s - res.comm_s
                metrics[rank_series("trainer/rank_comm_s", r)] = res.comm_s
                metrics[rank_series("trainer/rank_comm_bytes", r)] = float(res.comm_bytes)
        step_s = time.perf_counter() - start
        metrics["trainer/step_s"] = step_s
        lengths = [len(r.prompt_ids) + len(r.completion_ids) for r in rollouts]
        flops = self.flops.of_sequences(lengths)
        metrics["trainer/tokens_per_s"] = sum(lengths) / step_s
        metrics["trainer/model_tflops"] = flops / step_s / len(results) / 1e12  # a device per rank
        if self.peak_flops is not None:
            metrics["trainer/mfu"] = mfu(flops, step_s, self.peak_flops, len(results))
        return metrics


def steps_of(rollout: Rollout) -> tuple[list[int], list[float]]:
    """A rollout's (step ends, step scores) for process credit; one that carries no steps
    (a group generated before the run took process credit, resumed from a checkpoint) is
    one step, its whole completion, scored by its reward."""
    if rollout.step_ends:
        return rollout.step_ends, rollout.step_scores
    return [len(rollout.completion_ids)], [rollout.reward]


def without_truncated(group: Group) -> Group:
    """`group` with its truncated completions (finish_reason "length") given no trained
    token (`trainer.mask_truncated`): no loss, no place in any denominator. Their rewards
    still count in the group's advantages, computed before."""
    rollouts = [
        dataclasses.replace(r, loss_mask=[0] * len(r.completion_ids)) if r.finish_reason == "length" else r
        for r in group.rollouts
    ]
    return dataclasses.replace(group, rollouts=rollouts)


class Peers(Protocol):
    """The other ranks of a pool, as rank 0's step sees them: `start` hands each its
    part (they run concurrently with rank 0's), `results` waits for their results."""

    def start(self, steps: list[RankStep]) -> None: ...

    def results(self) -> list[RankResult]: ...


def agent_advantages(groups: list[Group], scaling: str) -> list[list[float]]:
    """Each rollout's advantage, normalised within its group and agent (`Group.agent_parts`:
    the whole group for a single-agent task, so GRPO's own; a multi-agent task's proposer
    and solver each against their own group mates)."""
    parts = [(k, idx) for k, g in enumerate(groups) for idx in g.agent_parts()]
    scaled = scaled_advantages([[groups[k].rollouts[i].reward for i in idx] for k, idx in parts], scaling)
    out = [[0.0] * len(g.rollouts) for g in groups]
    for (k, idx), values in zip(parts, scaled, strict=True):
        for i, a in zip(idx, values, strict=True):
            out[k][i] = a
    return out
