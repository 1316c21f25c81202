"""Weights into vLLM through its RL interface (`init_weight_transfer_engine` once,
`start_weight_update` / `update_weights` / `finish_weight_update` per version) and the
project's engines registered with vLLM's factories (workers/sync/vllm_engines.py).

Exactness is read back out of vLLM's worker: its parameters, un-fused into checkpoint
names (vLLM stacks q/k/v and gate/up into one weight each), checksummed against the
trainer's. One engine serves the module (a start costs ~20 s here).
"""

from __future__ import annotations

import contextlib
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import ray
import torch
from ray import cloudpickle

from tests.engine.helpers import PoolRank, skip_without_vllm
from tests.engine.test_weight_sync_protocols import sync, sync_cfg, train_a_little, trainer_model
from workers.config.run_config import InferenceConfig, ModelConfig
from workers.sync import make_receiver, make_sender, state_checksum
from workers.sync.object_store import InProcessStore

skip_without_vllm()

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

MODEL = ModelConfig(num_heads=2)  # head_dim 32: a size vLLM-CPU's attention has


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    from workers.model.loading import build_tiny, save_model
    from workers.model.tokenizer import CharTokenizer

    path = str(tmp_path_factory.mktemp("transfer-model"))
    save_model(build_tiny(MODEL, CharTokenizer(), seed=0), CharTokenizer(), path)
    return path


@pytest.fixture(scope="module")
def backend(model_dir):
    from workers.inference.vllm_backend import VLLMBackend

    # Built on one torch thread, as in a Ray worker, while the test's threads keep their
    # own count: each call must still run on the engine's (workers.inference.vllm_backend.EngineLock).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        b = VLLMBackend(model_dir, InferenceConfig(backend="vllm"), max_num_seqs=8)
    finally:
        torch.set_num_threads(threads)
    yield b
    b.close()


def _watch_arrivals(worker) -> str:
    # Runs inside vLLM's worker. vLLM-CPU packs its linear weights for oneDNN after
    # loading and drops the readable copies, so what is checked is what its transfer
    # engine hands the model's loader, recorded on the way in.
    engine = worker.weight_transfer_engine
    model = engine.model
    if not hasattr(worker, "arrived"):
        worker.arrived = {}
        load = model.load_weights

        def recording(weights):
            weights = list(weights)
            worker.arrived.update({k: t.detach().clone() for k, t in weights})
            return load(iter(weights))

        model.load_weights = recording
    return type(engine).__name__


def _take_arrivals(worker) -> dict:
    arrived, worker.arrived = worker.arrived, {}
    return arrived


def _arrived_checksum(backend) -> str:
    return state_checksum(backend._llm.collective_rpc(_take_arrivals)[0])


def _logprobs(backend, prompts) -> list[list[float]]:
    groups = backend.generate(prompts, n=2, max_new_tokens=6, temperature=1.0, seed=5)
    return [c.logprobs for g in groups for c in g], [c.token_ids for g in groups for c in g]


def _reference_diff(model, prompts, backend) -> float:
    """max |logprob| difference between vLLM's samples and the trainer's model."""
    groups = backend.generate(prompts, n=2, max_new_tokens=6, temperature=1.0, seed=5)
    worst = 0.0
    for prompt, group in zip(prompts, groups, strict=True):
        for c in group:
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([prompt + c.token_ids])).logits[0].float()
            ref = torch.log_softmax(logits, -1)
            expected = [ref[len(prompt) - 1 + k, t].item() for k, t in enumerate(c.token_ids)]
            worst = max(worst, max(abs(a - b) for a, b in zip(c.logprobs, expected, strict=True)))
    return worst


PROMPTS = [[1, 5, 6, 7, 8], [1, 9, 10, 11]]


def _old_reload(worker, weights) -> None:
    # The path before the weight-transfer interface: vLLM's reload_weights over an RPC.
    worker.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)


def test_the_backend_builds_vllm_with_the_projects_registered_engine(backend):
    assert backend.transfer_engine == "rollway_memory"
    assert backend._llm.collective_rpc(_watch_arrivals) == ["MemoryEngine"]


