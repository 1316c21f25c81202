"""Which fields take effect in which runs: the capability matrix.

Most fields of a RunConfig are read by every run. The ones here are read only where a
backend, a device, a sync protocol or a stage reads them. Set where nothing reads them,
they would parse cleanly and do nothing. Where that would change what the run is (vLLM's
engine arguments and a tensor-parallel split on the torch backend, a chunk size without
the pipelined reward stage, a verifier's cost without reward workers) a launch is
refused (`refusals`, through workers/run/admission.py `engine_errors`), naming the field
and what would read it. Where the run is the same with or without it (a collective's
packing on another protocol, the filesystem protocol's directory on another one, a
reward pool's resources in a run without one, vLLM's GPU memory share off GPUs, a
LoRA rank with LoRA off, an eval size with eval off, a loss setting the chosen
correction.method does not read, a KL estimator with no KL penalty) the launch goes
ahead and is warned
(`unread`: beside the run in the API's answer and on the launch form). docs/config.md
holds the table (`markdown`), written with the rest of the reference.

Every other field is in one of two lists: `EVERY_RUN` (read by every run, with a module
that reads it) and `REFUSED_ELSEWHERE` (refused where nothing reads it by a check that
runs first: the config's own validation, the task's, the model's). The three split the
config: tests/engine/test_capabilities.py holds that each field is in exactly one.

A field is "set" when it differs from its default (null for vLLM's knobs, where null
takes the engine's default for the device): a stored config cannot tell a default
written out from one left alone, and a default is what every run reads anyway.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from workers.config.run_config import RunConfig
from workers.rl_tasks import BUILTINS

# What a field is set against: one default config, built once at import.
_DEFAULT = RunConfig()

# InferenceConfig's fields that are vLLM's engine arguments (null: the default per device).
VLLM_ENGINE_KNOBS = (
    "enforce_eager",
    "max_num_seqs",
    "max_num_batched_tokens",
    "enable_prefix_caching",
    "enable_chunked_prefill",
)


@dataclass(frozen=True)
class Capability:
    """`field` (dotted) is read only where `honoured(cfg)`; `reader` names what reads it,
    `instead(cfg)` what the run uses instead, `fix` how to stop setting it."""

    field: str
    reader: str
    fix: str
    honoured: Callable[[RunConfig], bool]
    instead: Callable[[RunConfig], str]
    # True: the run is the same whether or not the field is read, so a launch setting it
    # where nothing reads it is warned, not refused. A function decides it per run, where
    # that depends on what stands in the field's way; `told` then says how, for the docs.
    harmless: bool | Callable[[RunConfig], bool] = False
    told: str = ""

    def is_harmless(self, cfg: RunConfig) -> bool:
        """Whether setting the field where `cfg` does not read it only warns."""
        return self.harmless(cfg) if callable(self.harmless) else self.harmless

    @property
    def set_elsewhere(self) -> str:
        """What the docs say a launch setting the field where nothing reads it gets."""
        if callable(self.harmless):
            return self.told
        return "warned" if self.harmless else "refused"

    def is_set(self, cfg: RunConfig) -> bool:
        """Whether `cfg` gives the field other than its default (module doc)."""
        return _value(cfg, self.field) != _value(_DEFAULT, self.field)

    def sentence(self, cfg: RunConfig) -> str | None:
        """What a launch of `cfg` is told about the field, or None where it is unset or read."""
        if not self.is_set(cfg) or self.honoured(cfg):
            return None
        return f"{self.field} is read only by {self.reader}, and {self.instead(cfg)}: {self.fix}"


def _value(cfg: RunConfig, dotted: str):
    section, name = dotted.split(".")
    return getattr(getattr(cfg, section), name)


def _this_runs(dotted: str) -> Callable[[RunConfig], str]:
    """What the run uses instead, where that is another field's value: "this run's
    sync.protocol is 'lora'"."""
    return lambda cfg: f"this run's {dotted} is {_value(cfg, dotted)!r}"


