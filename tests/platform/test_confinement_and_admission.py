"""A run config is hostile input: the paths it names stay under the roots the operator
allowed, and what it asks for stays within the operator's limits and the cluster. Each
refusal names the field and the limit, at launch (400, nothing stored) and again before
the run reaches Ray; a run's scratch directory goes when its driver is gone."""

from __future__ import annotations

import json
import os

import pytest

from configs import policy
from configs.models import ClusterCapacity
from runs import in_ray, queue, reconcile
from runs.models import Run
from workers.model.tiny_hf import make_tiny_checkpoint
from workers.run.admission import Capacity

URL = "/api/runs"
Status = Run.Status


def post_json(client, body):
    return client.post(URL, data=json.dumps(body), content_type="application/json")


def launch(client, experiment, overrides):
    return post_json(client, {"experiment": experiment.pk, "preset": "async", "overrides": overrides})


@pytest.fixture
def roots(settings, tmp_path):
    """An allowed model root holding one model directory, a sync root, a scratch root,
    and a directory outside all of them."""
    models, syncs, outside = tmp_path / "models", tmp_path / "sync", tmp_path / "outside"
    for d in (models / "tiny-llama", syncs, outside / "secret-model"):
        d.mkdir(parents=True)
    for model in (models / "tiny-llama", outside / "secret-model"):
        (model / "config.json").write_text("{}")
    settings.ROLLWAY_MODEL_ROOTS = [str(models)]
    settings.ROLLWAY_SYNC_ROOTS = [str(syncs)]
    settings.ROLLWAY_SCRATCH_DIR = str(tmp_path / "scratch")
    return {"models": models, "sync": syncs, "outside": outside, "scratch": tmp_path / "scratch"}


def model_path(path) -> dict:
    return {"model": {"source": "path", "path": str(path)}}


# --- confinement --------------------------------------------------------------------


@pytest.mark.parametrize("how", ["absolute", "dotdot", "symlink"])
def test_it_refuses_a_model_path_that_escapes_the_allowed_roots(client_for, owner, experiment, roots, how):
    if how == "absolute":
        path = roots["outside"] / "secret-model"
    elif how == "dotdot":
        path = f"{roots['models']}/../outside/secret-model"
    else:
        (roots["models"] / "link").symlink_to(roots["outside"] / "secret-model")
        path = roots["models"] / "link"
    r = launch(client_for(owner), experiment, model_path(path))
    assert r.status_code == 400, r.content
    message = r.json()["errors"]["model.path"]
    assert "outside the allowed roots" in message and "ROLLWAY_MODEL_ROOTS" in message
    assert Run.objects.count() == 0


def test_a_sibling_whose_name_extends_the_root_is_outside_it(client_for, owner, experiment, roots):
    sibling = roots["models"].parent / "models-evil" / "m"
    sibling.mkdir(parents=True)
    (sibling / "config.json").write_text("{}")
    r = launch(client_for(owner), experiment, model_path(sibling))
    assert r.status_code == 400
    assert "model.path" in r.json()["errors"]


def test_a_model_path_under_a_root_must_be_a_model_directory(client_for, owner, experiment, roots):
    (roots["models"] / "empty").mkdir()
    r = launch(client_for(owner), experiment, model_path(roots["models"] / "empty"))
    assert r.status_code == 400
    assert "not a Hugging Face model directory" in r.json()["errors"]["model.path"]


def test_a_model_directory_under_an_allowed_root_is_accepted(client_for, owner, experiment, roots):
    make_tiny_checkpoint(str(roots["models"] / "tiny-llama"), "llama")  # weights and a tokenizer, not just a config
    r = launch(client_for(owner), experiment, model_path(roots["models"] / "tiny-llama"))
    assert r.status_code == 201, r.content


def test_sync_directory_is_refused_unless_the_operator_allowed_its_root(client_for, owner, experiment, roots, settings):
    body = {"sync": {"protocol": "filesystem", "directory": "/etc/rollway-versions"}}
    r = launch(client_for(owner), experiment, body)
    assert r.status_code == 400
    assert "ROLLWAY_SYNC_ROOTS" in r.json()["errors"]["sync.directory"]

    settings.ROLLWAY_SYNC_ROOTS = []
    r = launch(client_for(owner), experiment, {"sync": {"directory": str(roots["sync"])}})
    assert r.status_code == 400
    assert "ROLLWAY_SYNC_ROOTS is empty" in r.json()["errors"]["sync.directory"]
    assert Run.objects.count() == 0


