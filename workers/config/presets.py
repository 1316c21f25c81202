"""Named presets: instances of `RunConfig` that reproduce a pipeline layout.

`build(name, overrides)` deep-merges JSON overrides onto a preset and validates the
result, so the launch form, the API and tests all go through one path.
"""

from __future__ import annotations

from typing import Any, TypedDict

from workers.config.run_config import RunConfig
from workers.core.merge import deep_merge


# Each peer preset reproduces one library's *pipeline choices* (buffer, staleness,
# correction, weight sync, update mode) on Rollway's default model, task and trainer
# sizes, so presets compare on the same task; the inference backend stays the default
# (the user picks it). Each description names the peer's own knobs and the defaults
# read from its public code (mid-2026), and says what is approximated.
class Preset(TypedDict):
    description: str
    config: RunConfig
    # Where the peer scores its rollouts (which process, and when: per sample, per group,
    # per batch), read from its public code, and the Rollway reward-stage setting
    # (`rewards.*`, docs/rewards.md) nearest to it. Placement decides whether scoring
    # overlaps generation or waits on it, which the pipeline switches above do not say;
    # docs/rewards.md tabulates these sentences word for word (a test keeps them equal).
    rewards_where: str


PRESETS: dict[str, Preset] = {
    "async": {
        "description": (
            "One-step-off async GRPO: inference and trainer run side by side through a "
            "bounded buffer (capacity 2 batches), version rejection at max_staleness=1, "
            "truncated IS against the behaviour logprobs; weights pushed by full reload."
        ),
        "config": RunConfig(mode="async"),
        "rewards_where": (
            "Rollway's default: no reward pool (rewards.workers 0, rewards.mode after), so each inference worker "
            "scores its own groups with the task's verifier right after the generate call that made them, before they "
            "enter the buffer."
        ),
    },
    "sync": {
        "description": (
            "Synchronous baseline (TRL GRPOTrainer-style): generate a batch, train on it, "
            "sync weights, repeat. Same code path as async."
        ),
        "config": RunConfig(mode="sync", buffer={"capacity": 1, "max_staleness": 0}),
        "rewards_where": (
            "Rollway's default, as in async: the inference worker scores each group right after generating it "
            "(rewards.workers 0, after). TRL's GRPOTrainer scores in the trainer process instead (reward_funcs called "
            "in _generate_and_score_completions on the generated batch, a reward model on the trainer's device); in a "
            "synchronous loop both score after generation and before the step, so only the process differs."
        ),
    },
    "trl-async": {
        "description": (
            "TRL AsyncGRPOTrainer. Reproduces: max_staleness=4 with drop at dequeue "
            "(buffer.max_staleness=4, on_stale=drop); max_inflight_tasks = max_staleness × "
            "samples/step as the admission gate (unbounded queue, max_head_offpolicyness=4); "
            "packed vLLM NCCL sync in 1 GB buckets (sync.protocol=collective, packed, "
            "bucket_mb=1024); /pause?mode=keep then resume (sync.update_mode=in_flight). "
            "Approximates: TRL clips πθ/μ against vLLM's logprobs with no recompute; "
            "Rollway recomputes π_old and applies token TIS (min(π_old/μ, 2)). The "
            "collective is NCCL on GPU, gloo here."
        ),
        "config": RunConfig(
            buffer={"mode": "unbounded", "max_staleness": 4, "max_head_offpolicyness": 4, "on_stale": "drop"},
            correction={"method": "token_tis"},
            sync={"protocol": "collective", "packed": True, "bucket_mb": 1024, "update_mode": "in_flight"},
        ),
        "rewards_where": (
            "TRL's AsyncGRPOTrainer scores in its rollout worker, a child process that also drives vLLM: once all "
            "completions of a group are done, a scoring loop runs the reward_funcs on it (plain functions in threads) "
            "while other groups keep generating, then puts the scored group on the trainer's queue. Nearest: the "
            "default (rewards.workers 0, after: the inference worker scores after each generate call), without TRL's "
            "overlap of scoring with generation."
        ),
    },
    "trl-async-lora": {
        "description": (
            "TRL AsyncGRPOTrainer with LoRA: trl-async's buffer and staleness (max_staleness=4, "
            "drop at dequeue, unbounded queue, max_head_offpolicyness=4) plus a peft adapter "
            "(lora.enabled, rank 8) synced adapter-only (sync.protocol=lora: versioned "
            "adapter names, like TRL's filesystem + load_lora_adapter). A request keeps the "
            "adapter it started with (vLLM binds it at request start), so in-flight requests "
            "finish on the old adapter: sync.update_mode=drain. Cannot reproduce: TRL's "
            "max_loras ≥ max_staleness+2 (vLLM keeps one adapter per version; the torch "
            "backend merges the adapter instead). Approximates TRL's no-recompute PPO-clip "
            "with token TIS."
        ),
        "config": RunConfig(
            buffer={"mode": "unbounded", "max_staleness": 4, "max_head_offpolicyness": 4, "on_stale": "drop"},
            correction={"method": "token_tis"},
            sync={"protocol": "lora", "update_mode": "drain"},
            lora={"enabled": True},
        ),
        "rewards_where": (
            "As trl-async: scored in TRL's rollout worker process per finished group (reward_funcs, or an "
            "environment's get_reward) while other groups generate. Nearest: the default (rewards.workers 0, after)."
        ),
    },
    "pipelinerl": {
        "description": (
            "PipelineRL. Reproduces: the unbounded stream (buffer.mode=unbounded); the "
            "reinforce loss −Σ logπ·A·sg(clamp(π/μ, 0, 1+ε_hi)) with ε=0.02 "
            "(correction.method=pipelinerl_reinforce, reinforce_eps_hi=0.02); NCCL "
            "broadcast one tensor at a time (sync.protocol=collective, packed=false); "
            "in-flight updates with tokens of several versions per sequence "
            "(sync.update_mode=in_flight). Approximates: max_lag (counted in samples) as "
            "max_head_offpolicyness=2 batches; PipelineRL's trainer counts too-old samples "
            "and never drops them, so max_staleness=8 is set far above what the gate lets "
            "through. Streams go through a Ray actor, not Redis/JSONL; the collective is "
            "NCCL on GPU, gloo here."
        ),
        "config": RunConfig(
            buffer={"mode": "unbounded", "max_staleness": 8, "max_head_offpolicyness": 2, "on_stale": "drop"},
            correction={"method": "pipelinerl_reinforce", "reinforce_eps_hi": 0.02},
            sync={"protocol": "collective", "packed": False, "update_mode": "in_flight"},
        ),
        "rewards_where": (
            "PipelineRL scores in its actor process, per sample as soon as that sample's generation ends: the rollout "
            "coroutine sends the answer to an environment server (a separate process with a pool of verifier "
            "processes) and turns the verdict into the reward. Nearest: a pool that scores each completion once as it "
            "finishes, rewards.workers ≥ 1 with rewards.mode pipelined and rewards.chunk_tokens ≥ "
            "inference.max_new_tokens (by override; the preset keeps the default)."
        ),
    },
    "prime-rl": {
        "description": (
            "PRIME-RL. Reproduces: one-step overlap (buffer.mode=double: one batch ahead); "
            "max_off_policy_steps=8 dropping stale work (buffer.max_staleness=8, "
            "on_stale=drop); filesystem weight sync (sync.protocol=filesystem); generation "
            "continued across versions (sync.update_mode=in_flight). Approximates: PRIME-RL "
            "masks a token when A>0 ∧ π−μ > 0.2 or A<0 ∧ π−μ < −0.2 and adds "
            "1e-3·Σ(log r)²; Rollway's nearest is masked IS on the ratio π_old/μ outside "
            "[0.5, 2] (correction.method=masked_is), without the sign rule or the penalty. "
            "Cannot reproduce: dropping in-flight work (Rollway rejects at the buffer)."
        ),
        "config": RunConfig(
            buffer={"mode": "double", "max_staleness": 8, "on_stale": "drop"},
            correction={"method": "masked_is", "mask_low": 0.5, "mask_high": 2.0},
            sync={"protocol": "filesystem", "update_mode": "in_flight"},
        ),
        "rewards_where": (
            "PRIME-RL scores in verifiers environments run as env-server processes beside its orchestrator: each "
            "rollout is scored by its environment's rubric as soon as it finishes (a group-level rubric once the group "
            "has), and the orchestrator turns rewards into advantages. Nearest: the default (rewards.workers 0, "
            "after); the implicit PRM trained online is PRIME's (a different project), not PRIME-RL's, and Rollway "
            "trains no reward model online."
        ),
    },
    "areal": {
        "description": (
            "AReaL. Reproduces: the capacity rule (η + v + 1)·B − (accepted + running) "
            "with η=max_head_offpolicyness=4 (buffer.mode=unbounded, the gate alone paces "
            "generation; buffer.max_staleness=4 = η, so the gate, not rejection, bounds "
            "staleness); decoupled PPO r = πθ/π_prox, w = π_prox/π_behav with weights above "
            "the cap masked (correction.method=decoupled_ppo, cap trainer.tis_cap=2 in "
            "place of behav_imp_weight_cap); disk weight sync (sync.protocol=filesystem); "
            "interruptible generation, pause/continue (sync.update_mode=abort_resume). "
            "Approximates: π_prox is the trainer's policy at step start (recomputed), not a "
            "separately kept proximal model."
        ),
        "config": RunConfig(
            buffer={"mode": "unbounded", "max_staleness": 4, "max_head_offpolicyness": 4, "on_stale": "drop"},
            correction={"method": "decoupled_ppo"},
            sync={"protocol": "filesystem", "update_mode": "abort_resume"},
        ),
        "rewards_where": (
            "AReaL scores in its rollout workflow, per sample as soon as that sample's generation returns "
            "(RLVRWorkflow awaits the reward function in a process pool, AsyncRewardWrapper), so the trainer only sees "
            "scored samples. Nearest: the default (rewards.workers 0, after); scoring each completion as it ends is "
            "rewards.workers ≥ 1, mode pipelined, rewards.chunk_tokens ≥ inference.max_new_tokens."
        ),
    },
    "verl-fully-async": {
        "description": (
            "verl fully-async. Reproduces: the MessageQueue as a bounded queue "
            "(buffer.mode=bounded, capacity 2 batches); V1 max_off_policy_threshold=8 with "
            "strategy drop (buffer.max_staleness=8, on_stale=drop); Rollout Correction "
            "token TIS, threshold 2.0 (correction.method=token_tis, trainer.tis_cap=2); "
            "2048 MB weight buckets (sync.protocol=collective, packed, bucket_mb=2048); "
            "abort, keep tokens, re-prefill on the new version (sync.update_mode="
            "abort_resume). Approximates: staleness_threshold=0.1 (a fraction of a batch "
            "generated by old weights) as max_head_offpolicyness=1 whole batch. Cannot "
            "reproduce: the checkpoint engine (a broadcast here: NCCL on GPU, gloo on CPU); "
            "strategy 'wait' is the admission gate, not a separate switch."
        ),
        "config": RunConfig(
            buffer={
                "mode": "bounded",
                "capacity": 2,
                "max_staleness": 8,
                "max_head_offpolicyness": 1,
                "on_stale": "drop",
            },
            correction={"method": "token_tis"},
            sync={"protocol": "collective", "packed": True, "bucket_mb": 2048, "update_mode": "abort_resume"},
        ),
        "rewards_where": (
            "verl fully-async: with the reward loop (reward_model.use_reward_loop, the default since late 2025) each "
            "sample is scored as soon as its agent loop ends, by a RewardLoopWorker Ray actor beside each agent-loop "
            "worker; without it the trainer scores each batch it takes from the MessageQueue with the reward manager "
            "(and a reward-model worker group if enabled). Nearest: a reward pool, rewards.workers ≥ 1 with mode after "
            "(by override; the preset keeps the default)."
        ),
    },
    "skyrl": {
        "description": (
            "SkyRL. Reproduces: the asyncio group queue with max_staleness_steps=4 as a "
            "capacity gate that never drops (buffer.mode=bounded, capacity 4, "
            "max_head_offpolicyness=4, max_staleness=4 = the gate's bound, so nothing is "
            "rejected); TIS clip 2.0 (correction.method=token_tis); NCCL broadcast "
            "(sync.protocol=collective, one tensor at a time); in-flight updates with "
            "stale KV (sync.update_mode=in_flight). Alternatives by override: geometric "
            "sequence mask / icepop ≈ correction.method=masked_is. Cannot reproduce: CUDA "
            "IPC and delta (XOR+zstd) sync, prefix cache salted per version (the "
            "collective is NCCL on GPU, gloo here)."
        ),
        "config": RunConfig(
            buffer={
                "mode": "bounded",
                "capacity": 4,
                "max_staleness": 4,
                "max_head_offpolicyness": 4,
                "on_stale": "drop",
            },
            correction={"method": "token_tis"},
            sync={"protocol": "collective", "packed": False, "update_mode": "in_flight"},
        ),
        "rewards_where": (
            "SkyRL scores in its generator, in the trainer's driver process: each trajectory's skyrl-gym environment "
            "returns the reward from env.step right after the turn that ends it (optionally in a thread pool, "
            "skyrl_gym.max_env_workers), and the finished group is queued for training. Nearest: the default "
            "(rewards.workers 0, after)."
        ),
    },
    "nemo-rl": {
        "description": (
            "NeMo-RL. Reproduces: max_trajectory_age_steps=1 (buffer.max_staleness=1, "
            "on_stale=drop) on a bounded replay buffer of 2 batches, one batch ahead "
            "(max_head_offpolicyness=1); IS correction required, tis "
            "(correction.method=token_tis; icepop ≈ masked_is, seq-mask-tis ≈ "
            "sequence_tis by override); in_flight_weight_updates=false "
            "(sync.update_mode=drain); packed broadcast (sync.protocol=collective). "
            "Cannot reproduce: CUDA IPC / HTTP sync (NCCL on GPU, gloo here); the replay "
            "buffer is a FIFO here, not sampled."
        ),
        "config": RunConfig(
            buffer={
                "mode": "bounded",
                "capacity": 2,
                "max_staleness": 1,
                "max_head_offpolicyness": 1,
                "on_stale": "drop",
            },
            correction={"method": "token_tis"},
            sync={"protocol": "collective", "packed": True, "update_mode": "drain"},
        ),
        "rewards_where": (
            "NeMo-RL scores in environment Ray actors: the rollout (in async GRPO, the trajectory collector actor) "
            "sends each finished sample to its task's environment, e.g. MathEnvironment, which verifies it on a pool "
            "of env.math.num_workers verify-worker actors. Nearest: a reward pool, rewards.workers ≥ 1 with mode after "
            "(by override; the preset keeps the default)."
        ),
    },
    "slime": {
        "description": (
            "slime. Reproduces: the double buffer (buffer.mode=double, one batch ahead); "
            "no core staleness knob (buffer.max_staleness=1, which the one-batch head never "
            "exceeds, so nothing is rejected); --use-tis clip 2.0 (correction.method="
            "token_tis); bucketed NCCL in 512 MiB buckets (sync.protocol=collective, "
            "packed, bucket_mb=512); abort and recycle partial rollouts (sync.update_mode="
            "abort_retry). Cannot reproduce: OPSM δ=1e-4 (no sequence masking on the "
            "policy-shift sign here); the collective is NCCL on GPU, gloo here."
        ),
        "config": RunConfig(
            buffer={"mode": "double", "max_staleness": 1, "on_stale": "drop"},
            correction={"method": "token_tis"},
            sync={"protocol": "collective", "packed": True, "bucket_mb": 512, "update_mode": "abort_retry"},
        ),
        "rewards_where": (
            "slime scores in its rollout (generate_and_rm in the RolloutManager actor): each sample right after its "
            "generation, with a rule-based reward (--rm-type) or a remote reward model over HTTP (--rm-url); "
            "--group-rm scores the whole group once it is done. Nearest: the default (rewards.workers 0, after); a "
            "reward model is rewards.scorer model on a pool."
        ),
    },
    "miles": {
        "description": (
            "MILES. Reproduces: data buffer capacity factor 2.0 (buffer.mode=bounded, "
            "capacity 2 batches); --max-weight-staleness with unused samples retried "
            "(buffer.max_staleness=1, on_stale=requeue; 'drop' by override); TIS "
            "(correction.method=token_tis); NCCL sync (sync.protocol=collective, packed); "
            "retract, re-prefill, by default (sync.update_mode=abort_resume). Approximates: "
            "--max-weight-staleness has no default in our notes; 1 is Rollway's. Cannot "
            "reproduce: OPSM, CUDA IPC and delta sync (NCCL on GPU, gloo here)."
        ),
        "config": RunConfig(
            buffer={"mode": "bounded", "capacity": 2, "max_staleness": 1, "on_stale": "requeue"},
            correction={"method": "token_tis"},
            sync={"protocol": "collective", "packed": True, "update_mode": "abort_resume"},
        ),
        "rewards_where": (
            "As slime (MILES keeps slime's generate_and_rm): each sample scored in the rollout right after its "
            "generation, or the whole group with --group-rm. Nearest: the default (rewards.workers 0, after)."
        ),
    },
    "open-instruct": {
        "description": (
            "open-instruct grpo_fast. Reproduces: async_steps=1 (Cleanba-style: the prompt "
            "queue holds async_steps batches, so inference runs one batch ahead; "
            "buffer.mode=bounded, capacity 1, max_head_offpolicyness=1, max_staleness=1 — "
            "open-instruct has no drop knob, and the head never exceeds it); "
            "truncated_importance_sampling_ratio_cap=2.0 (correction.method=token_tis); "
            "NCCL broadcast of the whole model into vLLM (sync.protocol=collective, packed); "
            "inflight_updates with inflight_updates_recompute_kv_cache=False (sync."
            "update_mode=in_flight: stale KV). Approximates: async_steps is 8 in a recent "
            "snapshot (set buffer.max_head_offpolicyness and max_staleness to 8); PPO clip "
            "0.2/0.272 is a symmetric 0.2 here; the collective is NCCL on GPU, gloo here."
        ),
        "config": RunConfig(
            buffer={
                "mode": "bounded",
                "capacity": 1,
                "max_staleness": 1,
                "max_head_offpolicyness": 1,
                "on_stale": "drop",
            },
            correction={"method": "token_tis"},
            sync={"protocol": "collective", "packed": True, "update_mode": "in_flight"},
        ),
        "rewards_where": (
            "open-instruct scores in the vLLM actor itself: when every completion of a prompt is done, the actor runs "
            "the verifiers on the group and only then puts it on the results queue the learner reads. This is "
            "Rollway's default (rewards.workers 0, after: the inference worker scores each group it generated)."
        ),
    },
    "roll": {
        "description": (
            "ROLL (Alibaba). Reproduces: async_generation_ratio=1 (0, its default, is "
            "synchronous: preset sync) — a bounded buffer one batch ahead (buffer.mode="
            "bounded, capacity 1, max_head_offpolicyness=1); prompt groups started before "
            "global_step − ceil(async_generation_ratio) are deleted (max_staleness=1, "
            "on_stale=drop); train_infer_correction token-level IS with upper_bound=1.2 "
            "(correction.method=token_tis, trainer.tis_cap=1.2); NCCL broadcast in "
            "model_update_buffer_size_mb=1024 buckets (sync.protocol=collective, packed, "
            "bucket_mb=1024); pause_sampling, then paused requests resent with their "
            "pre_output_token_ids (sync.update_mode=abort_resume). Approximates: "
            "train_infer_correction is off by default in ROLL; its ratio filters and "
            "pg_variant choices are not modelled; colocated CUDA IPC sync is not either."
        ),
        "config": RunConfig(
            buffer={
                "mode": "bounded",
                "capacity": 1,
                "max_staleness": 1,
                "max_head_offpolicyness": 1,
                "on_stale": "drop",
            },
            correction={"method": "token_tis"},
            trainer={"tis_cap": 1.2},
            sync={"protocol": "collective", "packed": True, "bucket_mb": 1024, "update_mode": "abort_resume"},
        ),
        "rewards_where": (
            "ROLL scores on reward clusters: for each prompt, once its responses are done, the generate scheduler "
            "sends them to a worker of that domain's reward cluster (round robin) while other prompts keep generating. "
            "Nearest: a reward pool, rewards.workers ≥ 1 with mode after, which scores a generate call's groups when "
            "the call ends (by override; the preset keeps the default)."
        ),
    },
    "tunix": {
        "description": (
            "Tunix (Google, agentic learner). Reproduces: off_policy_steps=1 (0, its "
            "default, is synchronous) — prompt queue prefilled off_policy_steps+1 batches "
            "ahead into an unbounded train queue (buffer.mode=unbounded, "
            "max_head_offpolicyness=1); examples with policy_version − version > "
            "off_policy_steps skipped (max_staleness=1, on_stale=drop); PPO clip ε=0.2. "
            "Approximates: use_rollout_logps=True clips πθ against the rollout logprobs "
            "with no recompute and no IS weight; Rollway recomputes π_old and clips only "
            "(correction.method=none); JAX in-memory resharding is the Ray object store "
            "here (sync.protocol=object_store); no partial-rollout knob found (drain)."
        ),
        "config": RunConfig(
            buffer={"mode": "unbounded", "max_staleness": 1, "max_head_offpolicyness": 1, "on_stale": "drop"},
            correction={"method": "none"},
            sync={"protocol": "object_store", "update_mode": "drain"},
        ),
        "rewards_where": (
            "Tunix's agentic learner scores in the learner's own process: the environment returns a reward per "
            "trajectory (TaskEnvironment.step), and per finished group the rollout producer calls the reward_fns "
            "before computing advantages and queueing train examples. Nearest: the default (rewards.workers 0, after)."
        ),
    },
    "oat": {
        "description": (
            "OAT (Sail). Reproduces: asynchronous=True with sync_params_every=1 (inference "
            "one batch ahead: buffer.mode=double, max_staleness=1); tis_c=2.0 (correction."
            "method=token_tis); NCCL broadcast one parameter at a time (sync.protocol="
            "collective, packed=false); the learner waits until no actor is generating, "
            "then broadcasts (sync.update_mode=drain). Approximates: how far OAT's async "
            "mode runs ahead is not in our notes (one batch here); no staleness drop was "
            "found; the collective is NCCL on GPU, gloo here."
        ),
        "config": RunConfig(
            buffer={"mode": "double", "max_staleness": 1, "on_stale": "drop"},
            correction={"method": "token_tis"},
            sync={"protocol": "collective", "packed": False, "update_mode": "drain"},
        ),
        "rewards_where": (
            "OAT scores in its actor process: after generating a batch the actor asks the oracle (a rule-based "
            "verifier in-process, or a remote oracle server) for every response, then sends scored transitions to the "
            "learner. This is Rollway's default (rewards.workers 0, after)."
        ),
    },
    "torchforge": {
        "description": (
            "TorchForge (Meta). Reproduces: a replay-buffer actor fed by a rollout loop "
            "(buffer.mode=unbounded, one batch ahead); max_policy_age with age_evict "
            "dropping entries older than it (buffer.max_staleness=1, on_stale=drop); the "
            "GRPO example's loss has no behaviour-policy IS (correction.method=none); "
            "weights pushed to torchstore and pulled by the policy (sync.protocol="
            "object_store: a store both sides reach); no partial-rollout knob found "
            "(drain). Approximates: max_policy_age's value in the example config is not in "
            "our notes (1 here); its KL term to a reference model is not modelled."
        ),
        "config": RunConfig(
            buffer={"mode": "unbounded", "max_staleness": 1, "on_stale": "drop"},
            correction={"method": "none"},
            sync={"protocol": "object_store", "update_mode": "drain"},
        ),
        "rewards_where": (
            "TorchForge's GRPO app scores on a RewardActor service (its own process; one replica, no GPU, in the "
            "example configs): the rollout loop generates a prompt's group, then awaits the reward actor once per "
            "response. Nearest: rewards.workers 1 with mode after (by override; the preset keeps the default)."
        ),
    },
    # The survey's buffer categories for libraries whose other knobs our notes lack: the
    # buffer layout only, every other switch at Rollway's default.
    "art": {
        "description": (
            "ART (buffer layout only, from the survey): no buffer, synchronous — generate a "
            "batch, train, sync (mode=sync, buffer.mode=none, max_staleness=0). ART trains "
            "LoRA adapters: set lora.enabled=true and sync.protocol='lora' to match; other "
            "ART knobs are not modelled."
        ),
        "config": RunConfig(mode="sync", buffer={"mode": "none", "max_staleness": 0}),
        "rewards_where": (
            "ART scores in your client code: the rollout function you write sets each Trajectory's reward when it "
            "finishes (or RULER, an LLM judge, scores a whole group), before the groups go to the server to train. "
            "Nearest: the default (rewards.workers 0, after); a judge model is rewards.scorer model on a pool."
        ),
    },
    "verifiers": {
        "description": (
            "verifiers (buffer layout only, from the survey): a double buffer, the next "
            "batch generated while the trainer trains (buffer.mode=double, "
            "max_staleness=1); other verifiers knobs are not modelled."
        ),
        "config": RunConfig(buffer={"mode": "double", "max_staleness": 1}),
        "rewards_where": (
            "verifiers scores in the environment: after each rollout (or group, for group-level rubrics) its rubric's "
            "reward functions and judges score it, in the process that runs the environment (the trainer's, or an env "
            "server). Nearest: the default (rewards.workers 0, after)."
        ),
    },
    "atropos": {
        "description": (
            "Atropos (buffer layout only, from the survey): an unbounded rollout stream "
            "paced by the admission gate (buffer.mode=unbounded, max_staleness=1, one "
            "batch ahead); other Atropos knobs are not modelled."
        ),
        "config": RunConfig(buffer={"mode": "unbounded", "max_staleness": 1}),
        "rewards_where": (
            "Atropos scores in its environment servers: each environment generates a group through the inference "
            "server, scores it (its score method) and posts the scored group to the trajectory API, from which the "
            "trainer pulls batches. Nearest: the default (rewards.workers 0, after)."
        ),
    },
}