def _vllm(cfg: RunConfig) -> bool:
    return cfg.inference.backend == "vllm"


_backend = _this_runs("inference.backend")
_protocol = _this_runs("sync.protocol")
_method = _this_runs("correction.method")


def _no_reward_pool(cfg: RunConfig) -> str:
    return "this run has no reward pool (rewards.workers 0): its inference workers score their own groups"


def _flat_params_instead(cfg: RunConfig) -> str:
    if cfg.sync.protocol != "collective":
        return _protocol(cfg)
    if not cfg.sync.packed:
        return "this run's collective sends one tensor at a time (sync.packed false)"
    if cfg.inference.backend != "torch":
        return "this run's collective goes into vLLM's broadcast engine, which cuts its own chunks"
    return "this run's trainer is sharded (trainer.backend 'fsdp2'): its buckets stream from gathered shards"


# correction.method → the loss (workers/train/loss.py `LOSSES`) reads: the PPO clip in all
# but PipelineRL's REINFORCE, the IS cap in the truncating ones.
_PPO_CLIPPED = ("token_tis", "sequence_tis", "masked_is", "decoupled_ppo", "none")
_IS_CAPPED = ("token_tis", "sequence_tis", "decoupled_ppo")


def _loss_field(dotted: str, methods: tuple[str, ...], reader: str) -> Capability:
    """A loss setting read only under some correction.methods: warned elsewhere (the
    loss the run computes does not change)."""
    names = ", ".join(f"'{m}'" for m in methods)
    which = f"one of {names}" if len(methods) > 1 else names
    return Capability(
        field=dotted,
        reader=reader,
        fix=f"set correction.method to {which}, or leave {dotted} at its default",
        honoured=lambda cfg: cfg.correction.method in methods,
        instead=_method,
        harmless=True,
    )


def _switched(dotted: str, switch: str, on: Callable[[RunConfig], bool], reader: str, fix: str) -> Capability:
    """A field its own section turns off: read only where `switch` (a field's name) is
    on, and warned where it is off: the config says so itself."""
    return Capability(
        field=dotted,
        reader=reader,
        fix=fix,
        honoured=on,
        instead=lambda cfg: f"this run's {switch} is off",
        harmless=True,
    )


def _knob(name: str) -> Capability:
    return Capability(
        field=f"inference.{name}",
        reader="vLLM's engine (inference.backend 'vllm')",
        fix=f"set inference.backend to 'vllm', or inference.{name} to null",
        honoured=_vllm,
        instead=_backend,
    )


# The tasks that read task.min_len, max_len, alphabet and reward: the reverse and copy
# tasks, and a task of one's own (a dotted path), which is handed them and may.
_STRING_TASKS = ("reverse", "copy")


def _string_task(cfg: RunConfig) -> bool:
    return cfg.task.name in _STRING_TASKS or cfg.task.name not in BUILTINS


def _not_a_string_task(cfg: RunConfig) -> str:
    if not _string_task(cfg):
        return f"this run's task.name is {cfg.task.name!r}, which has its own"
    return "this run's prompts come from task.dataset"


def _scored_elsewhere(cfg: RunConfig) -> str:
    if not _string_task(cfg):
        return _not_a_string_task(cfg)
    return "this run's scores come from elsewhere (task.reward_funcs, or rewards.scorer 'model' with eval off)"


def _generated_prompts(cfg: RunConfig) -> bool:
    return _string_task(cfg) and cfg.task.dataset is None


def _can_go_stale(cfg: RunConfig) -> bool:
    """Whether any group can be older than the trainer: only where generation may run
    ahead of it (not mode 'sync', a buffer with a head) or overcommit admits groups
    that end after their batch. Elsewhere every group is on-policy."""
    return cfg.buffer.overcommit > 0 or (
        cfg.mode != "sync" and cfg.buffer.mode != "none" and cfg.buffer.max_head_offpolicyness != 0
    )


