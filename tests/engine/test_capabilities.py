"""The capability matrix (workers/config/capabilities.py): each field read only in some
runs is refused at launch where nothing reads it, naming the field, what reads it and
the way out; where the table says a field is read, the code that reads it does."""

from __future__ import annotations

import itertools

import pytest

from workers.config import capabilities
from workers.config.capabilities import CAPABILITIES, VLLM_ENGINE_KNOBS, ignored
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
}
BACKENDS = ("torch", "vllm")
PROTOCOLS = ("object_store", "collective", "filesystem")
DEVICES = ("cpu", "gpu")
# The reward stage's layouts: none (inference workers score), a pool scoring each
# completion after it, a pool scoring chunks as they are generated.
REWARDS = ({}, {"workers": 1}, {"workers": 1, "mode": "pipelined"})


def nested(dotted: str, value) -> dict:
    section, name = dotted.split(".")
    return {section: {name: value}}


def combination(backend: str, protocol: str, devices: str, layout: dict | None = None, **extra) -> dict:
    base = {
        "inference": {"backend": backend},
        "sync": {"protocol": protocol},
        "placement": {"devices": devices},
        "rewards": dict(layout or {}),
    }
    for key, value in extra.items():
        base[key] = {**base.get(key, {}), **value}
    return base


def test_every_field_of_the_table_is_a_field_of_the_config_and_has_a_setting_value():
    fields = {c.field for c in CAPABILITIES}
    assert fields == set(SET)
    for field in fields:
        section, name = field.split(".")
        assert name in type(getattr(RunConfig(), section)).model_fields
    assert ignored(RunConfig()) == {}  # the defaults set none of them


@pytest.mark.parametrize("capability", CAPABILITIES, ids=lambda c: c.field)
def test_each_field_is_refused_exactly_where_nothing_reads_it(capability):
    checked = 0
    for backend, protocol, devices, rewards in itertools.product(BACKENDS, PROTOCOLS, DEVICES, REWARDS):
        data = combination(backend, protocol, devices, rewards, **nested(capability.field, SET[capability.field]))
        try:
            cfg = RunConfig.model_validate(data)
        except ValueError:
            continue  # a combination the config refuses for another reason
        checked += 1
        errors = engine_errors(cfg)
        read = capability.honoured(cfg)
        assert (capability.field in errors) is not read, (data, errors)
        if not read:
            sentence = errors[capability.field]
            assert sentence.startswith(f"{capability.field} is read only by ") and capability.fix in sentence
    assert checked >= 4


def test_where_the_table_says_vllm_reads_a_knob_its_engine_arguments_carry_it(monkeypatch):
    monkeypatch.setattr(vllm_backend, "_check_cpu_head_dim", lambda dims: None)
    dims = ModelDims(
        hidden=64, layers=2, heads=2, kv_heads=2, head_dim=32, intermediate=128, vocab=40, positions=64, tied=False
    )
    for name in (*VLLM_ENGINE_KNOBS, "tensor_parallel_size"):
        field = f"inference.{name}"
        cfg = RunConfig.model_validate(combination("vllm", "object_store", "gpu", **nested(field, SET[field])))
        assert next(c for c in CAPABILITIES if c.field == field).honoured(cfg)
        args = vllm_backend._engine_args("/m", dims, 48, cfg.inference, False, None, "float32", None, False, "nccl")
        assert args[name] == SET[field], name


def test_where_the_table_says_a_reward_stage_reads_a_field_it_does():
    from workers.rollout.reward_stage import VerifierScorer

    cfg = RunConfig.model_validate({"rewards": {"workers": 1, "verifier_cost_ms_per_token": 0.5}})
    assert not ignored(cfg) and VerifierScorer(cfg).cost_s_per_token == 0.0005
    refused = ignored(RunConfig.model_validate({"rewards": {"verifier_cost_ms_per_token": 0.5}}))
    assert (
        "inference workers score their own groups (rewards.workers 0)" in refused["rewards.verifier_cost_ms_per_token"]
    )
    assert (
        "rewards.mode is 'after'"
        in ignored(RunConfig.model_validate({"rewards": {"chunk_tokens": 16}}))["rewards.chunk_tokens"]
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
        assert f"| [`{c.field}`](#{c.field.split('.')[0]}) | {c.reader} | {c.fix} |" in page
