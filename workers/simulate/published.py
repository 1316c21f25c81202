"""The simulator against the field's published tables: verl's fully-async recipe, AReaL
v0.3 and verl's checkpoint-engine weight sync, each rebuilt as a scenario the simulator
runs (the peers' models read by transformers from their configs, their GPUs' published
specs, their batch sizes, splits and sync paths) and set beside the published figure.

A few constants the sources do not give are fitted on some of the figures (`FIT`, and
the inter-node link of `SYNC_FIT_FIGURES`); every other figure is predicted with them.
`rows()` computes the whole table; `fit_verl()` searches the fitted constants again.

Sources:
- verl fully-async recipe (README of recipe/fully_async_policy, last updated 12/25/2025):
  https://github.com/volcengine/verl/blob/main/recipe/fully_async_policy/README.md
- AReaL v0.3 (boba²) blog: https://github.com/inclusionAI/AReaL/blob/main/blog/AReaL_v0_3.md
- verl's checkpoint engine (how the buckets are packed and broadcast):
  https://github.com/volcengine/verl/blob/main/recipe/fully_async_policy/checkpoint_engine.py
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from workers.config.presets import build
from workers.simulate.cluster import Cluster, layout
from workers.simulate.costs import (
    H20,
    H800,
    NVLINK,
    NVLINK_H800,
    TRAIN_MFU,
    Link,
    ModelShape,
    TrainCost,
    shape_of_config,
    sync_cost,
)
from workers.simulate.run import Workload, roofline_costs, simulate

if TYPE_CHECKING:
    from workers.config.run_config import RunConfig

VERL_README = "https://github.com/volcengine/verl/blob/main/recipe/fully_async_policy/README.md"
AREAL_BLOG = "https://github.com/inclusionAI/AReaL/blob/main/blog/AReaL_v0_3.md"
BF16_WIRE = 2  # both peers send bfloat16 weights


@cache
def model(name: str) -> ModelShape:
    """A peer's model, as transformers builds it from the published config.json values
    (on the meta device: no weights)."""
    # transformers only when a table is computed: the site imports the simulator for
    # every simulated run, and none of them needs these classes.
    from transformers import Qwen2Config, Qwen3MoeConfig

    configs = {
        # Qwen2.5-Math-7B and DeepSeek-R1-Distill-Qwen-7B share Qwen2.5-7B's architecture.
        "Qwen2.5-Math-7B": Qwen2Config(
            vocab_size=152064,
            hidden_size=3584,
            intermediate_size=18944,
            num_hidden_layers=28,
            num_attention_heads=28,
            num_key_value_heads=4,
            tie_word_embeddings=False,
        ),
        "R1-Distill-Qwen-1.5B": Qwen2Config(
            vocab_size=151936,
            hidden_size=1536,
            intermediate_size=8960,
            num_hidden_layers=28,
            num_attention_heads=12,
            num_key_value_heads=2,
            tie_word_embeddings=False,
        ),
        # head_dim is not in Qwen3MoeConfig's signature: it travels in its **kwargs.
        "Qwen3-30B-A3B": Qwen3MoeConfig(  # type: ignore[call-arg]
            vocab_size=151936,
            hidden_size=2048,
            intermediate_size=6144,
            moe_intermediate_size=768,
            num_hidden_layers=48,
            num_attention_heads=32,
            num_key_value_heads=4,
            head_dim=128,
            num_experts=128,
            num_experts_per_tok=8,
            tie_word_embeddings=False,
        ),
        "Qwen3-235B-A22B": Qwen3MoeConfig(  # type: ignore[call-arg]
            vocab_size=151936,
            hidden_size=4096,
            intermediate_size=12288,
            moe_intermediate_size=1536,
            num_hidden_layers=94,
            num_attention_heads=64,
            num_key_value_heads=4,
            head_dim=128,
            num_experts=128,
            num_experts_per_tok=8,
            tie_word_embeddings=False,
        ),
    }
    configs["R1-Distill-Qwen-7B"] = configs["Qwen2.5-Math-7B"]
    return shape_of_config(configs[name], name)


@dataclass(frozen=True)
class Fit:
    """What the verl 7B runs leave unpublished, fitted on their 128-GPU figures: the
    completion lengths over a run (lognormal median and p90; the 28K cap is published)
    and the training MFU of the H20s."""

    median_tokens: int
    p90_tokens: int
    h20_train_mfu: float


# `fit_verl()` over its default grid (docs/simulation.md, "Calibration").
FIT = Fit(median_tokens=700, p90_tokens=3500, h20_train_mfu=0.87)


@dataclass(frozen=True)
class Row:
    figure: str
    scenario: str
    published: float
    simulated: float | None  # None: the scenario cannot be run (`note` says why)
    fitted: bool
    unit: str
    source: str
    note: str = ""

    @property
    def ratio(self) -> float | None:
        return None if self.simulated is None else self.simulated / self.published


# ---- verl fully-async, Qwen2.5-Math-7B on H20s ------------------------------------

VERL_MAX_TOKENS = 28 * 1024
VERL_PROMPT_TOKENS = 256  # DAPO-Math-17k prompts with the chat template: a few hundred tokens
VERL_PROMPTS = 512  # colocate sync's train_batch_size; fully async: 512 per parameter sync
VERL_GROUP = 16  # rollout.n
VERL_MINIBATCH = 32  # ppo_mini_batch_size (prompts): 16 optimizer updates per 512 prompts
VERL_LOCAL = 4 * VERL_MINIBATCH  # require_batches 4 × ppo_mini_batch_size: one local update's prompts
# Groups verl's fixed sync interval (every 4 local updates) admits, on average, ahead of a
# gate that opens after every local update: 1.5 local updates (assumed, not fitted).
VERL_SYNC_AHEAD = VERL_LOCAL * 3 // 2


def verl_workload(fit: Fit, max_tokens: int = VERL_MAX_TOKENS, shape: str = "Qwen2.5-Math-7B") -> Workload:
    return Workload(
        model(shape),
        prompt_tokens=VERL_PROMPT_TOKENS,
        median_tokens=fit.median_tokens,
        p90_tokens=min(fit.p90_tokens, max_tokens),
        max_tokens=max_tokens,
    )


def _run(
    cfg: RunConfig,
    cluster: Cluster,
    workload: Workload,
    steps: int,
    *,
    mfu: float,
    recompute_old: bool,
    streaming: bool,
) -> dict[str, float]:
    """A peer's run: its bfloat16 weights and checkpoint tensors on the wire, its
    training MFU, and whether it recomputes π_old."""
    lay = layout(cluster, cfg.placement.mode)
    costs = roofline_costs(cfg, cluster, lay, workload, wire_bytes=BF16_WIRE, tensors=workload.model.checkpoint_tensors)
    assert isinstance(costs.train, TrainCost)  # the roofline's, not a measured run's
    train = dataclasses.replace(costs.train, mfu=mfu, recompute_old=recompute_old)
    costs = dataclasses.replace(costs, train=train)
    return simulate(cfg, cluster, workload, steps, 0, costs=costs, streaming=streaming).summary


def verl_sync(gpus: int, fit: Fit = FIT) -> dict[str, float]:
    """verl's colocate sync: every GPU generates the 512 × 16 rollouts, then computes
    old_log_prob and trains 16 minibatches (hybrid engine, vLLM tp 1)."""
    cfg = build(
        "sync",
        {
            "trainer": {"batch_groups": VERL_PROMPTS, "group_size": VERL_GROUP, "minibatches": 16},
            "placement": {"devices": "gpu", "mode": "colocated"},
        },
    )
    return _run(
        cfg,
        Cluster(gpus, device=H20),
        verl_workload(fit),
        8,
        mfu=fit.h20_train_mfu,
        recompute_old=True,
        streaming=False,
    )


def verl_async(gpus: int, staleness: float = 0.5, fit: Fit = FIT, ahead: int = VERL_SYNC_AHEAD) -> dict[str, float]:
    """verl's fully_async_policy at `gpus` split half and half: streaming rollout with
    partial rollout (abort and resume), the rollout's own logprobs (no old_log_prob),
    a parameter sync every 4 local updates of 128 prompts and at most (1 + staleness) ×
    512 prompts generated between two syncs.

    In the engine's terms: a trainer step is one local update (128 prompts, 4
    minibatches) followed by a sync (verl syncs after 4: a bucketed 7B sync takes 0.3 s
    over the default InfiniBand, beside a step of about 42 s); the gate admits a step's
    128 groups plus `staleness` × 512, plus the 192 groups (1.5 local updates) verl's
    fixed sync interval admits on average ahead of a per-step gate."""
    cfg = build(
        "verl-fully-async",
        {
            "trainer": {
                "batch_groups": VERL_LOCAL,
                "group_size": VERL_GROUP,
                "minibatches": VERL_LOCAL // VERL_MINIBATCH,
            },
            "buffer": {
                "max_head_offpolicyness": 0,
                "overcommit": round(staleness * VERL_PROMPTS) + ahead,
                "max_staleness": 32,
                "unit": "episode",
            },
        },
    )
    return _run(
        cfg,
        Cluster(gpus, inference_share=0.5, device=H20),
        verl_workload(fit),
        32,
        mfu=fit.h20_train_mfu,
        recompute_old=False,
        streaming=True,
    )


def step_parts(summary: dict[str, float]) -> tuple[float, float]:
    """A colocated step's generation and training seconds (the trainer's busy share)."""
    step = summary["seconds"] / summary["steps"]
    return step * (1 - summary["trainer_busy"]), step * summary["trainer_busy"]


def speedup(gpus: int, fit: Fit = FIT, staleness: float = 0.5) -> float:
    return verl_async(gpus, staleness, fit)["samples_per_s"] / verl_sync(gpus, fit)["samples_per_s"]


def _hours(days: int, hours: int, minutes: int) -> float:
    return days * 24 + hours + minutes / 60


# Published (README tables): colocate sync at 128 H20s, per step: gen 177.85 s,
# old_log_prob 53.92 s + update_actor 113.81 s; fully async 64:64 over colocate sync,
# 400 steps: 1d 16h 48m → 17h 22m. The figures the fit is made on, and their rows.
VERL_FIT_TARGETS = {
    "gen_s": 177.85,
    "train_s": 53.92 + 113.81,
    "speedup": _hours(1, 16, 48) / _hours(0, 17, 22),
}


def fit_error(fit: Fit) -> float:
    """Squared log error of the fitted figures."""
    sync = verl_sync(128, fit)
    gen, train = step_parts(sync)
    x = verl_async(128, 0.5, fit)["samples_per_s"] / sync["samples_per_s"]
    got = {"gen_s": gen, "train_s": train, "speedup": x}
    return sum(math.log(got[k] / v) ** 2 for k, v in VERL_FIT_TARGETS.items())


def fit_verl(
    medians: tuple[int, ...] = (300, 400, 500, 700, 1000),
    p90_over_median: tuple[float, ...] = (4, 5, 6, 7),
) -> Fit:
    """The grid's best lengths; for each, the MFU that makes the 128-GPU colocated
    training step the published one (a step's training time is inversely proportional
    to the MFU), then the least squared log error over the three fitted figures."""
    best: tuple[float, Fit] | None = None
    for median in medians:
        for ratio in p90_over_median:
            trial = Fit(median, int(median * ratio), TRAIN_MFU)
            _, train = step_parts(verl_sync(128, trial))
            mfu = round(TRAIN_MFU * train / VERL_FIT_TARGETS["train_s"], 2)
            trial = dataclasses.replace(trial, h20_train_mfu=mfu)
            err = fit_error(trial)
            if best is None or err < best[0]:
                best = (err, trial)
    assert best is not None
    return best[1]


# The staleness ablation at 128 GPUs (fully async 64:64, 400 steps): staleness_threshold
# → total time; 0 is the stream off-policy pipeline the others are set against.
STALENESS_ABLATION = {0.0: _hours(1, 1, 53), 0.1: _hours(0, 19, 59), 0.3: _hours(0, 17, 20), 0.5: _hours(0, 17, 22)}


def verl_rows(fit: Fit = FIT) -> list[Row]:
    sync128 = verl_sync(128, fit)
    gen, train = step_parts(sync128)
    sync32 = verl_sync(32, fit)
    sync64 = verl_sync(64, fit)
    a128 = verl_async(128, 0.5, fit)
    fresh = verl_async(128, 0.0, fit)["samples_per_s"]
    a32 = verl_async(32, 0.5, fit)
    where = "Qwen2.5-Math-7B, DAPO, 28K, H20"
    target = VERL_FIT_TARGETS
    return [
        Row("colocate sync generation per step", f"{where}, 128 GPUs", target["gen_s"], gen, True, "s", VERL_README),
        Row("colocate sync training per step", f"{where}, 128 GPUs", target["train_s"], train, True, "s", VERL_README),
        Row(
            "fully async 64:64 over colocate sync",
            f"{where}, 128 GPUs, staleness 0.5",
            target["speedup"],
            a128["samples_per_s"] / sync128["samples_per_s"],
            True,
            "×",
            VERL_README,
        ),
        Row(
            "fully async 16:16 over colocate sync",
            f"{where}, 32 GPUs, staleness 0.5",
            _hours(3, 17, 5) / _hours(1, 9, 26),
            a32["samples_per_s"] / sync32["samples_per_s"],
            False,
            "×",
            VERL_README,
        ),
        Row(
            "fully async 16:16 time per step: 1d 9h 26m / 400",
            f"{where}, 32 GPUs, staleness 0.5",
            _hours(1, 9, 26) * 3600 / 400,
            VERL_PROMPTS * VERL_GROUP / a32["samples_per_s"],
            False,
            "s",
            VERL_README,
        ),
        Row(
            "fully async 32:32 over colocate sync",
            f"{where}, 64 GPUs, staleness 0.5",
            _hours(1, 17, 32) / _hours(0, 21, 40),
            verl_async(64, 0.5, fit)["samples_per_s"] / sync64["samples_per_s"],
            False,
            "×",
            VERL_README,
        ),
        *(
            Row(
                f"staleness 0 → {staleness}: total time 1d 1h 53m → {_hm(STALENESS_ABLATION[staleness])}",
                f"{where}, 128 GPUs, fully async 64:64",
                STALENESS_ABLATION[0.0] / STALENESS_ABLATION[staleness],
                verl_async(128, staleness, fit)["samples_per_s"] / fresh,
                False,
                "×",
                VERL_README,
            )
            for staleness in (0.1, 0.3, 0.5)
        ),
        Row(
            "colocate sync step at 32 GPUs",
            f"{where}, 32 GPUs",
            790.10,
            sync32["seconds"] / sync32["steps"],
            False,
            "s",
            VERL_README,
        ),
        Row(
            "colocate sync step at 64 GPUs",
            f"{where}, 64 GPUs",
            365.28,
            sync64["seconds"] / sync64["steps"],
            False,
            "s",
            VERL_README,
        ),
    ]


def _hm(hours: float) -> str:
    return f"{int(hours)}h {round(hours % 1 * 60)}m"


# ---- AReaL v0.3: R1-Distill-Qwen-1.5B and -7B on H800s ----------------------------

AREAL_MAX_TOKENS = 27 * 1024  # the blog's rollout strategy: at most 27K tokens generated


def areal_speedup(shape: str, nodes: int, fit: Fit = FIT) -> float:
    """Synchronous AReaL (generation over every GPU, then training) against
    asynchronous AReaL (3/4 of the GPUs generating, streaming with interruptible
    rollouts, η = 4) on `nodes` nodes of 8 H800s; 512 prompts × 16 per step, the verl
    fit's completion lengths cut at 27K, the H100-class training MFU."""
    gpus = nodes * 8
    workload = verl_workload(fit, AREAL_MAX_TOKENS, shape)
    trainer = {"batch_groups": 512, "group_size": 16}
    sync_cfg = build("sync", {"trainer": trainer, "placement": {"devices": "gpu", "mode": "colocated"}})
    async_cfg = build("areal", {"trainer": trainer, "buffer": {"max_head_offpolicyness": 4}})
    every = Cluster(gpus, device=H800, intra_node=NVLINK_H800)
    split = Cluster(gpus, inference_share=0.75, device=H800, intra_node=NVLINK_H800)
    sync = _run(sync_cfg, every, workload, 8, mfu=TRAIN_MFU, recompute_old=True, streaming=False)
    fast = _run(async_cfg, split, workload, 16, mfu=TRAIN_MFU, recompute_old=True, streaming=True)
    return fast["samples_per_s"] / sync["samples_per_s"]