_STALE_READER = "a run where a group can go stale (generation ahead of the trainer, or buffer.overcommit ≥ 1)"


def _never_stale(cfg: RunConfig) -> str:
    return (
        "no group of this run can be older than the trainer (mode 'sync', buffer.mode 'none' or "
        "max_head_offpolicyness 0, and no overcommit)"
    )


def _source_is(source: str) -> Callable[[RunConfig], bool]:
    return lambda cfg: cfg.model.source == source


def _writes_checkpoints(cfg: RunConfig) -> bool:
    return bool(cfg.checkpoint.every_steps or cfg.checkpoint.at_end)


def _no_checkpoint(cfg: RunConfig) -> str:
    return "this run writes no checkpoint (checkpoint.every_steps 0, checkpoint.at_end false)"


def _buckets(cfg: RunConfig) -> bool:
    """Whether anything cuts the weights into sync.bucket_mb buckets: a sharded trainer
    (its sync, checkpoint and export stream gathered buckets), a packed collective, or
    vLLM's engines that the trainer drives (the broadcast between GPU pools, the CUDA IPC
    handles; a colocated collective on GPUs hands vLLM a state dict instead)."""
    sync, inf, place = cfg.sync, cfg.inference, cfg.placement
    driven = inf.backend == "vllm" and (
        sync.protocol == "cuda_ipc"
        or (sync.protocol == "collective" and not (place.devices == "gpu" and place.mode == "colocated"))
    )
    return cfg.trainer.backend == "fsdp2" or (sync.protocol == "collective" and sync.packed) or driven


def _truncated_sampling(cfg: RunConfig) -> bool:
    inf = cfg.inference
    return inf.top_k is not None or inf.top_p < 1.0 or inf.min_p > 0.0


