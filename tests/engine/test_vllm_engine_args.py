"""vLLM's engine knobs (inference.enforce_eager, max_num_seqs, max_num_batched_tokens,
enable_prefix_caching, enable_chunked_prefill): the engine arguments built from them on
the CPU and on a GPU (a pure function: no engine starts), and the launch refusals where
a backend or device cannot take them."""

from __future__ import annotations

import importlib

import pytest

from workers.config.run_config import InferenceConfig, RunConfig
from workers.inference import vllm_backend
from workers.inference.base import VLLM_MAX_NUM_SEQS
from workers.model.loading import ModelDims
from workers.run.admission import Limits, admission_errors, demand, engine_errors

DIMS = ModelDims(
    hidden=64, layers=2, heads=2, kv_heads=2, head_dim=32, intermediate=128, vocab=40, positions=64, tied=False
)
CONTEXT = 48


@pytest.fixture(autouse=True)
def _no_vllm_head_check(monkeypatch):
    # The CPU head-size check reads vLLM's kernel list (an `import vllm`); these tests
    # are about the arguments only.
    monkeypatch.setattr(vllm_backend, "_check_cpu_head_dim", lambda dims: None)


def engine_args(on_cpu: bool, caller_seqs: int | None = None, **inference) -> dict:
    return vllm_backend._engine_args(
        "/models/m",
        DIMS,
        CONTEXT,
        InferenceConfig(backend="vllm", **inference),
        on_cpu,
        caller_seqs,
        "float32",
        None,
        False,
        "rollway_memory" if on_cpu else "nccl",
    )


def test_on_the_cpu_null_knobs_take_rollways_defaults():
    args = engine_args(on_cpu=True)
    assert args["enforce_eager"] is True
    assert args["max_num_seqs"] == VLLM_MAX_NUM_SEQS
    assert args["enable_chunked_prefill"] is False
    assert args["max_num_batched_tokens"] == 4096
    assert "enable_prefix_caching" not in args  # vLLM's own default
    assert "gpu_memory_utilization" not in args


def test_on_a_gpu_null_knobs_are_left_to_vllm():
    args = engine_args(on_cpu=False)
    for name in (
        "enforce_eager",
        "max_num_seqs",
        "max_num_batched_tokens",
        "enable_chunked_prefill",
        "enable_prefix_caching",
        "kv_cache_memory_bytes",
    ):
        assert name not in args, name
    assert args["gpu_memory_utilization"] == 0.3


def test_on_a_gpu_each_set_knob_reaches_vllm_under_its_own_name():
    knobs = {
        "enforce_eager": True,
        "max_num_seqs": 64,
        "max_num_batched_tokens": 2048,
        "enable_prefix_caching": False,
        "enable_chunked_prefill": True,
        "gpu_memory_utilization": 0.6,
    }
    args = engine_args(on_cpu=False, **knobs)
    assert {name: args[name] for name in knobs} == knobs


def test_on_the_cpu_set_knobs_reach_vllm_and_size_its_kv_cache():
    small = engine_args(
        on_cpu=True, enforce_eager=False, max_num_seqs=16, max_num_batched_tokens=512, enable_prefix_caching=False
    )
    assert (small["enforce_eager"], small["max_num_seqs"], small["max_num_batched_tokens"]) == (False, 16, 512)
    assert small["enable_prefix_caching"] is False
    assert small["kv_cache_memory_bytes"] < engine_args(on_cpu=True)["kv_cache_memory_bytes"]


def test_a_max_num_seqs_the_caller_passes_wins_over_the_configs():
    assert engine_args(on_cpu=True, caller_seqs=8, max_num_seqs=32)["max_num_seqs"] == 8
    assert engine_args(on_cpu=False, caller_seqs=8)["max_num_seqs"] == 8


def test_on_the_cpu_chunked_prefill_and_a_step_shorter_than_the_context_are_refused_naming_the_field():
    with pytest.raises(ValueError, match="inference.enable_chunked_prefill true cannot run on vLLM-CPU"):
        engine_args(on_cpu=True, enable_chunked_prefill=True)
    with pytest.raises(ValueError, match=r"inference.max_num_batched_tokens \(32\) must be ≥ the run's context \(48"):
        engine_args(on_cpu=True, max_num_batched_tokens=32)
    assert engine_args(on_cpu=False, max_num_batched_tokens=32)["max_num_batched_tokens"] == 32  # GPU: chunked


def test_vllms_knobs_on_the_torch_backend_are_refused_at_launch_naming_each_field():
    run = RunConfig.model_validate({"inference": {"enforce_eager": False, "max_num_seqs": 8}})
    errors = admission_errors(run, Limits(), None)
    assert set(errors) == {"inference.enforce_eager", "inference.max_num_seqs"}
    assert "this run's inference.backend is 'torch'" in errors["inference.max_num_seqs"]
    assert engine_errors(RunConfig.model_validate({"inference": {"backend": "vllm", "max_num_seqs": 8}})) == {}


def test_chunked_prefill_on_vllm_cpu_is_refused_at_launch_and_allowed_on_gpus():
    inference = {"backend": "vllm", "enable_chunked_prefill": True}
    errors = engine_errors(RunConfig.model_validate({"inference": inference}))
    assert list(errors) == ["inference.enable_chunked_prefill"]
    assert "seeded generator" in errors["inference.enable_chunked_prefill"]
    on_gpus = RunConfig.model_validate({"inference": inference, "placement": {"devices": "gpu"}})
    assert engine_errors(on_gpus) == {}
    off = RunConfig.model_validate({"inference": {"backend": "vllm", "enable_chunked_prefill": False}})
    assert engine_errors(off) == {}


def test_admission_reserves_the_cpu_kv_cache_for_the_configs_max_num_seqs():
    few = demand(RunConfig.model_validate({"inference": {"backend": "vllm", "max_num_seqs": 8}}))
    default = demand(RunConfig.model_validate({"inference": {"backend": "vllm"}}))
    assert few.per_role["inference worker"] < default.per_role["inference worker"]


@pytest.mark.vllm
def test_the_engine_arguments_are_vllms_own_names():
    try:
        arg_utils = importlib.import_module("vllm.engine.arg_utils")
    except Exception as exc:  # ImportError, or a broken install
        pytest.skip(f"vllm is not importable ({exc})")
    import dataclasses

    names = {f.name for f in dataclasses.fields(arg_utils.EngineArgs)}
    knobs = {"enforce_eager": True, "max_num_seqs": 4, "max_num_batched_tokens": 64, "enable_prefix_caching": True}
    for on_cpu in (True, False):
        args = engine_args(on_cpu=on_cpu, **knobs)
        assert set(args) <= names, set(args) - names
