"""Admission (workers/admission.py): operator limits and cluster capacity, each refusal
naming the field and the limit; the estimate grows with what drives memory."""

from __future__ import annotations

from workers.admission import (
    INFERENCE_CPUS,
    TRAINER_CPUS,
    Capacity,
    Limits,
    admission_errors,
    demand,
    model_shape,
)
from workers.config import RunConfig
from workers.model import build_tiny
from workers.tokenizer import CharTokenizer

ROOMY = Capacity(cpus=64, memory_bytes=512 * 2**30)


def cfg(**sections) -> RunConfig:
    return RunConfig.model_validate(sections)


def test_the_parameter_count_matches_the_model_that_is_built():
    c = RunConfig()
    model = build_tiny(c.model, CharTokenizer(), seed=0)
    assert model_shape(c)["params"] == sum(p.numel() for p in model.parameters())


def test_the_default_run_fits_this_kind_of_machine():
    assert admission_errors(RunConfig(), Limits(), Capacity(cpus=2, memory_bytes=8 * 2**30)) == {}


def test_cpus_are_what_the_actors_ask_for():
    assert demand(cfg(inference={"num_workers": 3})).cpus == TRAINER_CPUS + 3 * INFERENCE_CPUS
    errors = admission_errors(cfg(inference={"num_workers": 8}), Limits(), Capacity(cpus=2, memory_bytes=2**40))
    assert "2.25 CPUs" in errors["inference.num_workers"]


def test_memory_grows_with_the_model_the_batch_and_vllm():
    base = demand(RunConfig()).memory_bytes
    assert demand(cfg(model={"hidden_size": 512, "num_heads": 4})).memory_bytes > base
    assert demand(cfg(trainer={"batch_groups": 64})).memory_bytes > base
    assert demand(cfg(inference={"backend": "vllm"})).memory_bytes > base
    lora = cfg(model={"hidden_size": 1024, "num_heads": 8}, lora={"enabled": True})
    full = cfg(model={"hidden_size": 1024, "num_heads": 8})
    assert demand(lora).per_role["trainer"] < demand(full).per_role["trainer"]


def test_limits_are_checked_before_the_cluster():
    errors = admission_errors(cfg(stop={"max_steps": 10**30}), Limits(), Capacity(cpus=0, memory_bytes=0))
    assert list(errors) == ["stop.max_steps"]


def test_each_limit_names_its_field_and_setting():
    limits = Limits(max_steps=10, max_minutes=5, max_workers=2, max_model_params=1000)
    errors = admission_errors(
        cfg(stop={"max_steps": 11, "max_minutes": 6}, inference={"num_workers": 3}), limits, ROOMY
    )
    assert {"stop.max_steps", "stop.max_minutes", "inference.num_workers", "model.hidden_size"} == set(errors)
    for setting in ("ROLLWAY_MAX_STEPS", "ROLLWAY_MAX_MINUTES", "ROLLWAY_MAX_WORKERS", "ROLLWAY_MAX_MODEL_PARAMS"):
        assert any(setting in m for m in errors.values())


def test_a_checkpoint_is_sized_from_its_headers(tmp_path):
    from workers.model import save_model

    c = RunConfig()
    model = build_tiny(c.model, CharTokenizer(), seed=0)
    save_model(model, CharTokenizer(), str(tmp_path))
    shape = model_shape(cfg(model={"source": "path", "path": str(tmp_path)}))
    assert shape["params"] == sum(p.numel() for p in model.parameters())
    assert shape["hidden"] == c.model.hidden_size
