"""Admission (workers/admission.py): operator limits, what the engine can run and cluster
capacity (CPUs, GPUs, memory), each refusal naming the field and the limit; the estimate
grows with what drives memory."""

from __future__ import annotations

from workers.admission import (
    Capacity,
    Limits,
    admission_errors,
    capacity_errors,
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
    assert demand(cfg(inference={"num_workers": 3})).cpus == 0.25 + 3 * 0.25
    assert demand(cfg(inference={"num_workers": 3, "cpus_per_worker": 1}, trainer={"cpus_per_rank": 2})).cpus == 5
    errors = admission_errors(cfg(inference={"num_workers": 8}), Limits(), Capacity(cpus=2, memory_bytes=2**40))
    assert "2.25 CPUs" in errors["inference.num_workers"]


FOUR_GPUS = Capacity(cpus=64, memory_bytes=512 * 2**30, gpus=4)


def on_gpus(workers: int, ranks: int = 1, mode: str = "disaggregated") -> RunConfig:
    return cfg(
        inference={"num_workers": workers},
        trainer={"num_ranks": ranks, "backend": "ddp" if ranks > 1 else "single"},
        placement={"devices": "gpu", "mode": mode},
    )


def test_gpus_are_counted_per_pool_when_disaggregated():
    assert demand(on_gpus(2, 2)).gpus == 4
    assert capacity_errors(on_gpus(2, 2), FOUR_GPUS) == {}
    errors = capacity_errors(on_gpus(3, 2), FOUR_GPUS)
    assert list(errors) == ["inference.num_workers"]
    assert "asks for 5 GPUs" in errors["inference.num_workers"]
    assert "the cluster has 4" in errors["inference.num_workers"]
    assert list(capacity_errors(on_gpus(1, 4), FOUR_GPUS)) == ["trainer.num_ranks"]


def test_a_launch_asking_more_gpus_than_the_cluster_has_is_refused():
    assert admission_errors(on_gpus(3), Limits(), FOUR_GPUS) == {}
    errors = admission_errors(on_gpus(4), Limits(), FOUR_GPUS)
    assert set(errors) == {"inference.num_workers"}
    assert "5 GPUs" in errors["inference.num_workers"]
    # No GPU in the cluster at all: any GPU placement is refused, a CPU one is not.
    assert "inference.num_workers" in admission_errors(on_gpus(1), Limits(), ROOMY)
    assert admission_errors(cfg(inference={"num_workers": 4}), Limits(), ROOMY) == {}


def test_colocated_pools_share_their_gpus():
    assert demand(on_gpus(2, 2, "colocated")).gpus == 2
    assert demand(on_gpus(4, 1, "colocated")).gpus == 4
    assert capacity_errors(on_gpus(4, 1, "colocated"), FOUR_GPUS) == {}
    assert "inference.num_workers" in capacity_errors(on_gpus(5, 1, "colocated"), FOUR_GPUS)


def test_pool_sizes_the_engine_cannot_run_yet_are_refused_naming_the_field():
    assert admission_errors(on_gpus(2, 2), Limits(), FOUR_GPUS) == {}  # a trainer pool runs
    errors = admission_errors(cfg(inference={"tensor_parallel_size": 2}), Limits(), ROOMY)
    assert list(errors) == ["inference.tensor_parallel_size"]


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
