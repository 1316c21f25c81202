"""Why a run failed, as a record (workers/run/failures.py): made of the real exception
objects the libraries raise where they are caught, of Ray's actor table for a dead
actor (workers/run/ray_deaths.py), carried across Ray and by the reporter, and on the
shared Ray cluster an actor whose constructor fails, an actor killed, a run with a bad
model directory and runs whose actors are killed while they train."""

from __future__ import annotations

import dataclasses
import datetime
import errno
import os
import pickle
import traceback

import psutil
import pytest
import ray
import torch
import torch.distributed as dist
from ray.core.generated.common_pb2 import ActorDeathCause, ActorDiedErrorContext, OomContext
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
from workers.run import ray_deaths
from workers.run.actors import BufferActor
from workers.run.buffer import plan as buffer_plan
from workers.run.failures import (
    DETAIL_MAX,
    LOOP,
    STARTING,
    ChildFailed,
    NodeLost,
    RayUnreachable,
    SyncTimeout,
    clip,
    explain,
)
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


def throw(exc: BaseException):
    raise exc


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


def caught_in(actor: str, exc: BaseException, cfg, operation: str = LOOP) -> ChildFailed:
    """What the driver gets of `exc` caught in run actor `actor`: the record made there,
    carried as Ray carries it (pickled)."""
    failure = explain(exc, cfg, actor=actor, operation=operation)
    return pickle.loads(pickle.dumps(ChildFailed(failure.message, failure)))


ACTOR_ID = "01" * 16


def actor_died(monkeypatch, name: str, class_name: str, cause: ActorDeathCause, node_id: str = "") -> ActorDiedError:
    """The ActorDiedError Ray raises for a named actor that died, with Ray's actor table
    answering for it what the GCS records of such a death (faked: no such actor exists)."""
    context = ActorDiedErrorContext(
        name=name, class_name=class_name, actor_id=bytes.fromhex(ACTOR_ID), ray_namespace=NAMESPACE, pid=4242
    )
    entry = {"Name": name, "ActorClassName": class_name, "State": "DEAD", "Address": {"NodeID": node_id}}
    monkeypatch.setattr(
        ray_deaths, "actor_info", lambda actor_id, wait=True: {**entry, "DeathCause": cause} if actor_id else None
    )
    return ActorDiedError(context)