@pytest.mark.parametrize("protocol", ["object_store", "filesystem"])
def test_a_full_sync_reaches_vllms_worker_bit_identical_through_update_weights(backend, model_dir, protocol, tmp_path):
    store = InProcessStore()
    model = trainer_model(model_dir)
    fields = {"directory": str(tmp_path)} if protocol == "filesystem" else {}
    sender = make_sender(sync_cfg(protocol, **fields), store=store)
    receiver = make_receiver(sync_cfg(protocol), model_dir=model_dir, store=store)
    sender.attach(model)
    try:
        backend._llm.collective_rpc(_watch_arrivals)
        for version in (1, 2):
            train_a_little(model, seed=version)
            assert _reference_diff(model.eval(), PROMPTS, backend) > 1e-2  # not these weights yet
            sent, received = sync(sender, receiver, backend, version)
            assert _arrived_checksum(backend) == state_checksum(model.state_dict())
            assert _reference_diff(model, PROMPTS, backend) < 1e-3  # and vLLM computes with them
            assert received.version == sent.version == version
    finally:
        sender.close()
        receiver.close()


def test_a_lora_trainers_merged_weights_reach_vllms_worker_bit_identical(backend, model_dir):
    """LoRA with a full-weight protocol: the trainer sends base + scaling · B·A merged,
    under checkpoint names, and the engine loads that (adapter-only sync is a
    LoRARequest instead: tests/engine/test_weight_sync_protocols.py)."""
    from workers.config.run_config import LoRAConfig
    from workers.model.lora import apply_lora, effective_state_dict

    torch.manual_seed(0)
    model = apply_lora(trainer_model(model_dir), LoRAConfig(enabled=True, rank=8, alpha=16.0), init_lora_weights=False)
    store = InProcessStore()
    sender = make_sender(sync_cfg("object_store"), store=store)
    receiver = make_receiver(sync_cfg("object_store"), model_dir=model_dir, store=store)
    sender.attach(model)
    backend._llm.collective_rpc(_watch_arrivals)
    try:
        train_a_little(model, seed=3)
        merged = effective_state_dict(model)
        assert state_checksum(merged) != state_checksum(trainer_model(model_dir).state_dict())
        sync(sender, receiver, backend, 1)
        assert _arrived_checksum(backend) == state_checksum(merged)
        assert _reference_diff(model.eval(), PROMPTS, backend) < 1e-3
    finally:
        sender.close()
        receiver.close()


def test_vllms_trainer_factory_drives_the_backend_as_its_client_bit_identical(backend, model_dir):
    """The trainer-side twin, built by vLLM's WeightTransferTrainerFactory from its init
    info, sends a ModuleSource (the trainer's parameters) through the backend's four
    VLLMWeightSyncClient calls."""
    from vllm.distributed.weight_transfer import ModuleSource, WeightTransferTrainerFactory

    from workers.sync.vllm_engines import MemoryTrainerEngine, MemoryTrainerInitInfo

    model = trainer_model(model_dir)
    train_a_little(model, seed=7)
    engine = WeightTransferTrainerFactory.trainer_init(
        MemoryTrainerInitInfo(rank=0), client=backend, source=ModuleSource(model)
    )
    assert isinstance(engine, MemoryTrainerEngine)
    backend._llm.collective_rpc(_watch_arrivals)
    engine.send_weights()
    assert _arrived_checksum(backend) == state_checksum(model.state_dict())
    assert _reference_diff(model.eval(), PROMPTS, backend) < 1e-3
    # A rank other than 0 iterates its source (a sharded one gathers) and calls nothing.
    quiet = WeightTransferTrainerFactory.trainer_init(MemoryTrainerInitInfo(rank=1), client=None, source=[])  # type: ignore[arg-type]
    quiet.send_weights()


