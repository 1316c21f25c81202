"""Why a run failed, in a sentence (workers/run/failures.py): the classifier on the real
exception objects the libraries raise, the reporter carrying sentence and traceback, and
on the shared Ray cluster a run with a bad model directory and runs whose actors are
killed while they train."""

from __future__ import annotations

import datetime
import errno
import os
import traceback

import pytest
import ray
import torch
import torch.distributed as dist
from ray.core.generated.common_pb2 import ActorDiedErrorContext
from ray.exceptions import (
    ActorDiedError,
    AuthenticationError,
    GetTimeoutError,
    OutOfMemoryError,
    RayActorError,
    RayTaskError,
)

from tests.engine.helpers import GONE_WAIT_S, TOKEN, small_config, tiny_config, wait_for
from tests.engine.ingest_stub import IngestStub
from workers.core.run_actors import NAMESPACE, run_actor_names
from workers.model.loading import build_tiny, load_model, save_model
from workers.model.tokenizer import CharTokenizer
from workers.run.failures import DETAIL_MAX, ChildFailed, SyncTimeout, clip, explain
from workers.run.lifecycle import launch
from workers.run.paths import Confinement
from workers.run.reporter import MetricsReporter, read_spooled_status


def raised(fn, *args):
    """The exception `fn(*args)` raises, traceback and all."""
    try:
        fn(*args)
    except Exception as exc:  # whatever it raises is what the test explains
        return exc
    raise AssertionError(f"{fn.__name__} raised nothing")


def reported_traceback(exc: Exception) -> str:
    """`exc` as an actor's loop reports it to the driver: its formatted traceback."""
    try:
        raise exc
    except Exception:
        return traceback.format_exc()


def path_config(path: str, **overrides):
    return small_config(model={"source": "path", "path": path}, **overrides)


def confinement(tmp_path) -> Confinement:
    return Confinement(model_roots=(str(tmp_path),), scratch_root=str(tmp_path / "scratch"))


def actor_died(name: str, class_name: str, cause: str) -> ActorDiedError:
    """The ActorDiedError Ray raises for a named actor that died (not in its constructor)."""
    context = ActorDiedErrorContext(
        error_message=cause, name=name, class_name=class_name, actor_id=b"\x01" * 16, ray_namespace=NAMESPACE, pid=4242
    )
    return ActorDiedError(context)


def constructor_failed(name: str, class_name: str, exc: BaseException) -> ActorDiedError:
    """The ActorDiedError Ray raises on a call to an actor whose constructor raised `exc`."""
    task_error = RayTaskError(
        f"{class_name}.__init__",
        reported_traceback(exc),
        exc,
        proctitle=f"ray::{name}:{class_name}.__init__",
        pid=4242,
        ip="10.0.0.7",
    )
    return ActorDiedError.from_task_error(task_error)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    """A complete tiny Hugging Face model directory (config.json + weights)."""
    path = str(tmp_path_factory.mktemp("model"))
    cfg = small_config()
    save_model(build_tiny(cfg.model, CharTokenizer(), seed=0), CharTokenizer(), path)
    return path


# --- 1. a bad model directory --------------------------------------------------------


def test_a_model_directory_without_config_json_says_so(tmp_path):
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    cfg = path_config(str(empty))
    failure = explain(raised(confinement(tmp_path).check, cfg), cfg)
    assert failure.kind == "bad_model"
    assert failure.message == (
        f"The model directory {empty} has no config.json: point model.path at a Hugging Face model directory."
    )
    assert "PathNotAllowed" in failure.detail


def test_a_model_directory_that_does_not_exist_says_so(tmp_path):
    cfg = path_config(str(tmp_path / "missing"))
    failure = explain(raised(confinement(tmp_path).check, cfg), cfg)
    assert failure.message.startswith(f"The model directory {tmp_path / 'missing'} does not exist: ")


def test_a_model_directory_without_weights_says_so(tmp_path, model_dir):
    copy = tmp_path / "no-weights"
    copy.mkdir()
    (copy / "config.json").write_text(open(os.path.join(model_dir, "config.json")).read())
    failure = explain(raised(load_model, str(copy)), path_config(str(copy)))
    assert failure.kind == "bad_model"
    assert failure.message.startswith(f"The model directory {copy} has no weights (model.safetensors")
    assert "no file named model.safetensors" in failure.detail  # transformers' own words, kept


