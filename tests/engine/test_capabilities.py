"""The capability matrix (workers/config/capabilities.py): each field read only in some
runs is refused at launch where nothing reads it (or, where the run is the same without
it, warned), naming the field, what reads it and the way out; where the table says a
field is read, the code that reads it does."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from pydantic import BaseModel

from workers.config import capabilities
from workers.config.capabilities import (
    CAPABILITIES,
    EVERY_RUN,
    REFUSED_ELSEWHERE,
    VLLM_ENGINE_KNOBS,
    refusals,
    unread,
)
from workers.config.presets import PRESETS, build
from workers.config.reference import render
from workers.config.run_config import RunConfig
from workers.inference import vllm_backend
from workers.model.loading import ModelDims
from workers.run.admission import Limits, admission_errors, engine_errors

# A value that sets each field (its default leaves it unset).
SET = {
    "inference.enforce_eager": False,
    "inference.max_num_seqs": 8,
    "inference.max_num_batched_tokens": 4096,
    "inference.enable_prefix_caching": True,
    "inference.enable_chunked_prefill": False,
    "inference.tensor_parallel_size": 2,
    "rewards.chunk_tokens": 16,
    "rewards.verifier_cost_ms_per_token": 0.5,
    "inference.gpu_memory_utilization": 0.5,
    "sync.packed": False,
    "sync.flat_params": False,
    "sync.directory": "/shared/sync",
    "sync.keep_versions": 4,
    "rewards.cpus_per_worker": 0.5,
    "placement.rewards_node": "pool=rewards",
    "lora.rank": 4,
    "lora.alpha": 8.0,
    "lora.target_modules": ["q_proj", "v_proj"],
    "lora.dropout": 0.05,
    "eval.num_prompts": 8,
    "eval.k": 2,
    "eval.temperature": 0.7,
    "trainer.dynamic_sampling_max_batches": 3,
    "trainer.clip_eps": 0.1,
    "trainer.tis_cap": 1.5,
    "correction.mask_low": 0.4,
    "correction.mask_high": 3.0,
    "correction.reinforce_eps_hi": 0.05,
    "trainer.kl_estimator": "k1",
    "watchdog.multiple": 20.0,
    "watchdog.floor_s": 30.0,
    "watchdog.ceiling_s": 900.0,
    "checkpoint.keep_last": 5,
    "model.hidden_size": 48,
    "model.num_layers": 3,
    "model.num_heads": 8,
    "model.intermediate_size": 96,
    "model.max_position_embeddings": 96,
    "buffer.capacity": 3,
    "model.path": "/models/own",
    "model.hub_id": "org/model",
    "task.min_len": 2,
    "task.max_len": 6,
    "task.alphabet": "abcd",
    "task.reward": "exact",
    "warm_start.lr": 0.01,
    "warm_start.batch_size": 32,
    "warm_start.label_noise": 0.3,
    "buffer.max_head_offpolicyness": 1,
    "buffer.max_staleness": 3,
    "buffer.on_stale": "requeue",
    "sync.bucket_mb": 8.0,
    "correction.keep_sampling_mask": True,
    "checkpoint.max_restarts": 2,
}
BACKENDS = ("torch", "vllm")
PROTOCOLS = ("object_store", "collective", "filesystem")
TRAINERS = ({}, {"backend": "fsdp2", "num_ranks": 2})
# The switches a section turns its own fields on with: the defaults (token TIS, no KL
# penalty, the watchdog on, a checkpoint at the end), the off ones on (with masked IS and
# a KL penalty), and PipelineRL's REINFORCE loss with the watchdog and checkpoints off, a
# stream for a buffer and a checkpoint of one's own for a model; and a synchronous run of
# a Hub model on the countdown task, without a warm start, sampling under a top-p.
SWITCHES = (
    {},
    {
        "lora": {"enabled": True},
        "eval": {"every_steps": 2},
        "trainer": {"dynamic_sampling": True, "kl_coef": 0.01},
        "correction": {"method": "masked_is"},
    },
    {
        "correction": {"method": "pipelinerl_reinforce"},
        "watchdog": {"enabled": False},
        "checkpoint": {"at_end": False},
        "buffer": {"mode": "unbounded"},
        "model": {"source": "path", "path": "/models/own"},
    },
    {
        "mode": "sync",
        "model": {"source": "hub", "hub_id": "org/model"},
        "task": {"name": "countdown"},
        "warm_start": {"steps": 0, "noisy_steps": 0},
        "inference": {"top_p": 0.9},
    },
)
DEVICES = ("cpu", "gpu")
# The reward stage's layouts: none (inference workers score), a pool scoring each
# completion after it, a pool scoring chunks as they are generated.
REWARDS = ({}, {"workers": 1}, {"workers": 1, "mode": "pipelined"})


def nested(dotted: str, value) -> dict:
    if "." not in dotted:
        return {dotted: value}
    section, name = dotted.split(".")
    return {section: {name: value}}


def combination(
    backend: str,
    protocol: str,
    devices: str,
    layout: dict | None = None,
    pool: dict | None = None,
    switches: dict | None = None,
    **extra,
) -> dict:
    base = {
        "inference": {"backend": backend},
        "sync": {"protocol": protocol},
        "placement": {"devices": devices},
        "rewards": dict(layout or {}),
        "trainer": dict(pool or {}),
    }
    for extras in (switches or {}, extra):
        for key, value in extras.items():
            base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
    return base


def test_every_field_of_the_table_is_a_field_of_the_config_and_has_a_setting_value():
    fields = {c.field for c in CAPABILITIES}
    assert fields == set(SET)
    for field in fields:
        section, name = field.split(".")
        assert name in type(getattr(RunConfig(), section)).model_fields
    assert refusals(RunConfig()) == unread(RunConfig()) == {}  # the defaults set none of them


def dotted_fields() -> set[str]:
    fields = set()
    for section, info in RunConfig.model_fields.items():
        model = info.annotation
        if isinstance(model, type) and issubclass(model, BaseModel):
            fields |= {f"{section}.{name}" for name in model.model_fields}
        else:
            fields.add(section)
    return fields


def test_every_field_of_the_config_is_read_by_every_run_read_by_some_or_refused_elsewhere():
    """The three lists split the config: a field is in exactly one, so a new field
    cannot go unclassified."""
    lists = ([c.field for c in CAPABILITIES], list(EVERY_RUN), list(REFUSED_ELSEWHERE))
    together = [field for fields in lists for field in fields]
    assert len(together) == len(set(together))
    assert set(together) == dotted_fields()


@pytest.mark.parametrize("field", sorted(EVERY_RUN))
def test_the_module_named_for_a_field_every_run_reads_reads_it(field):
    """The module the list names reads the field as the config's attribute (`.name`),
    outside comments and docstrings' prose as far as a token scan tells."""
    import io
    import tokenize

    path = Path(__file__).resolve().parents[2] / EVERY_RUN[field]
    name = field.rsplit(".", 1)[-1]
    tokens = [
        t
        for t in tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
        if t.type == tokenize.NAME or t.string == "."
    ]
    assert any(a.string == "." and b.string == name for a, b in itertools.pairwise(tokens)), (field, str(path))