def test_a_refused_update_ends_the_session_and_leaves_generation_free(backend):
    import threading

    before = _logprobs(backend, PROMPTS)
    backend.start_weight_update()
    with pytest.raises(ValueError, match="Invalid update_info for MemoryEngine"):
        backend.update_weights({"tensors": []})
    outcome: dict = {}

    def generate_elsewhere():
        # A new thread has OpenMP's default count, not the engine's one thread (as an
        # actor's concurrent call may): the engine's lock gives it the engine's count.
        try:
            outcome["logprobs"] = _logprobs(backend, PROMPTS)
        except BaseException as exc:  # reported below
            outcome["error"] = exc

    other = threading.Thread(target=generate_elsewhere)
    other.start()
    other.join(60)
    assert outcome, "a generate call in another thread still waits for the update's lock"
    assert "error" not in outcome, f"the refused update left the model unusable: {outcome.get('error')!r}"
    assert outcome["logprobs"] == before  # nothing was loaded
    backend.start_weight_update()  # a new session may start
    backend.update_weights({"weights": []})
    backend.finish_weight_update()


def test_update_weights_and_the_old_reload_leave_the_engine_sampling_the_same(backend, model_dir, capsys):
    """The same weights by either path give the same tokens and logprobs, bit for bit;
    the log line gives the time of each load."""
    from workers.model.loading import saved_form

    model = trainer_model(model_dir)
    times: dict[str, list[float]] = {"update_weights": [], "reload_weights": []}
    for seed in (11, 12, 13):
        train_a_little(model, seed=seed)
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        started = time.perf_counter()
        backend.load_weights(state)
        times["update_weights"].append((time.perf_counter() - started) * 1e3)
        through_engine = _logprobs(backend, PROMPTS)
        weights = [(k, t.contiguous()) for k, t in saved_form(state, backend._meta_model).items()]
        started = time.perf_counter()
        backend._llm.collective_rpc(_old_reload, args=(weights,))
        times["reload_weights"].append((time.perf_counter() - started) * 1e3)
        backend._weights_changed()
        assert _logprobs(backend, PROMPTS) == through_engine
    with capsys.disabled():
        print(
            f"\nfull sync of the tiny model ({sum(t.numel() * 4 for t in state.values()) / 2**20:.2f} MiB) "
            "into vLLM-CPU, ms per load (3 versions): "
            + "; ".join(f"{k} {[round(x, 1) for x in v]}" for k, v in times.items())
        )


def test_a_tensor_parallel_engine_is_refused_the_in_memory_engine(model_dir):
    from workers.inference.vllm_backend import VLLMBackend

    with pytest.raises(ValueError, match="rollway_files"):
        VLLMBackend(
            model_dir, InferenceConfig(backend="vllm", tensor_parallel_size=2), transfer_engine="rollway_memory"
        )


def test_the_files_engine_loads_a_sync_bit_identical_in_one_process(model_dir):
    from workers.inference.vllm_backend import VLLMBackend

    files = VLLMBackend(model_dir, InferenceConfig(backend="vllm"), max_num_seqs=8, transfer_engine="rollway_files")
    try:
        assert files._llm.collective_rpc(_watch_arrivals) == ["FilesEngine"]
        model = trainer_model(model_dir)
        train_a_little(model, seed=21)
        files.load_weights(dict(model.state_dict()))
        assert _arrived_checksum(files) == state_checksum(model.state_dict())
        assert _reference_diff(model.eval(), PROMPTS, files) < 1e-3
    finally:
        files.close()


@pytest.mark.parametrize("engine, tp, via", [("nccl", 2, "file"), ("nccl", 1, "memory"), ("rollway_files", 1, "file")])
def test_a_state_dict_goes_through_files_wherever_vllms_workers_are_other_processes(engine, tp, via):
    """Which path `load_weights` takes, without an engine: files for a tensor-parallel
    engine whatever its transfer engine (vLLM's own on GPUs too) and for `rollway_files`."""
    from workers.inference.vllm_backend import VLLMBackend

    backend = object.__new__(VLLMBackend)
    backend.transfer_engine = engine
    backend.inference_cfg = InferenceConfig(backend="vllm", tensor_parallel_size=tp)
    taken: list[str] = []

    class InMemory(Exception):
        pass

    def in_memory() -> None:
        taken.append("memory")
        raise InMemory  # the path's first step: stop before the (absent) engine

    backend.load_weights_from_file = lambda state_dict: taken.append("file")  # type: ignore[method-assign]
    backend._check_open = in_memory  # type: ignore[method-assign]
    with contextlib.suppress(InMemory):
        backend.load_weights({})
    assert taken == [via]