def test_an_unreadable_config_json_says_so(tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    failure = explain(raised(load_model, str(broken)), path_config(str(broken)))
    assert failure.kind == "bad_model"
    assert failure.message.startswith(f"The config.json in the model directory {broken} is not valid JSON: ")


def test_a_model_directory_it_may_not_read_says_so(tmp_path):
    # Tests run as root here, where chmod denies nothing: the error open() raises.
    denied = PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "config.json"))
    failure = explain(denied, path_config(str(tmp_path)))
    assert failure.message.startswith(f"The model directory {tmp_path} cannot be read (permission denied): ")


def test_a_path_outside_the_allowed_roots_names_the_field_and_setting(tmp_path):
    cfg = small_config(sync={"protocol": "filesystem", "directory": "/etc"})
    failure = explain(raised(confinement(tmp_path).check, cfg), cfg)
    assert failure.kind == "path_not_allowed"
    assert failure.message.startswith("sync.directory: '/etc' is not allowed: ")
    assert "ROLLWAY_SYNC_ROOTS" in failure.message


# --- 2. out of memory ----------------------------------------------------------------


def test_memory_error_while_building_the_warm_start_names_its_knob():
    failure = explain(raised(lambda: bytearray(2**62)), small_config(), phase="warm_start")
    assert failure.kind == "out_of_memory"
    assert failure.message == (
        "The driver ran out of memory building the warm-started policy: lower warm_start.batch_size or use a "
        "smaller model."
    )


def test_torch_out_of_memory_in_the_trainer_names_the_trainer_and_its_knobs():
    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    failure = explain(ChildFailed("trainer failed", who="trainer", detail=reported_traceback(oom)), small_config())
    assert failure.kind == "out_of_memory"
    assert failure.message == (
        "The trainer ran out of GPU memory: lower trainer.batch_groups or trainer.group_size, or use a smaller model."
    )
    assert "torch.OutOfMemoryError: CUDA out of memory" in failure.detail  # the trainer's own traceback


def test_cuda_out_of_memory_as_a_runtime_error_in_a_vllm_worker_names_vllms_knob():
    oom = RuntimeError("CUDA error: out of memory")  # how older kernels word it
    cfg = small_config(inference={"backend": "vllm"})
    failure = explain(ChildFailed("x", who="inference worker 1", detail=reported_traceback(oom)), cfg)
    assert failure.message.startswith("Inference worker 1 ran out of")
    assert "inference.gpu_memory_utilization" in failure.message


def test_rays_memory_monitor_killing_an_actor_says_so_and_names_it():
    killed = actor_died(
        "run-3-trainer",
        "TrainerActor",
        "The actor is dead because its worker process has died. Worker exit type: NODE_OUT_OF_MEMORY Worker exit "
        "detail: 1 worker(s) were killed due to the node running low on memory.",
    )
    try:
        raise ChildFailed("a run actor died") from killed
    except ChildFailed as exc:
        failure = explain(exc, small_config())
    assert failure.kind == "out_of_memory"
    assert failure.message.startswith(
        "Ray's memory monitor killed the trainer (run-3-trainer) because its node ran low on memory: lower "
        "trainer.batch_groups"
    )


def test_rays_out_of_memory_error_says_the_memory_monitor_killed_it():
    failure = explain(OutOfMemoryError("Task was killed due to the node running low on memory."), small_config())
    assert failure.kind == "out_of_memory"
    assert failure.message.startswith("Ray's memory monitor killed a run actor because its node ran low on memory")


# --- 3. vLLM failed to start ---------------------------------------------------------


def start_engine():
    """What vLLM's engine constructor raises when the engine core cannot start."""
    try:
        raise ValueError('Model architectures ["TinyLlama"] are not supported for now.')
    except ValueError as exc:
        raise RuntimeError("Engine core initialization failed. See root cause above. Failed core proc(s): {}") from exc