def areal_rows(fit: Fit = FIT) -> list[Row]:
    return [
        Row(
            "async over sync AReaL: 41.0 → 14.8 h",
            "R1-Distill-Qwen-1.5B, 16 nodes of H800, 1,000 steps",
            41.0 / 14.8,
            areal_speedup("R1-Distill-Qwen-1.5B", 16, fit),
            False,
            "×",
            AREAL_BLOG,
        ),
        Row(
            "async over sync AReaL: 57.7 → 25.4 h",
            "R1-Distill-Qwen-7B, 24 nodes of H800, 1,000 steps",
            57.7 / 25.4,
            areal_speedup("R1-Distill-Qwen-7B", 24, fit),
            False,
            "×",
            AREAL_BLOG,
        ),
    ]


# ---- verl checkpoint engine: one weight sync, H20s, Megatron trainer ---------------

# (model, trainer ranks = rollout ranks, per-tensor seconds, checkpoint-engine seconds)
SYNC_FIGURES = (
    ("Qwen2.5-Math-7B", 4, 0.12, 0.02),
    ("Qwen3-30B-A3B", 16, 15.76, 4.38),
    ("Qwen3-235B-A22B", 64, 58.57, 23.70),
)
SYNC_FIT_FIGURES = "Qwen3-30B-A3B"
# The checkpoint engine's default bucket, async_training.checkpoint_engine.device_buffer_size_M
# (the README's parameter table; the ablation ran "default checkpoint-engine configurations").
# Each trainer rank packs the tensors assigned to it round-robin into its own buckets,
# and the ranks' buckets are broadcast to every rank one after another
# (recipe/fully_async_policy/checkpoint_engine.py): one sender at a time.
CHECKPOINT_BUCKET_MB = 4096