# For each field refused elsewhere: a value, a config where nothing reads it (refused,
# naming the field) and one where it is read (let through).
ELSEWHERE = {
    "task.options": ({"max_number": 9}, {}, {"task": {"name": "countdown"}, "inference": {"max_new_tokens": 16}}),
    "task.reward_weights": ([1.0], {}, {"task": {"reward_funcs": ["pkg.mod:fn"]}}),
    "trainer.clip_eps_high": (0.28, {"correction": {"method": "pipelinerl_reinforce"}}, {}),
    "trainer.loss_constant": (64.0, {}, {"trainer": {"loss_aggregation": "constant"}}),
    "correction.keep_routing": (True, {}, None),  # read: an MoE checkpoint (tests/engine/test_routing*.py)
    "buffer.overcommit": (1, {}, {"buffer": {"unit": "episode"}, "task": {"name": "propose_solve"}}),
    "sync.delta": (True, {"sync": {"protocol": "filesystem"}}, {"inference": {"dtype": "bfloat16"}}),
    "inference.sleep_level": (1, {}, None),  # read: tests/engine/test_driver_vllm.py (a colocated run on GPUs)
    "rewards.mode": ("pipelined", {}, {"rewards": {"workers": 1}}),
    "rewards.scorer": ("model", {}, {"rewards": {"workers": 1, "model_path": "/models/rm"}}),
    "rewards.model_path": ("/models/rm", {"rewards": {"workers": 1}}, {"rewards": {"workers": 1, "scorer": "model"}}),
    "rewards.gpus_per_worker": (0.5, {}, {"rewards": {"workers": 1}, "placement": {"devices": "gpu"}}),
    "rewards.credit": ("process", {}, {"rewards": {"workers": 1, "mode": "pipelined"}}),
}