# -- protocol "collective" into vLLM: vLLM's broadcast engine pair, driven by the trainer --


@pytest.fixture(scope="module")
def gloo_backend(model_dir):
    """An engine built as a CPU run's collective builds it: vLLM's NCCL engine over gloo."""
    from workers.inference.vllm_backend import VLLMBackend

    b = VLLMBackend(model_dir, InferenceConfig(backend="vllm"), max_num_seqs=8, transfer_engine="rollway_gloo")
    yield b
    b.close()


def _connect_engines(sender, receivers) -> None:
    """The run's sync_connect: the trainer's end and every worker's engine at once."""
    import threading

    endpoint = sender.endpoint()
    errors: list[BaseException] = []

    def join(receiver, rank):
        try:
            receiver.connect(endpoint, rank)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=join, args=(r, k + 1)) for k, r in enumerate(receivers)]
    for t in threads:
        t.start()
    sender.connect()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]


@pytest.mark.parametrize("packed", [False, True], ids=["per_tensor", "packed"])
def test_a_collective_drives_vllms_broadcast_engine_and_arrives_bit_identical(gloo_backend, model_dir, packed):
    """The trainer's vLLM engine (WeightTransferTrainerFactory, `rollway_gloo`: vLLM's
    NCCL pair with gloo for NCCL) declares the update, the worker's engine joins the
    broadcast inside `update_weights`, and the weights vLLM loads are the trainer's, bit
    for bit, version after version, labelled with their version. Packed: vLLM's chunks
    (a 64 KiB buffer cuts the tiny model into many)."""
    from workers.model.loading import untied

    model = trainer_model(model_dir)
    cfg = sync_cfg("collective", packed=packed, bucket_mb=1 / 16, timeout_s=60)
    sender = make_sender(cfg, engine="rollway_gloo")
    receiver = make_receiver(cfg, engine="rollway_gloo", backend=gloo_backend)
    sender.attach(model)
    assert gloo_backend._llm.collective_rpc(_watch_arrivals) == ["GlooEngine"]
    try:
        _connect_engines(sender, [receiver])
        for version in (1, 2):
            train_a_little(model, seed=30 + version)
            assert _reference_diff(model.eval(), PROMPTS, gloo_backend) > 1e-2
            sent, received = sync(sender, receiver, gloo_backend, version)
            assert _arrived_checksum(gloo_backend) == state_checksum(model.state_dict())
            assert _reference_diff(model, PROMPTS, gloo_backend) < 1e-3
            assert received.version == sent.version == version
            assert sent.tensors == received.tensors == len(untied(model.state_dict(), model))
            groups = gloo_backend.generate([PROMPTS[0]], n=1, max_new_tokens=2, temperature=1.0, seed=1)
            assert set(groups[0][0].versions) == {version}  # vLLM's own label, set as the update finished
    finally:
        sender.close()
        receiver.close()


def test_a_lora_trainers_merged_policy_goes_through_the_broadcast_engine(gloo_backend, model_dir):
    from workers.config.run_config import LoRAConfig
    from workers.model.lora import apply_lora, effective_state_dict

    torch.manual_seed(0)
    model = apply_lora(trainer_model(model_dir), LoRAConfig(enabled=True, rank=8, alpha=16.0), init_lora_weights=False)
    cfg = sync_cfg("collective", timeout_s=60)
    sender = make_sender(cfg, engine="rollway_gloo")
    receiver = make_receiver(cfg, engine="rollway_gloo", backend=gloo_backend)
    sender.attach(model)
    gloo_backend._llm.collective_rpc(_watch_arrivals)
    try:
        _connect_engines(sender, [receiver])
        train_a_little(model, seed=9)
        sync(sender, receiver, gloo_backend, 1)
        assert _arrived_checksum(gloo_backend) == state_checksum(effective_state_dict(model))
        assert _reference_diff(model.eval(), PROMPTS, gloo_backend) < 1e-3
    finally:
        sender.close()
        receiver.close()