def _sync_link(ranks: int, fitted: Link) -> Link:
    """Both pools on one 8-GPU node talk over NVLink; across nodes, the fitted link."""
    return NVLINK if 2 * ranks <= 8 else fitted


def _buckets(size: float, ranks: int) -> int:
    """The checkpoint engine's broadcasts: each trainer rank's share in 4 GB buckets."""
    return ranks * math.ceil(size / ranks / (CHECKPOINT_BUCKET_MB * 2**20))


def _sync_seconds(shape: ModelShape, link: Link, bucketed: bool, ranks: int = 1) -> float:
    """The old path: a broadcast per checkpoint tensor; the checkpoint engine: each of
    the `ranks` trainer ranks' 4 GB buckets, in turn."""
    cost = sync_cost(
        "collective",
        shape,
        link=link,
        workers=1,
        nodes=1,
        packed=bucketed,
        bucket_mb=CHECKPOINT_BUCKET_MB,
        wire_bytes=BF16_WIRE,
        tensors=shape.checkpoint_tensors,
        senders=ranks,
    )
    return cost.trainer_s


def fit_sync_link() -> Link:
    """The inter-node link's bandwidth and per-message latency, solved from the 30B-A3B
    pair: per tensor, T·ℓ + S/b = 15.76 s; in buckets, K·ℓ + S/b = 4.38 s."""
    name, ranks, per_tensor, bucketed = next(f for f in SYNC_FIGURES if f[0] == SYNC_FIT_FIGURES)
    shape = model(name)
    size = shape.params * BF16_WIRE
    tensors = shape.checkpoint_tensors or shape.tensors
    buckets = _buckets(size, ranks)
    latency = (per_tensor - bucketed) / (tensors - buckets)
    return Link("H20 inter-node (fitted)", size / (bucketed - buckets * latency), latency)