def test_a_vllm_engine_that_does_not_start_names_the_worker_and_the_root_cause():
    error = constructor_failed("run-5-inference-0", "InferenceWorker", raised(start_engine))
    assert error.actor_init_failed
    failure = explain(error, small_config(inference={"backend": "vllm"}), phase="starting_engines")
    assert failure.kind == "vllm_start"
    assert failure.message.startswith(
        "vLLM could not start in inference worker 0 (ValueError: Model architectures "
        '["TinyLlama"] are not supported for now.): '
    )
    assert "inference.backend to torch" in failure.message
    assert "Engine core initialization failed" in failure.detail


def test_another_actor_that_does_not_start_names_it():
    error = constructor_failed("run-5-trainer", "TrainerActor", KeyError("lm_head.weight"))
    failure = explain(error, small_config())
    assert (failure.kind, failure.message) == (
        "actor_start",
        "The trainer could not start: KeyError: 'lm_head.weight'.",
    )


# --- 4. Ray unreachable --------------------------------------------------------------


def test_an_unreachable_ray_names_the_address():
    gcs = RuntimeError(
        "Failed to connect to GCS. Last connection error: ray.exceptions.RpcError: Timed out while waiting for "
        "GCS to become available."
    )
    try:  # as ray.init(address=...) raises it, after ~40 s of retries
        raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.9:6380") from gcs
    except ConnectionError as exc:
        failure = explain(exc, ray_address="10.0.0.9:6380", what="The launch")
    assert failure.kind == "ray_unreachable"
    assert failure.message == "Ray at 10.0.0.9:6380 is unreachable: check RAY_ADDRESS and that the Ray head is running."
    assert "Failed to connect to GCS" in failure.detail


def test_a_head_the_probe_found_down_is_unreachable():
    from workers.run.lifecycle import RayUnreachable

    try:
        raise RayUnreachable("the Ray head at 10.0.0.9:6380 does not answer (RAY_ADDRESS; is it running?)")
    except RayUnreachable as exc:
        failure = explain(exc, what="The launch")
    assert failure.kind == "ray_unreachable"
    assert failure.message == "Ray at 10.0.0.9:6380 is unreachable: check RAY_ADDRESS and that the Ray head is running."


def test_a_refused_ray_token_says_which_setting_to_fix():
    failure = explain(AuthenticationError("Token authentication failed."), ray_address="10.0.0.9:6380")
    assert failure.message == (
        "Ray at 10.0.0.9:6380 refused this process's token: set RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH) to the "
        "cluster's token."
    )


# --- 5. an actor died ----------------------------------------------------------------


def test_an_actor_killed_by_ray_kill_is_named_with_the_cause():
    try:
        raise ChildFailed("a run actor died") from actor_died(
            "run-7-inference-1", "InferenceWorker", "The actor is dead because it was killed by `ray.kill`."
        )
    except ChildFailed as exc:
        failure = explain(exc, small_config())
    assert (failure.kind, failure.message) == (
        "actor_died",
        "Inference worker 1 (Ray actor run-7-inference-1) died: it was killed (ray.kill). Launch the run again.",
    )


def test_a_dead_buffer_reported_by_the_trainer_names_the_buffer_not_the_trainer():
    dead = actor_died("run-7-buffer", "BufferActor", "The actor is dead because it was killed by `ray.kill`.")
    failure = explain(ChildFailed("trainer failed", who="trainer", detail=reported_traceback(dead)), small_config())
    assert failure.message.startswith("The buffer (Ray actor run-7-buffer) died: it was killed (ray.kill).")


def test_an_actor_whose_process_crashed_quotes_rays_exit_detail():
    dead = actor_died(
        "run-7-trainer",
        "TrainerActor",
        "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit "
        "detail: Worker unexpectedly exits with a connection error code 2. End of file.",
    )
    failure = explain(dead, small_config())
    assert failure.message.startswith(
        "The trainer (Ray actor run-7-trainer) died: its process died (Worker unexpectedly exits with a "
        "connection error code 2."
    )