# Ray ships this module by value: its workers cannot import a test file.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class _SendingRank(PoolRank):
    """A rank of an fsdp2 pool (tests/engine/helpers.py) whose rank 0 sends the run's
    weights (`engine`: driving that vLLM engine) and whose other ranks join its gathers,
    as the run's trainer host does (`TrainerHost._send`, `follow_sync`)."""

    def open_sender(self, cfg, engine: str | None) -> dict:
        self.sender = make_sender(cfg.sync, engine=engine)
        self.sender.attach(self.trainer.model)
        return self.sender.endpoint()

    def connect_sender(self) -> None:
        self.sender.connect()

    def send(self, version: int, notices, others: list):
        refs = [o.follow.remote(self.sender.gathers) for o in others]
        sent = self.sender.send(version, notices.put)
        ray.get(refs)
        return sent

    def follow(self, gathers) -> None:
        from workers.sync.weights import follow

        follow(self.trainer.model, gathers)

    def close_sender(self) -> None:
        self.sender.close()


@pytest.mark.parametrize("protocol", ["collective", "object_store"])
def test_an_fsdp2_pools_sync_reaches_vllms_worker_bit_identical(request, cluster, model_dir, protocol):
    """Two ranks of an fsdp2 pool: rank 0 sends the gathered buckets, rank 1 joins the
    gathers, and the weights vLLM's loader receives are the pool's, bit for bit, after
    each of two trained steps (a shard out of place, or a bucket sent before rank 1
    joined, would change them). A collective is vLLM's broadcast engine pair driven by
    rank 0 (`rollway_gloo`); the object store's buckets are staged by the worker and
    handed to the `rollway_memory` engine."""
    from ray.util.queue import Queue

    from tests.engine.helpers import build_pool, fixed_groups, small_config

    engine, worker_engine = ("rollway_gloo", "GlooEngine") if protocol == "collective" else (None, "MemoryEngine")
    backend = request.getfixturevalue("gloo_backend" if engine else "backend")
    Rank = ray.remote(num_cpus=0)(_SendingRank)
    cfg = small_config(
        model=MODEL.model_dump(),
        trainer={"backend": "fsdp2", "num_ranks": 2, "lr": 5e-3},
        sync={"protocol": protocol, "bucket_mb": 1 / 16, "timeout_s": 60},
    )
    ranks = [Rank.remote(0), Rank.remote(1)]
    notices = Queue()
    receiver = make_receiver(cfg.sync, engine=engine, backend=backend)
    try:
        build_pool(ranks, cfg, model_dir)
        endpoint = ray.get(ranks[0].open_sender.remote(cfg, engine))
        assert backend._llm.collective_rpc(_watch_arrivals) == [worker_engine]
        with ThreadPoolExecutor(1) as pool:  # both ends of the rendezvous at once
            joined = pool.submit(receiver.connect, endpoint, 1)
            ray.get(ranks[0].connect_sender.remote(), timeout=120)
            joined.result(timeout=120)
        before = state_checksum(ray.get([r.weights.remote() for r in ranks])[0])
        for version in (1, 2):
            ray.get(ranks[0].step.remote(fixed_groups(model_dir, cfg, seed=40 + version), ranks[1:]), timeout=120)
            whole = ray.get([r.weights.remote() for r in ranks])[0]
            assert state_checksum(whole) != before, "the step must move the weights for the check to mean anything"
            before = state_checksum(whole)
            sending = ranks[0].send.remote(version, notices, ranks[1:])
            report = receiver.apply(backend, receiver.receive(notices.get(timeout=120)))
            sent = ray.get(sending, timeout=120)
            assert _arrived_checksum(backend) == state_checksum(whole), f"version {version}"
            assert report.version == sent.version == version
    finally:
        with contextlib.suppress(Exception):
            ray.get(ranks[0].close_sender.remote(), timeout=30)
        receiver.close()
        for r in ranks:
            ray.kill(r)