CAPABILITIES: tuple[Capability, ...] = (
    *(_knob(name) for name in VLLM_ENGINE_KNOBS),
    Capability(
        field="inference.tensor_parallel_size",
        reader="vLLM (inference.backend 'vllm'), which splits a worker's model over several devices",
        fix="set inference.backend to 'vllm', or tensor_parallel_size to 1 and raise inference.num_workers instead",
        honoured=_vllm,
        instead=_backend,
    ),
    Capability(
        field="rewards.chunk_tokens",
        reader="the pipelined reward stage (rewards.mode 'pipelined'), which streams completions in chunks",
        fix="set rewards.mode to 'pipelined' (with rewards.workers ≥ 1), or rewards.chunk_tokens to 0",
        honoured=lambda cfg: cfg.rewards.mode == "pipelined",
        instead=_this_runs("rewards.mode"),
    ),
    Capability(
        field="rewards.verifier_cost_ms_per_token",
        reader="reward workers scoring with the verifier (rewards.workers ≥ 1, rewards.scorer 'verifier')",
        fix="set rewards.workers ≥ 1 with rewards.scorer 'verifier', or rewards.verifier_cost_ms_per_token to 0",
        honoured=lambda cfg: cfg.rewards.workers >= 1 and cfg.rewards.scorer == "verifier",
        instead=lambda cfg: (
            "this run's inference workers score their own groups (rewards.workers 0)"
            if cfg.rewards.workers == 0
            else _this_runs("rewards.scorer")(cfg)
        ),
    ),
    # Warned: the run is the same without them.
    Capability(
        field="inference.gpu_memory_utilization",
        reader="vLLM on GPUs (inference.backend 'vllm', placement.devices 'gpu'), which takes that share of a GPU",
        fix="leave inference.gpu_memory_utilization at its default, or run vLLM on GPUs",
        honoured=lambda cfg: _vllm(cfg) and cfg.placement.devices == "gpu",
        instead=lambda cfg: _backend(cfg) if not _vllm(cfg) else "this run's placement.devices is 'cpu'",
        harmless=True,
    ),
    Capability(
        field="sync.packed",
        reader="a collective (sync.protocol 'collective'), which broadcasts in buckets or tensor by tensor",
        fix="leave sync.packed at true, or set sync.protocol to 'collective'",
        honoured=lambda cfg: cfg.sync.protocol == "collective",
        instead=_protocol,
        harmless=True,
    ),
    Capability(
        field="sync.flat_params",
        reader=(
            "a packed collective from a trainer that is not sharded into torch workers (sync.protocol "
            "'collective', sync.packed, trainer.backend not 'fsdp2', inference.backend 'torch')"
        ),
        fix="leave sync.flat_params at true",
        honoured=lambda cfg: (
            cfg.sync.protocol == "collective"
            and cfg.sync.packed
            and cfg.inference.backend == "torch"
            and cfg.trainer.backend != "fsdp2"
        ),
        instead=_flat_params_instead,
        harmless=True,
    ),
    Capability(
        field="sync.directory",
        reader="the filesystem protocol (sync.protocol 'filesystem'), which writes each version there",
        fix="set sync.protocol to 'filesystem', or sync.directory to null",
        honoured=lambda cfg: cfg.sync.protocol == "filesystem",
        instead=_protocol,
        harmless=True,
    ),
    Capability(
        field="sync.keep_versions",
        reader="the filesystem protocol (sync.protocol 'filesystem'), which keeps that many versions on disk",
        fix="set sync.protocol to 'filesystem', or leave sync.keep_versions at its default",
        honoured=lambda cfg: cfg.sync.protocol == "filesystem",
        instead=_protocol,
        harmless=True,
    ),
    Capability(
        field="rewards.cpus_per_worker",
        reader="a reward pool (rewards.workers ≥ 1), whose workers each ask Ray for that many CPUs",
        fix="set rewards.workers ≥ 1, or leave rewards.cpus_per_worker at its default",
        honoured=lambda cfg: cfg.rewards.workers >= 1,
        instead=_no_reward_pool,
        harmless=True,
    ),
    Capability(
        field="placement.rewards_node",
        reader="a reward pool (rewards.workers ≥ 1), whose workers go to the nodes it names",
        fix="set rewards.workers ≥ 1, or placement.rewards_node to null",
        honoured=lambda cfg: cfg.rewards.workers >= 1,
        instead=_no_reward_pool,
        harmless=True,
    ),
    *(
        _switched(
            f"lora.{name}",
            "lora.enabled",
            lambda cfg: cfg.lora.enabled,
            "a run that trains LoRA adapters (lora.enabled true)",
            f"set lora.enabled to true, or leave lora.{name} at its default",
        )
        for name in ("rank", "alpha", "target_modules", "dropout")
    ),
    *(
        _switched(
            f"eval.{name}",
            "eval.every_steps",
            lambda cfg: cfg.eval.every_steps > 0,
            "a run that evaluates on held-out prompts (eval.every_steps ≥ 1)",
            f"set eval.every_steps ≥ 1, or leave eval.{name} at its default",
        )
        for name in ("num_prompts", "k", "temperature")
    ),
    # (trainer.clip_eps_high with 'pipelinerl_reinforce' is refused by the config itself.)
    _loss_field(
        "trainer.clip_eps",
        _PPO_CLIPPED,
        "the PPO-clipped losses (every correction.method but 'pipelinerl_reinforce', whose REINFORCE loss clips "
        "the IS weight at 1 + correction.reinforce_eps_hi)",
    ),
    _loss_field(
        "trainer.tis_cap",
        _IS_CAPPED,
        "the losses that cap or truncate the IS weight at it (correction.method 'token_tis', 'sequence_tis', "
        "'decoupled_ppo')",
    ),
    *(
        _loss_field(
            f"correction.{name}",
            ("masked_is",),
            "masked IS (correction.method 'masked_is'), which drops "
            "tokens whose weight is outside [mask_low, mask_high]",
        )
        for name in ("mask_low", "mask_high")
    ),
    _loss_field(
        "correction.reinforce_eps_hi",
        ("pipelinerl_reinforce",),
        "PipelineRL's REINFORCE loss (correction.method 'pipelinerl_reinforce'), which clips the IS weight at "
        "1 + reinforce_eps_hi",
    ),
    Capability(
        field="trainer.kl_estimator",
        reader="the KL penalty to the initial policy (trainer.kl_coef > 0), which it estimates",
        fix="set trainer.kl_coef above 0, or leave trainer.kl_estimator at its default",
        honoured=lambda cfg: cfg.trainer.kl_coef > 0,
        instead=lambda cfg: "this run's trainer.kl_coef is 0 (no KL penalty)",
        harmless=True,
    ),
    *(
        _switched(
            f"watchdog.{name}",
            "watchdog.enabled",
            lambda cfg: cfg.watchdog.enabled,
            "the watchdog (watchdog.enabled true), which sets each wait's deadline from it",
            f"set watchdog.enabled to true, or leave watchdog.{name} at its default",
        )
        for name in ("multiple", "floor_s", "ceiling_s")
    ),
    *(
        Capability(
            field=f"model.{name}",
            reader="the tiny model Rollway builds (model.source 'tiny'); a checkpoint has its own sizes",
            fix=f"set model.source to 'tiny', or leave model.{name} at its default",
            honoured=lambda cfg: cfg.model.source == "tiny",
            instead=_this_runs("model.source"),
            harmless=True,
        )
        for name in ("hidden_size", "num_layers", "num_heads", "intermediate_size", "max_position_embeddings")
    ),
    Capability(
        field="buffer.capacity",
        reader="a bounded buffer (buffer.mode 'bounded'); 'none' and 'double' fix their own, 'unbounded' has none",
        fix="set buffer.mode to 'bounded', or leave buffer.capacity at its default",
        honoured=lambda cfg: cfg.buffer.mode == "bounded",
        instead=_this_runs("buffer.mode"),
        harmless=True,
    ),
    Capability(
        field="checkpoint.keep_last",
        reader="a run that writes checkpoints (checkpoint.every_steps ≥ 1 or checkpoint.at_end), which keeps that many",
        fix="set checkpoint.every_steps ≥ 1 or checkpoint.at_end true, or leave checkpoint.keep_last at its default",
        honoured=_writes_checkpoints,
        instead=_no_checkpoint,
        harmless=True,
    ),
    _switched(
        "trainer.dynamic_sampling_max_batches",
        "trainer.dynamic_sampling",
        lambda cfg: cfg.trainer.dynamic_sampling,
        "dynamic sampling (trainer.dynamic_sampling true), which draws up to that many batches for one step",
        "set trainer.dynamic_sampling to true, or leave trainer.dynamic_sampling_max_batches at its default",
    ),
    *(
        Capability(
            field=f"model.{name}",
            reader=reader,
            fix=f"set model.source to '{source}', or model.{name} to null",
            honoured=_source_is(source),
            instead=_this_runs("model.source"),
            harmless=True,
        )
        for name, source, reader in (
            ("path", "path", "a model of one's own (model.source 'path'), loaded from that directory"),
            ("hub_id", "hub", "a Hub model (model.source 'hub'), loaded by that id"),
        )
    ),
    *(
        Capability(
            field=f"task.{name}",
            reader="the reverse and copy tasks' prompt generator (or a task of one's own, handed it), where "
            "prompts are not read from task.dataset",
            fix=f"leave task.{name} at its default",
            honoured=_generated_prompts,
            instead=_not_a_string_task,
            harmless=True,
        )
        for name in ("min_len", "max_len")
    ),
    Capability(
        field="task.alphabet",
        reader="the reverse and copy tasks (or a task of one's own), which draw prompts from it and, in a noisy "
        "warm start, corrupt demonstrations with it",
        fix="leave task.alphabet at its default",
        honoured=lambda cfg: (
            _string_task(cfg)
            and (cfg.task.dataset is None or (cfg.warm_start.noisy_steps > 0 and cfg.warm_start.label_noise > 0))
        ),
        instead=_not_a_string_task,
        harmless=True,
    ),
    Capability(
        field="task.reward",
        reader="the reverse and copy tasks' own verifier (or a task of one's own), where no task.reward_funcs "
        "replace it and a verifier scores (rewards.scorer 'verifier', or eval on)",
        fix="leave task.reward at its default",
        honoured=lambda cfg: (
            _string_task(cfg)
            and not cfg.task.reward_funcs
            and (cfg.rewards.scorer == "verifier" or cfg.eval.every_steps > 0)
        ),
        instead=_scored_elsewhere,
        harmless=True,
    ),
    *(
        Capability(
            field=f"warm_start.{name}",
            reader="the supervised warm start (warm_start.steps or warm_start.noisy_steps ≥ 1)",
            fix=f"leave warm_start.{name} at its default",
            honoured=lambda cfg: cfg.warm_start.steps + cfg.warm_start.noisy_steps > 0,
            instead=lambda cfg: "this run has no warm start (warm_start.steps and noisy_steps 0)",
            harmless=True,
        )
        for name in ("lr", "batch_size")
    ),
    Capability(
        field="warm_start.label_noise",
        reader="the noisy phase of the warm start (warm_start.noisy_steps ≥ 1)",
        fix="set warm_start.noisy_steps ≥ 1, or leave warm_start.label_noise at its default",
        honoured=lambda cfg: cfg.warm_start.noisy_steps > 0,
        instead=lambda cfg: "this run's warm_start.noisy_steps is 0",
        harmless=True,
    ),
    Capability(
        field="buffer.max_head_offpolicyness",
        reader="an async run's buffer (mode not 'sync', buffer.mode not 'none'), whose generation runs that many "
        "batches ahead",
        fix="leave buffer.max_head_offpolicyness unset",
        honoured=lambda cfg: cfg.mode != "sync" and cfg.buffer.mode != "none",
        instead=lambda cfg: (
            "this run's mode is 'sync' (generation never runs ahead)"
            if cfg.mode == "sync"
            else _this_runs("buffer.mode")(cfg)
        ),
        harmless=True,
    ),
    Capability(
        field="buffer.max_staleness",
        reader=_STALE_READER,
        fix="leave buffer.max_staleness at its default, or 0",
        # 0 says what a run without stale groups is (every group on-policy): the
        # synchronous presets write it.
        honoured=lambda cfg: _can_go_stale(cfg) or cfg.buffer.max_staleness == 0,
        instead=_never_stale,
        harmless=True,
    ),
    Capability(
        field="buffer.on_stale",
        reader=_STALE_READER,
        fix="leave buffer.on_stale at its default",
        honoured=_can_go_stale,
        instead=_never_stale,
        harmless=True,
    ),
    Capability(
        field="sync.bucket_mb",
        reader="what cuts the weights into buckets: a sharded trainer (trainer.backend 'fsdp2'), a packed "
        "collective, vLLM's broadcast or CUDA IPC engines",
        fix="leave sync.bucket_mb at its default",
        honoured=_buckets,
        instead=lambda cfg: f"this run's sync ({cfg.sync.protocol!r}) moves whole tensors or a whole state dict",
        harmless=True,
    ),
    Capability(
        field="correction.keep_sampling_mask",
        reader="the torch backend's sampler under a truncation (inference.top_k, top_p < 1 or min_p > 0), the "
        "only sampling with a set of tokens to mask",
        fix="set inference.top_k, top_p or min_p on the torch backend, or correction.keep_sampling_mask to false",
        honoured=lambda cfg: cfg.inference.backend == "torch" and _truncated_sampling(cfg),
        instead=lambda cfg: (
            _backend(cfg) if cfg.inference.backend != "torch" else "this run samples from the whole vocabulary"
        ),
        # vLLM 0.32 returns the mask from its V2 model runner only, which its CPU build
        # cannot run: a run asking for it there would train without the mask it asked for.
        # On the torch backend without a truncation there is no mask to keep.
        harmless=lambda cfg: cfg.inference.backend == "torch",
        told="refused off the torch backend; warned on it",
    ),
    Capability(
        field="checkpoint.max_restarts",
        reader="a run that writes checkpoints (checkpoint.every_steps ≥ 1 or checkpoint.at_end), which it resumes from",
        fix="set checkpoint.every_steps ≥ 1, or leave checkpoint.max_restarts at its default",
        honoured=_writes_checkpoints,
        instead=_no_checkpoint,
        harmless=True,
    ),
)


