"""Colocated placement that time-shares a GPU (workers/run/colocation.py): the order of one
step's calls at each inference.sleep_level, and the memory one shared GPU is planned for."""

from __future__ import annotations

import pytest

from workers.core.watch import Watch
from workers.run.colocation import OFFLOADED, Phase, shared_gpu, step_phases

GIB = 2**30


@pytest.mark.parametrize("level", [1, 2])
def test_vllm_sleeps_through_the_trainers_step_and_wakes_weights_before_its_kv_cache(level):
    assert step_phases(level) == [
        Phase("inference", "generate"),
        Phase("inference", "sleep", (level,)),
        Phase("trainer", "load", OFFLOADED),
        Phase("trainer", "train"),
        Phase("trainer", "offload", OFFLOADED),
        Phase("inference", "wake_up", (("weights",),)),
        Phase("inference", "update_weights"),
        Phase("inference", "wake_up", (("kv_cache",),)),
    ]
    assert OFFLOADED == ("optimizer state", "gradients")


def test_without_sleep_nothing_sleeps_or_offloads():
    calls = [p.call for p in step_phases(0)]
    assert calls == ["generate", "train", "update_weights"]


def test_a_sleep_level_vllm_has_not_is_refused():
    with pytest.raises(ValueError, match="inference.sleep_level must be 0, 1 or 2"):
        step_phases(3)


def test_a_shared_gpu_holds_the_larger_phase_when_vllm_sleeps_and_their_sum_when_it_does_not():
    vllm, asleep, peak, resident = 48 * GIB, 1 * GIB, 33 * GIB, 29 * GIB
    both = shared_gpu(0, vllm, asleep, peak, resident)
    assert both.peak == both.generating == both.training == 81 * GIB
    for level in (1, 2):
        turns = shared_gpu(level, vllm, asleep, peak, resident)
        assert (turns.generating, turns.training) == (77 * GIB, 34 * GIB)
        assert turns.peak == 77 * GIB
    # The training phase is the larger when vLLM's share is small.
    assert shared_gpu(1, 4 * GIB, asleep, peak, resident).peak == 34 * GIB


# --- the inference side: vLLM's sleep and wake_up at the plan's points ------------------


class RecordingLLM:
    """Stands in for vLLM's LLM: records the sleep and wake_up calls it receives."""

    def __init__(self, calls: list) -> None:
        self.calls = calls

    def sleep(self, level: int) -> None:
        self.calls.append(("sleep", level))

    def wake_up(self, tags: list[str]) -> None:
        self.calls.append(("wake_up", tuple(tags)))


def recording_backend(level: int, calls: list):
    import threading

    from workers.config.run_config import InferenceConfig
    from workers.inference.vllm_backend import VLLMBackend

    backend = object.__new__(VLLMBackend)  # no engine: the fake LLM is its engine
    backend.inference_cfg = InferenceConfig(backend="vllm", sleep_level=level)
    backend._llm = RecordingLLM(calls)
    backend._lock = threading.RLock()
    return backend


@pytest.mark.parametrize("level", [1, 2])
def test_the_backend_sleeps_at_the_runs_level_and_wakes_weights_then_kv_cache_once_each(level):
    calls: list = []
    backend = recording_backend(level, calls)
    backend.sleep()
    backend.sleep()  # already asleep
    backend.wake_up(("weights",))
    backend.wake_up(("weights",))  # already awake
    backend.wake_up(("weights", "kv_cache"))
    backend.wake_up(("kv_cache",))
    assert calls == [("sleep", level), ("wake_up", ("weights",)), ("wake_up", ("kv_cache",))]


def test_at_sleep_level_0_the_backend_never_sleeps():
    calls: list = []
    backend = recording_backend(0, calls)
    backend.sleep()
    backend.wake_up(("weights", "kv_cache"))
    assert calls == []