def refused_by_any_check(data: dict) -> str:
    """What the config's validation, the task's check and the launch's engine and model
    checks say of `data`, as one text ('' when all let it through)."""
    from workers.run.admission import model_errors
    from workers.run.runnable import check_runnable

    try:
        cfg = RunConfig.model_validate(data)
        check_runnable(cfg)
    except ValueError as exc:
        return str(exc)
    return " ".join([*engine_errors(cfg).values(), *model_errors(cfg).values()])


@pytest.mark.parametrize("field", sorted(REFUSED_ELSEWHERE))
def test_a_field_refused_elsewhere_is_refused_where_nothing_reads_it(field):
    assert set(ELSEWHERE) == set(REFUSED_ELSEWHERE)
    value, unread_in, read_in = ELSEWHERE[field]
    set_field = nested(field, value)

    def merged(base: dict) -> dict:
        return {k: {**base.get(k, {}), **set_field.get(k, {})} for k in {*base, *set_field}}

    assert field in refused_by_any_check(merged(unread_in))
    if read_in is not None:
        assert field not in refused_by_any_check(merged(read_in)), read_in


@pytest.mark.parametrize("capability", CAPABILITIES, ids=lambda c: c.field)
def test_each_field_is_refused_or_warned_exactly_where_nothing_reads_it(capability):
    """Over every inference backend, protocol, device, reward layout, trainer (one rank,
    or a sharded pool) and the sections' own switches (off, on): a refused field stops the
    launch (`engine_errors`, what admission answers) and a harmless one only warns, each
    exactly where the field is not read, with the sentence naming it and the way out."""
    checked = read_somewhere = 0
    for backend, protocol, devices, rewards, pool, switches in itertools.product(
        BACKENDS, PROTOCOLS, DEVICES, REWARDS, TRAINERS, SWITCHES
    ):
        data = combination(
            backend, protocol, devices, rewards, pool, switches, **nested(capability.field, SET[capability.field])
        )
        try:
            cfg = RunConfig.model_validate(data)
        except ValueError:
            continue  # a combination the config refuses for another reason
        checked += 1
        errors, warned = engine_errors(cfg), unread(cfg)
        harmless = capability.is_harmless(cfg)
        told = warned if harmless else errors
        read = capability.honoured(cfg)
        read_somewhere += read
        assert (capability.field in told) is not read, (data, errors, warned)
        assert capability.field not in (errors if harmless else warned), (data, errors, warned)
        if not read:
            sentence = told[capability.field]
            assert sentence.startswith(f"{capability.field} is read only by ") and capability.fix in sentence
    assert checked >= 4 and 0 < read_somewhere < checked  # read in some combinations, not in others


def test_no_preset_sets_a_field_its_runs_do_not_read():
    for name in PRESETS:
        cfg = build(name, {})
        assert refusals(cfg) == unread(cfg) == {}, name