# The fields every run reads, each with a module that reads it (tests/engine/test_capabilities.py
# holds that the module does): a switch that picks what runs, or a number every run uses.
EVERY_RUN: dict[str, str] = {
    "mode": "workers/run/trainer_host.py",
    "seed": "workers/run/inference_host.py",
    "model.source": "workers/train/warmstart.py",
    "task.name": "workers/rl_tasks/__init__.py",
    "task.dataset": "workers/rollout/task_data.py",
    "task.reward_funcs": "workers/rl_tasks/__init__.py",
    "warm_start.steps": "workers/train/warmstart.py",
    "warm_start.noisy_steps": "workers/train/warmstart.py",
    "stop.max_steps": "workers/run/trainer_host.py",
    "stop.max_minutes": "workers/run/driver.py",
    "stop.target_reward": "workers/run/driver.py",
    "inference.backend": "workers/inference/backends.py",
    "inference.num_workers": "workers/run/spawn.py",
    "inference.cpus_per_worker": "workers/run/placement.py",
    "inference.max_new_tokens": "workers/rollout/generation.py",
    "inference.temperature": "workers/rollout/generation.py",
    "inference.top_k": "workers/inference/sampling.py",
    "inference.top_p": "workers/inference/sampling.py",
    "inference.min_p": "workers/inference/sampling.py",
    "inference.dtype": "workers/inference/backends.py",
    "buffer.mode": "workers/run/buffer.py",
    "buffer.unit": "workers/run/inference_host.py",
    "sync.protocol": "workers/sync/__init__.py",
    "sync.timeout_s": "workers/run/spawn.py",
    "sync.update_mode": "workers/rollout/partial_rollouts.py",
    "placement.devices": "workers/run/placement.py",
    "placement.mode": "workers/run/placement.py",
    "placement.strategy": "workers/run/placement.py",
    "placement.cpu_threads": "workers/run/placement.py",
    "placement.inference_node": "workers/run/placement.py",
    "placement.trainer_node": "workers/run/placement.py",
    "rewards.workers": "workers/run/spawn.py",
    "trainer.lr": "workers/train/trainer.py",
    "trainer.backend": "workers/run/trainer_host.py",
    "trainer.num_ranks": "workers/run/placement.py",
    "trainer.cpus_per_rank": "workers/run/placement.py",
    "trainer.batch_groups": "workers/run/buffer.py",
    "trainer.group_size": "workers/rollout/generation.py",
    "trainer.kl_coef": "workers/train/trainer.py",
    "trainer.loss_aggregation": "workers/train/loss.py",
    "trainer.advantage_scaling": "workers/train/trainer.py",
    "trainer.mask_truncated": "workers/train/trainer.py",
    "trainer.disable_dropout": "workers/train/trainer.py",
    "trainer.dynamic_sampling": "workers/run/buffer.py",
    "trainer.max_grad_norm": "workers/train/trainer.py",
    "trainer.minibatches": "workers/train/trainer.py",
    "trainer.weight_decay": "workers/train/trainer.py",
    "trainer.entropy_coef": "workers/train/trainer.py",
    "trainer.dtype": "workers/train/trainer.py",
    "trainer.micro_batch_rows": "workers/train/trainer.py",
    "trainer.gradient_checkpointing": "workers/train/trainer.py",
    "correction.method": "workers/train/loss.py",
    "lora.enabled": "workers/train/trainer.py",
    "eval.every_steps": "workers/run/inference_host.py",
    "checkpoint.every_steps": "workers/run/checkpoints.py",
    "checkpoint.at_end": "workers/run/driver.py",
    "watchdog.enabled": "workers/run/driver.py",
}