def died(reason: str, error_message: str = "", **fields) -> ActorDeathCause:
    """Ray's ActorDeathCause for an actor that died for `reason` (ActorDiedErrorContext.Reason)."""
    reason_number = ActorDiedErrorContext.Reason.Value(reason)
    return ActorDeathCause(
        actor_died_error_context=ActorDiedErrorContext(reason=reason_number, error_message=error_message, **fields)
    )


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
    assert "PathNotAllowed" in failure.traceback


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
    assert "no file named model.safetensors" in failure.traceback  # transformers' own words, kept


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
    oom = raised(throw, torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    failure = explain(caught_in("trainer", oom, small_config()), small_config())
    assert failure.kind == "out_of_memory"
    assert failure.message == (
        "The trainer ran out of GPU memory: lower trainer.batch_groups or trainer.group_size, or use a smaller model."
    )
    assert (failure.actor, failure.operation) == ("trainer", LOOP)
    assert "torch.OutOfMemoryError: CUDA out of memory" in failure.traceback  # the trainer's own traceback


def test_cuda_out_of_memory_as_a_runtime_error_in_a_vllm_worker_names_vllms_knob():
    oom = RuntimeError("CUDA error: out of memory")  # how older kernels word it
    cfg = small_config(inference={"backend": "vllm"})
    failure = explain(caught_in("inference worker 1", oom, cfg), cfg)
    assert failure.message.startswith("Inference worker 1 ran out of")
    assert "inference.gpu_memory_utilization" in failure.message


def test_rays_memory_monitor_killing_an_actor_says_so_and_names_it(monkeypatch):
    monitor = ActorDeathCause(oom_context=OomContext(error_message="1 worker(s) were killed", fail_immediately=True))
    killed = actor_died(monkeypatch, "run-3-trainer", "TrainerActor", monitor)
    failure = explain(killed, small_config())
    assert failure.kind == "out_of_memory"
    assert (failure.actor, failure.actor_name) == ("trainer", "run-3-trainer")
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
    cfg = small_config(inference={"backend": "vllm"})
    error = caught_in("inference worker 0", raised(start_engine), cfg, operation=STARTING)
    failure = explain(error, cfg, phase="starting_engines")
    assert failure.kind == "vllm_start"
    assert failure.message.startswith(
        "vLLM could not start in inference worker 0 (ValueError: Model architectures "
        '["TinyLlama"] are not supported for now.): '
    )
    assert "inference.backend to torch" in failure.message
    assert "Engine core initialization failed" in failure.traceback


def test_another_actor_that_does_not_start_names_it():
    error = caught_in("trainer", raised(lambda: {}["lm_head.weight"]), small_config(), operation=STARTING)
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
    assert "Failed to connect to GCS" in failure.traceback


def test_a_head_the_probe_found_down_is_unreachable():
    try:
        raise RayUnreachable("10.0.0.9:6380")
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


def test_an_actor_killed_by_ray_kill_is_named_with_the_cause(monkeypatch):
    failure = explain(actor_died(monkeypatch, "run-7-inference-1", "InferenceWorker", died("RAY_KILL")), small_config())
    assert (failure.kind, failure.message) == (
        "actor_died",
        "Inference worker 1 (Ray actor run-7-inference-1) died: it was killed (ray.kill). Launch the run again.",
    )


def test_a_dead_buffer_reported_by_the_trainer_names_the_buffer_not_the_trainer(monkeypatch):
    dead = actor_died(monkeypatch, "run-7-buffer", "BufferActor", died("RAY_KILL"))
    failure = explain(caught_in("trainer", dead, small_config()), small_config())
    assert failure.message.startswith("The buffer (Ray actor run-7-buffer) died: it was killed (ray.kill).")
    assert (failure.actor, failure.actor_name) == ("buffer", "run-7-buffer")


def test_an_actor_whose_process_crashed_quotes_rays_exit_detail(monkeypatch):
    crashed = died(
        "WORKER_DIED",
        "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit "
        "detail: Worker unexpectedly exits with a connection error code 2. End of file.",
    )
    dead = actor_died(monkeypatch, "run-7-trainer", "TrainerActor", crashed)
    failure = explain(dead, small_config())
    assert failure.message.startswith(
        "The trainer (Ray actor run-7-trainer) died: its process died (Worker unexpectedly exits with a "
        "connection error code 2."
    )


def test_a_trainer_rank_is_named_by_its_rank(monkeypatch):
    dead = actor_died(monkeypatch, "run-7-trainer-1", "TrainerRank", died("RAY_KILL"))
    failure = explain(dead, small_config())
    assert failure.message.startswith("Trainer rank 1 (Ray actor run-7-trainer-1) died: it was killed (ray.kill).")


def test_an_actor_whose_node_died_names_the_node_the_driver_knew(monkeypatch):
    dead = actor_died(monkeypatch, "run-7-trainer-1", "TrainerRank", died("NODE_DIED"), node_id="1f11c59d4fb8aa")
    failure = explain(dead, small_config(), nodes={"1f11c59d4fb8aa": "10.0.0.5, pool=train"})
    assert failure.message == (
        "Trainer rank 1 (Ray actor run-7-trainer-1) died: its node died (10.0.0.5, pool=train; Ray node "
        "1f11c59d4fb8): it left the cluster. Launch the run again."
    )
    assert failure.node == "10.0.0.5, pool=train (Ray node 1f11c59d4fb8)"


def test_an_actor_whose_owner_died_or_whose_node_was_preempted_says_so(monkeypatch):
    owner = explain(actor_died(monkeypatch, "run-7-buffer", "BufferActor", died("OWNER_DIED")), small_config())
    assert (
        owner.message
        == "The buffer (Ray actor run-7-buffer) died: the process that created it died. Launch the run again."
    )
    drained = died("NODE_DIED", node_death_info={"reason": "AUTOSCALER_DRAIN_PREEMPTED"})
    preempted = explain(actor_died(monkeypatch, "run-7-trainer", "TrainerActor", drained), small_config())
    assert preempted.message.startswith("The trainer (Ray actor run-7-trainer) died: its node was preempted.")


def test_a_lost_node_names_the_node_and_every_actor_it_took():
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
    loop_error = caught_in("trainer", raised(throw, ValueError("loss is NaN at step 3")), small_config())
    failure = explain(loop_error, small_config())
    assert (failure.kind, failure.message) == ("actor_error", "The trainer failed: ValueError: loss is NaN at step 3.")
    assert failure.detail == (
        "kind: actor_error\nactor: trainer\noperation: loop\nerror: ValueError: loss is NaN at step 3"
    )


def test_anything_else_falls_back_to_the_exceptions_last_line():
    failure = explain(raised(lambda: {}["warm_start"]), small_config(), what="The launch")
    assert (failure.kind, failure.message) == ("error", "The launch failed: KeyError: 'warm_start'.")
    # A remote error: the line Ray wrapped, not its "ray::..." header.
    remote = RayTaskError(
        "f", reported_traceback(IndexError("list index out of range")), IndexError("x"), pid=1, ip="x"
    )
    assert explain(remote.as_instanceof_cause()).message == "IndexError: x."


def test_the_traceback_is_the_full_one_cut_in_the_middle_to_its_bound():
    def trainer_failed():
        raise ValueError("x" * 3 * DETAIL_MAX + "\nlast line")

    failure = explain(caught_in("trainer", raised(trainer_failed), small_config()), small_config())
    assert len(failure.traceback) <= DETAIL_MAX
    assert failure.traceback.startswith("Traceback") and failure.traceback.endswith("last line\n")
    assert "characters cut" in failure.traceback
    assert clip("short", 10) == "short"


def test_the_message_and_the_facts_name_no_server_file_the_traceback_does():
    failure = explain(caught_in("trainer", raised(load_model, "run-scratch-that-is-not-here"), small_config()))
    assert failure.kind == "actor_error"
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert here in failure.traceback  # the frames of the server's files, for admins
    assert here not in failure.message and here not in failure.detail


def test_the_reporter_posts_the_record_and_spools_it(tmp_path):
    failure = explain(raised(lambda: bytearray(2**62)), small_config(), phase="warm_start")
    with IngestStub(token="t") as stub:
        rep = MetricsReporter(41, stub.url, "t", str(tmp_path))
        assert rep.post_status("failed", failure=failure) is True
    [(_, _, body)] = [r for r in stub.requests if r[0] == "status"]
    assert body == {
        "status": "failed",
        "error": failure.message,
        "error_detail": failure.detail,
        "error_kind": "out_of_memory",
        "failure": failure.fields(),
    }
    assert body["failure"]["actor"] == "driver" and "MemoryError" in body["failure"]["traceback"]

    down = MetricsReporter(42, "http://127.0.0.1:9", "t", str(tmp_path), timeout_s=0.2)
    assert down.post_status("failed", failure=failure) is False
    down.close(timeout_s=0.2)
    spooled = read_spooled_status(42, str(tmp_path))
    assert (spooled["error"], spooled["error_detail"], spooled["failure"]) == (
        failure.message,
        failure.detail,
        failure.fields(),
    )


# --- on the real engine --------------------------------------------------------------


@pytest.mark.slow
def test_a_run_whose_model_directory_has_no_config_json_fails_saying_so(cluster, stub, cache_dir, tmp_path):
    empty = tmp_path / "models" / "empty"
    empty.mkdir(parents=True)
    config = tiny_config(model={"source": "path", "path": str(empty)})
    launch(901, config, ingest_url=stub.url, token=TOKEN, cache_dir=cache_dir, confinement=confinement(tmp_path))
    wait_for(lambda: stub.status.get(901) == "failed", 60, "the run to fail")
    assert stub.statuses[901] == ["running", "failed"]  # a run that cannot start posts failed
    assert stub.errors[901] == (
        f"The model directory {empty} has no config.json: point model.path at a Hugging Face model directory."
    )
    [body] = [b for kind, run, b in stub.requests if kind == "status" and run == 901 and b["status"] == "failed"]
    assert "Traceback (most recent call last)" in body["failure"]["traceback"]
    assert "PathNotAllowed: model.path:" in body["failure"]["traceback"]
    assert (body["error_kind"], body["failure"]["operation"]) == ("bad_model", "warm_start")
    wait_for(lambda: not run_actor_names(901), GONE_WAIT_S, "the failed driver to exit")


# A run actor killed mid-run fails the run naming it (the exact sentence, ActorDiedError
# in the record, the actor's name): tests/engine/test_ledger_resume.py, whose killed runs
# kill each kind of run actor and then resume.


# --- across Ray, on the shared cluster -------------------------------------------------


def test_a_constructor_error_reaches_the_driver_as_its_record(cluster):
    """An actor's constructor keeps its record; `ready` raises it, and Ray carries the
    record whole (an error raised from a constructor would reach the caller as text)."""
    cfg = small_config()
    bad = buffer_plan(cfg.buffer, cfg.mode, 2, cfg.trainer)
    bad = dataclasses.replace(bad, capacity_groups=0)  # the buffer cannot be built
    actor = BufferActor.options(name="run-8801-buffer", namespace=NAMESPACE).remote(bad, 2)
    try:
        error = raised(ray.get, actor.ready.remote())
        failure = explain(error, cfg)
    finally:
        ray.kill(actor)
    assert (failure.kind, failure.actor, failure.actor_name, failure.operation) == (
        "actor_start",
        "buffer",
        "run-8801-buffer",
        STARTING,
    )
    assert failure.message == (
        "The buffer could not start: ValueError: RolloutBuffer capacity_groups must be ≥ 1 or None for unbounded "
        "(got 0)."
    )
    assert failure.node.endswith(f"(Ray node {ray.get_runtime_context().get_node_id()[:12]})")


def test_a_killed_actor_is_named_from_rays_actor_table(cluster):
    cfg = small_config()
    actor = BufferActor.options(name="run-8802-buffer", namespace=NAMESPACE).remote(
        buffer_plan(cfg.buffer, cfg.mode, 2, cfg.trainer), 2
    )
    assert ray.get(actor.ready.remote()) is True
    pid = ray_deaths.actor_info(actor._actor_id.hex(), wait=False)["Pid"]
    ray.kill(actor, no_restart=True)
    # ray.kill only asks. Ray's actor table says DEAD before the actor's process has gone,
    # and a call that reaches the process before it goes is answered (once in a whole
    # suite): the next call is refused once the table says so and the process is gone.

    def dead() -> bool:
        info = ray_deaths.actor_info(actor._actor_id.hex(), wait=False) or {}
        return info.get("State") == "DEAD" and not psutil.pid_exists(pid)

    wait_for(dead, GONE_WAIT_S, "Ray to record the killed buffer as dead and its process to exit")
    failure = explain(raised(ray.get, actor.ready.remote()), cfg)
    assert (failure.kind, failure.message) == (
        "actor_died",
        "The buffer (Ray actor run-8802-buffer) died: it was killed (ray.kill). Launch the run again.",
    )