def test_a_trainer_rank_is_named_by_its_rank():
    dead = actor_died("run-7-trainer-1", "TrainerRank", "The actor is dead because it was killed by `ray.kill`.")
    failure = explain(dead, small_config())
    assert failure.message.startswith("Trainer rank 1 (Ray actor run-7-trainer-1) died: it was killed (ray.kill).")


def test_an_actor_whose_node_died_names_the_node_the_driver_knew():
    dead = actor_died(
        "run-7-trainer-1", "TrainerRank", "The actor died because its node has died. Node Id: 1f11c59d4fb8aa"
    )
    failure = explain(dead, small_config(), nodes={"1f11c59d4fb8aa": "10.0.0.5, pool=train"})
    assert failure.message == (
        "Trainer rank 1 (Ray actor run-7-trainer-1) died: its node died (10.0.0.5, pool=train; Ray node "
        "1f11c59d4fb8): it left the cluster. Launch the run again."
    )


def test_a_lost_node_names_the_node_and_every_actor_it_took():
    from workers.run.failures import NodeLost

    try:
        raise NodeLost(["10.0.0.5, pool=train (Ray node 1f11c59d4fb8)"], ["trainer rank 0", "trainer rank 1"]) from (
            RayActorError()
        )
    except NodeLost as exc:
        failure = explain(exc, small_config())
    assert (failure.kind, failure.message) == (
        "node_lost",
        "The run lost a node: 10.0.0.5, pool=train (Ray node 1f11c59d4fb8) left the cluster, and with it trainer "
        "rank 0, trainer rank 1. Launch the run again, or resume it from its latest checkpoint.",
    )


def test_a_bare_ray_actor_error_still_reads_as_an_actor_death():
    failure = explain(RayActorError(), small_config())
    assert failure.kind == "actor_died"
    assert failure.message == "A run actor died: Ray gave no reason. Launch the run again."


# --- 6. the weight sync timed out ----------------------------------------------------


def test_the_drivers_own_sync_deadline_names_the_protocol_and_setting():
    failure = explain(SyncTimeout("collective", 30.0), small_config())
    assert failure.kind == "sync_timeout"
    assert failure.message.startswith(
        "The weight sync (collective) timed out after sync.timeout_s=30 s: the trainer and the inference workers "
        "did not all join in time. Raise sync.timeout_s"
    )


def test_a_collective_rendezvous_timeout_from_torch_distributed_reads_as_a_sync_timeout():
    def rendezvous():  # a TCPStore whose second rank never joins, as a stuck worker leaves it
        dist.TCPStore("127.0.0.1", 0, 2, is_master=True, timeout=datetime.timedelta(seconds=1), wait_for_workers=True)

    store_error = raised(rendezvous)
    assert isinstance(store_error, dist.DistStoreError)
    cfg = small_config(sync={"protocol": "collective", "timeout_s": 1})
    wrapped = RayTaskError("TrainerActor.sync_connect", reported_traceback(store_error), store_error, pid=1, ip="x")
    for exc in (store_error, wrapped.as_instanceof_cause()):
        failure = explain(exc, cfg)
        assert failure.kind == "sync_timeout", failure
        assert failure.message.startswith("The weight sync (collective) timed out after sync.timeout_s=1 s")


# --- and the rest --------------------------------------------------------------------


def test_a_ray_get_timeout_says_ray_did_not_answer():
    failure = explain(GetTimeoutError("Get timed out: some object(s) not ready."), small_config())
    assert failure.kind == "ray_timeout"
    assert failure.message.startswith("Ray did not answer in time (GetTimeoutError: Get timed out")


def test_an_actors_own_error_quotes_its_last_line():
    loop_error = reported_traceback(ValueError("loss is NaN at step 3"))
    failure = explain(ChildFailed("trainer failed", who="trainer", detail=loop_error), small_config())
    assert (failure.kind, failure.message) == ("actor_error", "The trainer failed: ValueError: loss is NaN at step 3.")