# The fields read only in some runs whose setting elsewhere is already refused before
# this table is asked, by the check named: the config's own validation, or the launch's
# (workers/run/runnable.py for what a task takes, workers/run/admission.py for what the
# model and the placement can give).
REFUSED_ELSEWHERE: dict[str, str] = {
    "task.options": "the task's own options model (workers/run/runnable.py): a task without one takes none",
    "task.reward_weights": "the config: weights need task.reward_funcs, one each",
    "trainer.clip_eps_high": "the config: 'pipelinerl_reinforce' has no PPO clip",
    "trainer.loss_constant": "the config: only trainer.loss_aggregation 'constant' divides by it",
    "correction.keep_routing": "admission (workers/run/admission.py): a model with experts (vLLM: prefix caching on)",
    "buffer.overcommit": "the config: only buffer.unit 'episode' hands the buffer groups that end after their batch",
    "sync.delta": "the config: only sync.protocol 'object_store' sends changes, in a narrow inference.dtype",
    "inference.sleep_level": "admission (workers/run/admission.py): vLLM colocated on GPUs in mode 'sync'",
    "rewards.mode": "the config: a reward pool (rewards.workers ≥ 1)",
    "rewards.scorer": "the config: a reward pool (rewards.workers ≥ 1)",
    "rewards.model_path": "the config: a reward pool scoring with a model (rewards.scorer 'model')",
    "rewards.gpus_per_worker": "the config: a reward pool (rewards.workers ≥ 1)",
    "rewards.credit": "the config: a reward pool (rewards.workers ≥ 1)",
}