def test_the_inference_worker_wakes_weights_before_the_update_and_kv_cache_after():
    import threading

    from workers.config.run_config import RunConfig
    from workers.core.timeline import ASLEEP, Timeline
    from workers.run.inference_host import InferenceHost

    calls: list = []
    backend = recording_backend(1, calls)
    backend.label_weights = lambda version: calls.append(("label", version))

    class Receiver:
        def apply(self, backend, staged):
            calls.append(("update_weights", staged))

    worker = object.__new__(InferenceHost)  # outside Ray, no engine
    worker.cfg = RunConfig.model_validate(
        {"mode": "sync", "placement": {"devices": "gpu", "mode": "colocated"}, "inference": {"sleep_level": 1}}
    )
    worker.backend, worker.receiver, worker.watch = backend, Receiver(), Watch()
    worker._gpu_handed_over, worker.timeline = threading.Event(), Timeline()
    worker._hand_over_gpu()
    assert worker.wait_asleep(0)
    worker._load("v1")
    assert not worker.wait_asleep(0)  # the trainer's turn ended with the update
    worker._awake()  # before the next generate: already awake, nothing to call
    assert calls == [
        ("sleep", 1),
        ("wake_up", ("weights",)),
        ("update_weights", "v1"),
        ("wake_up", ("kv_cache",)),
    ]
    # The timeline's `asleep` segment: from the sleep to the weights' waking, once.
    (segment,), _, _ = worker.timeline.drain()
    assert segment.kind == ASLEEP and segment.t1 > segment.t0


def test_a_gpu_engine_that_will_sleep_is_built_with_vllms_sleep_mode():
    from workers.config.run_config import InferenceConfig
    from workers.inference import vllm_backend
    from workers.model.loading import ModelDims

    dims = ModelDims(
        hidden=64, layers=2, heads=2, kv_heads=2, head_dim=32, intermediate=128, vocab=40, positions=64, tied=False
    )

    def args(level: int) -> dict:
        inference = InferenceConfig(backend="vllm", sleep_level=level)
        return vllm_backend._engine_args("/models/m", dims, 48, inference, False, None, "bfloat16", None, False, "ipc")

    assert args(1)["enable_sleep_mode"] is True and args(2)["enable_sleep_mode"] is True
    assert "enable_sleep_mode" not in args(0)


def test_the_trainers_optimizer_state_moves_to_its_device_but_adams_step_counter_stays():
    import torch

    from workers.train.offload import OptimizerOffload

    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.AdamW([weight], lr=0.1)
    weight.grad = torch.full((3,), 0.5)
    optimizer.step()
    OptimizerOffload(optimizer).load(torch.device("meta"))  # stands in for a GPU
    moved = optimizer.state[weight]
    assert moved["exp_avg"].device.type == moved["exp_avg_sq"].device.type == "meta"
    assert moved["step"].device.type == "cpu"
    # Its way back (pinned buffers, the cache returned): tests/gpu/test_gpu.py.


def test_the_inference_worker_sleeps_when_the_buffer_admits_it_no_more_groups(monkeypatch):
    import threading

    from workers.config.run_config import RunConfig
    from workers.core.timeline import Timeline
    from workers.run import inference_host
    from workers.run.inference_host import InferenceHost

    calls: list = []
    worker = object.__new__(InferenceHost)  # outside Ray, no engine
    worker.cfg = RunConfig.model_validate(
        {"mode": "sync", "placement": {"devices": "gpu", "mode": "colocated"}, "inference": {"sleep_level": 2}}
    )
    worker.backend = recording_backend(2, calls)
    worker.episodes, worker.version, worker._resume_at, worker.eval_prompts = None, 0, 0, None
    worker.chunk_groups, worker.error, worker.index, worker.timeline = 1, None, 0, Timeline()
    worker._stop, worker._weights_arrived = threading.Event(), threading.Event()
    worker._gpu_handed_over = threading.Event()

    class Staged:
        def apply(self) -> None:
            pass

    class Gate:  # the buffer's admission: the batch is complete, the trainer steps
        def remote(self, version, groups, worker):
            return 0

    class Buffer:
        admit = Gate()

    worker.staged, worker.buffer = Staged(), Buffer()
    refusals: list[int] = []

    def admitted(_ref) -> int:
        refusals.append(0)
        if len(refusals) == 2:
            worker._stop.set()  # the loop ends after its second refusal
        return 0

    monkeypatch.setattr(inference_host.ray, "get", admitted)
    assert not worker.wait_asleep(0)  # awake: the trainer rank must not step yet
    worker._loop()
    assert worker.error is None
    assert len(refusals) == 2 and calls == [("sleep", 2)]  # once, however many refusals follow
    assert worker.wait_asleep(0)  # asleep: the trainer rank's turn
    worker._awake()
    assert not worker.wait_asleep(0) and calls[-1] == ("wake_up", ("weights", "kv_cache"))