def test_sync_directory_inside_an_allowed_root_is_accepted(client_for, owner, experiment, roots):
    body = {"sync": {"protocol": "filesystem", "directory": str(roots["sync"] / "run-versions")}}
    assert launch(client_for(owner), experiment, body).status_code == 201
    escape = {"sync": {"protocol": "filesystem", "directory": f"{roots['sync']}/../../etc"}}
    assert launch(client_for(owner), experiment, escape).status_code == 400


def test_settings_the_run_will_not_read_are_answered_beside_it(client_for, owner, experiment, roots):
    """Harmless ones (the run is the same without them) are kept and warned on; those the
    run would need are refused (tests/engine/test_capabilities.py has the matrix)."""
    client = client_for(owner)
    assert launch(client, experiment, {}).json()["unread"] == []  # a preset as it is sets none
    body = {"sync": {"directory": str(roots["sync"]), "packed": False}}  # read by other protocols only
    r = launch(client, experiment, body)
    assert r.status_code == 201, r.content
    unread = {u["field"]: u["message"] for u in r.json()["unread"]}
    assert set(unread) == {"sync.directory", "sync.packed"}
    assert unread["sync.packed"] == (
        "sync.packed is read only by a collective (sync.protocol 'collective'), which broadcasts in buckets or "
        "tensor by tensor, and this run's sync.protocol is 'object_store': leave sync.packed at true, or set "
        "sync.protocol to 'collective'"
    )
    assert Run.objects.get(pk=r.json()["id"]).run_config.sync.packed is False  # kept as given
    r = launch(client, experiment, {"inference": {"tensor_parallel_size": 2}})  # the run would not be split
    assert r.status_code == 400 and "inference.tensor_parallel_size" in r.json()["errors"]


# --- admission: operator limits and the cluster -------------------------------------


@pytest.mark.parametrize(
    "overrides, field, words",
    [
        ({"stop": {"max_steps": 10**30}}, "stop.max_steps", ["ROLLWAY_MAX_STEPS", "1e+30"]),
        ({"stop": {"max_minutes": 1e9}}, "stop.max_minutes", ["ROLLWAY_MAX_MINUTES"]),
        ({"inference": {"num_workers": 1000}}, "inference.num_workers", ["ROLLWAY_MAX_WORKERS", "1000"]),
        (
            {"model": {"hidden_size": 1_000_000, "num_layers": 1000, "num_heads": 4}},
            "model.hidden_size",
            ["ROLLWAY_MAX_MODEL_PARAMS", "parameters"],
        ),
    ],
)
def test_it_refuses_what_exceeds_the_operators_limits(client_for, owner, experiment, overrides, field, words):
    r = launch(client_for(owner), experiment, overrides)
    assert r.status_code == 400, r.content
    message = r.json()["errors"][field]
    assert all(w in message for w in words), message
    assert Run.objects.count() == 0


def test_the_operator_sets_the_limits(client_for, owner, experiment, settings):
    settings.ROLLWAY_MAX_STEPS = 50
    r = launch(client_for(owner), experiment, {"stop": {"max_steps": 51}})
    assert "at most 50 steps" in r.json()["errors"]["stop.max_steps"]
    assert launch(client_for(owner), experiment, {"stop": {"max_steps": 50}}).status_code == 201


def test_it_refuses_what_the_cluster_last_seen_can_never_give(client_for, owner, experiment):
    ClusterCapacity.record(Capacity(cpus=2.0, memory_bytes=16 * 2**30))
    r = launch(client_for(owner), experiment, {"inference": {"num_workers": 12}})
    assert r.status_code == 400
    message = r.json()["errors"]["inference.num_workers"]
    assert "3.25 CPUs" in message and "the cluster has 2" in message

    ClusterCapacity.record(Capacity(cpus=64.0, memory_bytes=2**30))
    r = launch(
        client_for(owner),
        experiment,
        {"model": {"hidden_size": 4096, "num_layers": 8, "num_heads": 32, "intermediate_size": 8192}},
    )
    assert r.status_code == 400
    assert "GiB of memory" in r.json()["errors"]["model"]
    assert Run.objects.count() == 0