def _told(cfg: RunConfig, harmless: bool) -> dict[str, str]:
    return {
        c.field: sentence
        for c in CAPABILITIES
        if c.is_harmless(cfg) is harmless and (sentence := c.sentence(cfg)) is not None
    }


def refusals(cfg: RunConfig) -> dict[str, str]:
    """{dotted field: why} for each field `cfg` sets where nothing reads it and the run
    would not be what the config says: a launch is refused."""
    return _told(cfg, harmless=False)


def unread(cfg: RunConfig) -> dict[str, str]:
    """{dotted field: why} for each field `cfg` sets where nothing reads it and the run is
    the same without it: a launch goes ahead, warned."""
    return _told(cfg, harmless=True)


def markdown() -> str:
    """The table docs/config.md holds: each field, what reads it, what a launch that sets
    it elsewhere gets, and the way out."""
    rows = [
        "| field | read only by | set elsewhere | way out |",
        "|---|---|---|---|",
        *(
            f"| [`{c.field}`](#{c.field.split('.')[0]}) | {c.reader} | {c.set_elsewhere} | {c.fix} |"
            for c in CAPABILITIES
        ),
    ]
    return "\n".join(rows) + "\n"


def _anchor(field: str) -> str:
    """The reference page's heading a field stands under (a top-level one: "top level")."""
    return field.split(".")[0] if "." in field else "top-level"


def markdown_every_run() -> str:
    """The fields every run reads, each with a module that reads it."""
    rows = ["| read by every run | in |", "|---|---|"]
    rows += [f"| [`{field}`](#{_anchor(field)}) | `{module}` |" for field, module in EVERY_RUN.items()]
    return "\n".join(rows) + "\n"


def markdown_refused_elsewhere() -> str:
    """The fields refused, where nothing reads them, before this table is asked."""
    rows = ["| refused where unread | by what; where it is read |", "|---|---|"]
    rows += [f"| [`{field}`](#{_anchor(field)}) | {check} |" for field, check in REFUSED_ELSEWHERE.items()]
    return "\n".join(rows) + "\n"