def test_anything_else_falls_back_to_the_exceptions_last_line():
    failure = explain(raised(lambda: {}["warm_start"]), small_config(), what="The launch")
    assert (failure.kind, failure.message) == ("error", "The launch failed: KeyError: 'warm_start'.")
    # A remote error: the line Ray wrapped, not its "ray::..." header.
    remote = RayTaskError(
        "f", reported_traceback(IndexError("list index out of range")), IndexError("x"), pid=1, ip="x"
    )
    assert explain(remote.as_instanceof_cause()).message == "IndexError: x."


def test_the_detail_is_the_full_traceback_cut_in_the_middle_to_its_bound():
    reported = "first frame\n" + "x" * 3 * DETAIL_MAX + "\nlast line"

    def trainer_failed():
        raise ChildFailed("trainer failed", who="trainer", detail=reported)

    failure = explain(raised(trainer_failed), small_config())
    assert len(failure.detail) <= DETAIL_MAX
    assert failure.detail.startswith("Traceback") and failure.detail.endswith("last line")
    assert "characters cut" in failure.detail
    assert clip("short", 10) == "short"


def test_the_reporter_posts_the_sentence_and_the_traceback_and_spools_them(tmp_path):
    failure = explain(raised(lambda: bytearray(2**62)), small_config(), phase="warm_start")
    with IngestStub(token="t") as stub:
        rep = MetricsReporter(41, stub.url, "t", str(tmp_path))
        assert rep.post_status("failed", failure.message, error_detail=failure.detail) is True
    [(_, _, body)] = [r for r in stub.requests if r[0] == "status"]
    assert body == {"status": "failed", "error": failure.message, "error_detail": failure.detail}

    down = MetricsReporter(42, "http://127.0.0.1:9", "t", str(tmp_path), timeout_s=0.2)
    assert down.post_status("failed", failure.message, error_detail=failure.detail) is False
    down.close(timeout_s=0.2)
    spooled = read_spooled_status(42, str(tmp_path))
    assert (spooled["error"], spooled["error_detail"]) == (failure.message, failure.detail)


# --- on the real engine --------------------------------------------------------------


@pytest.mark.slow
def test_a_run_whose_model_directory_has_no_config_json_fails_saying_so(cluster, stub, cache_dir, tmp_path):
    empty = tmp_path / "models" / "empty"
    empty.mkdir(parents=True)
    config = tiny_config(model={"source": "path", "path": str(empty)})
    launch(901, config, ingest_url=stub.url, token=TOKEN, cache_dir=cache_dir, confinement=confinement(tmp_path))
    wait_for(lambda: stub.status.get(901) == "failed", 60, "the run to fail")
    assert stub.errors[901] == (
        f"The model directory {empty} has no config.json: point model.path at a Hugging Face model directory."
    )
    [body] = [b for kind, run, b in stub.requests if kind == "status" and run == 901 and b["status"] == "failed"]
    assert "Traceback (most recent call last)" in body["error_detail"]
    assert "PathNotAllowed: model.path:" in body["error_detail"]
    wait_for(lambda: not run_actor_names(901), GONE_WAIT_S, "the failed driver to exit")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("run_id", "role", "said"),
    [
        (902, "buffer", "The buffer (Ray actor run-902-buffer)"),
        (903, "inference-0", "Inference worker 0 (Ray actor run-903-inference-0)"),
    ],
)
def test_killing_an_actor_of_a_running_run_fails_it_naming_that_actor(cluster, stub, cache_dir, run_id, role, said):
    launch(run_id, tiny_config(stop={"max_steps": 10_000}), ingest_url=stub.url, token=TOKEN, cache_dir=cache_dir)
    wait_for(lambda: stub.series(run_id).get("reward/mean"), 120, "a first trained step")
    ray.kill(ray.get_actor(f"run-{run_id}-{role}", namespace=NAMESPACE), no_restart=True)
    wait_for(lambda: stub.status.get(run_id) == "failed", 60, "the run to fail")
    assert stub.errors[run_id] == f"{said} died: it was killed (ray.kill). Launch the run again."
    [body] = [b for kind, run, b in stub.requests if kind == "status" and run == run_id and b["status"] == "failed"]
    assert "ActorDiedError" in body["error_detail"]
    wait_for(lambda: not run_actor_names(run_id), GONE_WAIT_S, "the run's actors to exit")