# Peers whose preset is named after them (descriptions name the peer; tests check it).
PEERS: dict[str, str] = {
    "trl-async": "TRL",
    "trl-async-lora": "TRL",
    "pipelinerl": "PipelineRL",
    "prime-rl": "PRIME-RL",
    "areal": "AReaL",
    "verl-fully-async": "verl",
    "skyrl": "SkyRL",
    "nemo-rl": "NeMo-RL",
    "slime": "slime",
    "miles": "MILES",
    "art": "ART",
    "verifiers": "verifiers",
    "atropos": "Atropos",
    "open-instruct": "open-instruct",
    "roll": "ROLL",
    "tunix": "Tunix",
    "oat": "OAT",
    "torchforge": "TorchForge",
}


class UnknownPreset(ValueError):
    pass


def build(name: str, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Preset `name` with `overrides` merged in; raises pydantic.ValidationError on a bad
    field and UnknownPreset on a bad name."""
    if name not in PRESETS:
        raise UnknownPreset(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    # The preset's own fields only: defaults it leaves alone stay RunConfig's to fill, so
    # a default that depends on another field (the warm start, off for a checkpoint or
    # the dataset task) follows the overrides as it does for a config without a preset.
    base = PRESETS[name]["config"].model_dump(exclude_unset=True)
    return RunConfig.model_validate(deep_merge(base, overrides or {}))