def sync_rows() -> list[Row]:
    fitted = fit_sync_link()
    rows = []
    for name, ranks, per_tensor, bucketed in SYNC_FIGURES:
        shape, link = model(name), _sync_link(ranks, fitted)
        where = f"{name}, {ranks} + {ranks} H20s, Megatron → vLLM, bf16"
        for label, published, packed in (("per tensor", per_tensor, False), ("checkpoint engine", bucketed, True)):
            rows.append(
                Row(
                    f"weight sync, {label}",
                    where,
                    published,
                    _sync_seconds(shape, link, packed, ranks),
                    name == SYNC_FIT_FIGURES,
                    "s",
                    VERL_README,
                )
            )
    return rows


# ---- verl trainer V1 on a mixture of experts: not run --------------------------------

MOE_V1_ROW = Row(
    "verl V1 colocate_async over sync: 12,053 → 18,852 tokens/s",
    "Qwen3.5-35B-A3B, 4 nodes, 32K responses",
    18852 / 12053,
    None,
    False,
    "×",
    "",
    "not run: colocate_async time-shares each GPU between generation and training with the "
    "unfinished rollouts carried across steps, which the simulator's colocated placement "
    "(generation, then training, in turns) does not model, and the GPUs are not stated "
    "in the source",
)


def rows(fit: Fit = FIT) -> list[Row]:
    """Every published figure beside the simulator's."""
    return [*verl_rows(fit), *areal_rows(fit), *sync_rows(), MOE_V1_ROW]


def markdown(table: list[Row]) -> str:
    lines = [
        "| published figure | scenario | fitted or predicted | published | simulator | simulator / published |",
        "|---|---|---|---|---|---|",
    ]
    for r in table:
        role = "fitted" if r.fitted else "not run" if r.simulated is None else "predicted"
        sim = "—" if r.simulated is None else f"{r.simulated:.3g} {r.unit}"
        ratio = "—" if r.ratio is None else f"{r.ratio:.2f}"
        lines.append(f"| {r.figure} | {r.scenario} | {role} | {r.published:.3g} {r.unit} | {sim} | {ratio} |")
    return "\n".join(lines) + "\n"