def test_a_worker_that_never_sleeps_never_holds_the_trainer_back():
    from workers.config.run_config import RunConfig
    from workers.run.inference_host import InferenceHost

    worker = object.__new__(InferenceHost)
    worker.cfg = RunConfig.model_validate({"mode": "sync"})
    assert worker.wait_asleep(0)


def test_a_trainer_taking_turns_steps_only_once_every_worker_sleeps(monkeypatch):
    """The trainer's half of the turn (workers/run/colocation.py): its step waits for the
    last worker's vLLM to sleep, asking again while any is awake, and gives up when the
    run stops."""
    import threading

    from workers.config.run_config import RunConfig
    from workers.run import trainer_host
    from workers.run.trainer_host import TrainerHost

    answers = iter([[True, False], [False, False], [True, True]])
    asked: list[float] = []

    class Worker:
        class wait_asleep:  # noqa: N801 - a Ray method handle's shape
            @staticmethod
            def remote(timeout):
                asked.append(timeout)
                return timeout

    monkeypatch.setattr(trainer_host.ray, "get", lambda refs: next(answers))
    trainer = object.__new__(TrainerHost)
    trainer.cfg = RunConfig.model_validate(
        {"mode": "sync", "placement": {"devices": "gpu", "mode": "colocated"}, "inference": {"sleep_level": 1}}
    )
    trainer.workers, trainer._stop = [Worker(), Worker()], threading.Event()
    assert trainer._gpu_turn()
    assert len(asked) == 6  # three rounds of two workers, until both slept
    trainer._stop.set()
    assert not trainer._gpu_turn()  # stopping: no step, no wait

    trainer.cfg = RunConfig.model_validate({"mode": "sync"})
    trainer._stop.clear()
    assert trainer._gpu_turn() and len(asked) == 6  # never sleeping: nobody is asked


def test_the_episode_loop_hands_the_gpu_over_with_nothing_in_flight_and_wakes_before_a_turn(monkeypatch):
    """The loop for episodes sleeps where the plain loop does (admission refused, nothing
    in flight) and wakes vLLM before it steps the episodes admitted after."""
    import threading

    from workers.config.run_config import RunConfig
    from workers.core.timeline import Timeline
    from workers.run.inference_host import InferenceHost

    calls: list = []
    worker = object.__new__(InferenceHost)  # outside Ray, no engine
    worker.cfg = RunConfig.model_validate(
        {"mode": "sync", "placement": {"devices": "gpu", "mode": "colocated"}, "inference": {"sleep_level": 1}}
    )
    worker.backend = recording_backend(1, calls)
    worker.version, worker._resume_at, worker.eval_prompts, worker.error = 0, 0, None, None
    worker.chunk_groups, worker.num_workers, worker.index, worker.timeline = 1, 1, 0, Timeline()
    worker.watch = Watch()
    worker._stop, worker._weights_arrived = threading.Event(), threading.Event()
    worker._gpu_handed_over = threading.Event()
    worker.timings, worker._evals_lock = [], threading.Lock()
    worker._late_overcommit = None  # the test hook off, as without its variable

    class Staged:
        def apply(self) -> None:
            pass

        def pending(self) -> bool:
            return False

    class Policy:
        def loads_between_calls(self, in_flight: bool) -> bool:
            return True

        def admits_while_pending(self) -> bool:
            return True

    class Scheduler:  # round 1: nothing admitted, nothing in flight; round 2: one episode
        in_flight, tokens, rounds = 0, 1, 0

        def next_ready_in(self):
            self.rounds += 1
            return None if self.rounds == 1 else 0.0

        def step(self, version):
            calls.append(("step", worker.wait_asleep(0)))
            worker._stop.set()
            return []

        def drain_timings(self):
            return []

    worker.staged, worker.policy, worker.episodes = Staged(), Policy(), Scheduler()
    monkeypatch.setattr(worker, "_admit_episodes", lambda room: None, raising=False)
    worker._episode_loop()
    assert worker.error is None
    assert calls == [("sleep", 1), ("wake_up", ("weights", "kv_cache")), ("step", False)]