def test_a_pool_whose_gpu_cannot_hold_it_is_refused_on_gpus_of_known_memory(client_for, owner, experiment, settings):
    big = {
        "model": {"hidden_size": 4096, "num_layers": 16, "num_heads": 32, "intermediate_size": 11008},
        "placement": {"devices": "gpu"},
        "trainer": {"micro_batch_rows": 4, "gradient_checkpointing": True},
    }
    # GPUs of a type Ray does not name: their memory is not known, nothing is held to it
    ClusterCapacity.record(Capacity(cpus=64.0, memory_bytes=2**40, gpus=16))
    assert launch(client_for(owner), experiment, big).status_code == 201
    # the operator says they are 16 GB GPUs: 3.4 G parameters × 16 B do not fit one
    settings.ROLLWAY_GPU_MEMORY_GB = 16
    r = launch(client_for(owner), experiment, big)
    assert r.status_code == 400
    message = r.json()["errors"]["trainer.backend"]
    assert "each trainer rank needs about" in message and "a GPU here has 16.0 GiB" in message
    sharded = {**big, "trainer": {**big["trainer"], "backend": "fsdp2", "num_ranks": 8}}
    assert launch(client_for(owner), experiment, sharded).status_code == 201


def test_a_reward_pool_past_the_clusters_gpus_is_refused_naming_rewards_workers(client_for, owner, experiment):
    ClusterCapacity.record(Capacity(cpus=64.0, memory_bytes=2**40, gpus=3))
    pooled = {"placement": {"devices": "gpu"}, "rewards": {"workers": 2, "gpus_per_worker": 1}}
    r = launch(client_for(owner), experiment, pooled)
    assert r.status_code == 400
    message = r.json()["errors"]["rewards.workers"]
    assert "the run asks for 4 GPUs" in message and "rewards.workers 2 × rewards.gpus_per_worker 1" in message
    assert Run.objects.count() == 0
    shared = {**pooled, "rewards": {"workers": 2, "gpus_per_worker": 0.5}}
    assert launch(client_for(owner), experiment, shared).status_code == 201


def test_without_a_capacity_seen_the_launch_passes_and_the_worker_refuses_before_ray(
    client_for, owner, experiment, driver
):
    r = launch(client_for(owner), experiment, {"inference": {"num_workers": 12}})
    assert r.status_code == 201
    run = Run.objects.get()
    # The queue lets it through (it can never fit, so it must not wait for the cluster)...
    assert queue.do_schedule_queue() == [run.pk]
    in_ray.do_start_in_ray(run.pk)  # ...and the worker refuses it with the reason
    run.refresh_from_db()
    assert run.status == Status.FAILED
    assert run.error.startswith("refused: inference.num_workers:") and "the cluster has 2" in run.error
    assert driver.named("launch") == []  # nothing reached Ray
    assert ClusterCapacity.latest() == driver.capacity


def test_the_worker_passes_the_confinement_to_the_engine(make_run, driver, roots):
    run = make_run(phase=queue.SCHEDULED)
    in_ray.do_start_in_ray(run.pk)
    [confinement] = driver.confinements
    assert confinement == policy.confinement()
    assert confinement.scratch_dir(run.pk) == os.path.join(str(roots["scratch"]), f"run-{run.pk}")


# --- scratch directories of runs whose driver is gone -------------------------------


def scratch_of(run, roots):
    path = roots["scratch"] / f"run-{run.pk}"
    (path / "sync" / "v00000003").mkdir(parents=True)
    (path / "sync" / "v00000003" / "model.safetensors").write_bytes(b"weights")
    return path


@pytest.mark.parametrize("status", [Status.RUNNING, Status.CANCELLING])
def test_reconcile_removes_the_scratch_of_a_run_whose_driver_is_gone(make_run, driver, roots, status):
    # No actor alive in the fake: the driver was killed.
    run = make_run(status=status)
    path = scratch_of(run, roots)
    reconcile.do_reconcile_runs()
    run.refresh_from_db()
    assert run.status == (Status.FAILED if status == Status.RUNNING else Status.CANCELLED)
    assert not path.exists()


def test_a_cancel_removes_the_scratch_a_killed_driver_left(make_run, driver, roots):
    run = make_run(status=Status.CANCELLING)
    driver.alive.add(run.pk)
    path = scratch_of(run, roots)
    in_ray.do_stop_in_ray(run.pk)
    run.refresh_from_db()
    assert run.status == Status.CANCELLED
    assert not path.exists()