def test_where_the_table_says_vllm_reads_a_knob_its_engine_arguments_carry_it(monkeypatch):
    monkeypatch.setattr(vllm_backend, "_check_cpu_head_dim", lambda dims: None)
    dims = ModelDims(
        hidden=64, layers=2, heads=2, kv_heads=2, head_dim=32, intermediate=128, vocab=40, positions=64, tied=False
    )
    for name in (*VLLM_ENGINE_KNOBS, "tensor_parallel_size", "gpu_memory_utilization"):
        field = f"inference.{name}"
        cfg = RunConfig.model_validate(combination("vllm", "object_store", "gpu", **nested(field, SET[field])))
        assert next(c for c in CAPABILITIES if c.field == field).honoured(cfg)
        args = vllm_backend._engine_args("/m", dims, 48, cfg.inference, False, None, "float32", None, False, "nccl")
        assert args[name] == SET[field], name


def test_where_the_table_says_a_reward_stage_reads_a_field_it_does():
    from workers.rollout.reward_stage import VerifierScorer

    cfg = RunConfig.model_validate({"rewards": {"workers": 1, "verifier_cost_ms_per_token": 0.5}})
    assert not refusals(cfg) and VerifierScorer(cfg).cost_s_per_token == 0.0005
    refused = refusals(RunConfig.model_validate({"rewards": {"verifier_cost_ms_per_token": 0.5}}))
    assert (
        "inference workers score their own groups (rewards.workers 0)" in refused["rewards.verifier_cost_ms_per_token"]
    )
    assert (
        "rewards.mode is 'after'"
        in refusals(RunConfig.model_validate({"rewards": {"chunk_tokens": 16}}))["rewards.chunk_tokens"]
    )


def test_a_launch_refusal_names_the_field_and_the_way_out():
    cfg = RunConfig.model_validate({"inference": {"tensor_parallel_size": 2}})
    errors = admission_errors(cfg, Limits(), None)
    assert errors["inference.tensor_parallel_size"] == (
        "inference.tensor_parallel_size is read only by vLLM (inference.backend 'vllm'), which splits a "
        "worker's model over several devices, and this run's inference.backend is 'torch': set "
        "inference.backend to 'vllm', or tensor_parallel_size to 1 and raise inference.num_workers instead"
    )


def test_the_reference_page_holds_the_table():
    page = render()
    assert "## Fields read only in some runs" in page
    assert capabilities.markdown() in page + "\n"
    for c in CAPABILITIES:
        told = c.told if callable(c.harmless) else ("warned" if c.harmless else "refused")
        assert told and f"| [`{c.field}`](#{c.field.split('.')[0]}) | {c.reader} | {told} | {c.fix} |" in page


def test_the_reference_page_holds_the_other_two_lists():
    page = render()
    assert capabilities.markdown_every_run() in page + "\n"
    assert capabilities.markdown_refused_elsewhere() in page + "\n"


def test_a_hub_id_names_the_export_only_of_a_hub_model():
    from workers.train.export import export_model_name

    assert export_model_name(RunConfig.model_validate({"model": {"hub_id": "org/model"}})) is None
    hub = RunConfig.model_validate({"model": {"source": "hub", "hub_id": "org/model"}})
    assert export_model_name(hub) == "org/model"


def test_where_the_table_says_a_sync_protocol_reads_a_field_it_does(tmp_path):
    from workers.sync.collective import CollectiveSender
    from workers.sync.filesystem import FilesystemSender

    cfg = RunConfig.model_validate({"sync": {"protocol": "collective", "flat_params": False}})
    assert not unread(cfg) and CollectiveSender(cfg.sync, 1).flat_params is False
    cfg = RunConfig.model_validate({"sync": {"protocol": "collective", "packed": False}})
    assert not unread(cfg) and CollectiveSender(cfg.sync, 1).mode == "per_tensor"
    cfg = RunConfig.model_validate({"sync": {"protocol": "filesystem", "directory": str(tmp_path), "keep_versions": 4}})
    assert not unread(cfg)
    files = FilesystemSender(cfg.sync, str(tmp_path / "scratch"))
    assert files.keep_versions == 4 and str(tmp_path) in str(files.directory)


def test_where_the_table_says_a_reward_pool_reads_a_field_it_does():
    from workers.run import placement

    cfg = RunConfig.model_validate(
        {
            "placement": {"devices": "gpu", "rewards_node": "pool=rewards"},
            "rewards": {"workers": 2, "cpus_per_worker": 0.5, "gpus_per_worker": 0.5},
        }
    )
    assert not unread(cfg) and not refusals(cfg)
    p = placement.plan(cfg)
    assert p.bundles[-2:] == [{"CPU": 0.5, "GPU": 0.5}] * 2 and [s.num_gpus for s in p.rewards] == [0.5, 0.5]
    assert p.selectors[-2:] == [{"pool": "rewards"}] * 2


def test_where_the_table_says_lora_reads_a_field_it_does(tiny_model_dir):
    from workers.model.loading import load_model
    from workers.model.lora import apply_lora

    cfg = RunConfig.model_validate({"lora": {"enabled": True, "rank": 4, "alpha": 8.0, "dropout": 0.05}})
    assert not unread(cfg)
    peft = apply_lora(load_model(tiny_model_dir), cfg.lora).peft_config["default"]
    assert (peft.r, peft.lora_alpha, peft.lora_dropout) == (4, 8.0, 0.05)


LOSS_FIELDS = (
    "trainer.clip_eps",
    "trainer.tis_cap",
    "correction.mask_low",
    "correction.mask_high",
    "correction.reinforce_eps_hi",
    "trainer.kl_estimator",
)


@pytest.mark.parametrize("field", LOSS_FIELDS)
def test_where_the_table_says_the_loss_reads_a_field_it_does_and_nowhere_else(field):
    """For every correction.method, with and without a KL penalty: the loss and its
    statistics change with the field exactly where the table says the field is read.
    The policies are far apart (ratios 0.1-10), so every clip, cap and mask bites."""
    import torch

    from workers.train.loss import METHODS, correction_loss

    g = torch.Generator().manual_seed(0)
    shape = (4, 16)
    logp, old_logp, behaviour, ref = (-torch.rand(shape, generator=g) * 3 for _ in range(4))
    advantages, mask = torch.randn(shape, generator=g), torch.ones(shape)
    capability = next(c for c in CAPABILITIES if c.field == field)
    read_under = []
    for method in METHODS:
        for kl_coef in (0.0, 0.1):
            fields = {"correction": {"method": method}, "trainer": {"kl_coef": kl_coef}}
            default = RunConfig.model_validate(fields)
            changed = RunConfig.model_validate(
                {**fields, **{k: {**fields.get(k, {}), **v} for k, v in nested(field, SET[field]).items()}}
            )

            def loss(cfg):
                total, stats = correction_loss(
                    cfg.trainer, cfg.correction, logp, old_logp, behaviour, advantages, mask, ref_logp=ref
                )
                return total.item(), stats

            moved = loss(default) != loss(changed)
            assert moved is capability.honoured(changed), (field, method, kl_coef)
            read_under.append(moved)
    assert any(read_under) and not all(read_under)


def test_the_status_page_counts_the_fields_as_the_lists_do():
    text = " ".join((Path(__file__).resolve().parents[2] / "docs/status.md").read_text().split())
    assert f"each of a run config's {len(dotted_fields())} fields is read by every run ({len(EVERY_RUN)}," in text
    assert f"read only in some ({len(CAPABILITIES)}:" in text
    assert f"by the config's own checks ({len(REFUSED_ELSEWHERE)})" in text


def test_each_unread_task_setting_names_its_own_reason():
    """The reverse task's reward is unread beside reward functions, whatever the prompts'
    source; its lengths are unread where the prompts come from a dataset."""
    with_funcs = RunConfig.model_validate(
        {"task": {"reward": "exact", "reward_funcs": ["pkg.mod:fn"], "dataset": {"path": "/data/rows.jsonl"}}}
    )
    assert "scores come from elsewhere" in unread(with_funcs)["task.reward"]
    lengths = RunConfig.model_validate({"task": {"max_len": 6, "dataset": {"path": "/data/rows.jsonl"}}})
    assert "prompts come from task.dataset" in unread(lengths)["task.max_len"]
