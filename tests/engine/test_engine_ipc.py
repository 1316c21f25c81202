"""Protocol "cuda_ipc" into vLLM: vLLM's own IPC engine pair, driven by the trainer
(workers/sync/engine_ipc.py).

CUDA IPC needs a GPU, so here both of vLLM's engines run their own code with the CUDA
calls they make stood in for (`reduce_tensor` hands the tensor itself,
`rebuild_cuda_tensor` takes it back, a made-up GPU UUID per process, no device sync): what is tested
is everything around the handles. The trainer side is vLLM's `IPCTrainerWeightTransferEngine`
over the project's `PolicySource` and `_Handoff` client; the worker side is vLLM's
`IPCWeightTransferEngine` loading into a stand-in for vLLM's model. On a GPU the same
pair runs with the real calls: `bench/gpu_scale.py --parts vllm_ipc`.
"""

from __future__ import annotations

import queue
import threading
from types import SimpleNamespace

import pytest
import torch

from tests.engine.helpers import skip_without_vllm
from tests.engine.test_weight_sync_protocols import JOIN_S, MODEL, connect, sync, train_a_little, trainer_model
from workers.config.run_config import SyncConfig
from workers.sync import make_receiver, make_sender, state_checksum

skip_without_vllm()

pytestmark = pytest.mark.vllm

UUID = "GPU-00000000-test"
RECEIVER_DEVICE = 3  # the index the worker sees its GPU at, which vLLM writes into each handle


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    from workers.model.loading import build_tiny, save_model
    from workers.model.tokenizer import CharTokenizer

    path = str(tmp_path_factory.mktemp("ipc-model"))
    save_model(build_tiny(MODEL, CharTokenizer(), seed=0), CharTokenizer(), path)
    return path


def _reduce_tensor(t):  # (rebuild function, args): the args' slot 6 is the device index
    return None, (t, None, None, None, None, None, 0)


def _rebuild_cuda_tensor(*args):
    assert args[6] == RECEIVER_DEVICE
    return args[0]


def stand_in_cuda(setattr, uuid: str = UUID) -> None:
    """The CUDA calls of vLLM's IPC engines, on a host without CUDA (`setattr`: the
    fixture's monkeypatch, or the builtin in a process of the test's own)."""
    import vllm.distributed.weight_transfer.ipc_engine as ipc

    setattr(ipc, "reduce_tensor", _reduce_tensor)
    setattr(ipc, "rebuild_cuda_tensor", _rebuild_cuda_tensor)
    setattr(torch.cuda, "get_device_properties", lambda index: SimpleNamespace(uuid=uuid))
    setattr(torch.cuda, "ipc_collect", lambda: None)
    setattr(torch.cuda, "synchronize", lambda *a: None)
    setattr(torch.accelerator, "current_device_index", lambda: 0)
    setattr(torch.accelerator, "synchronize", lambda *a: None)


@pytest.fixture
def fake_cuda(monkeypatch):
    stand_in_cuda(monkeypatch.setattr)


class StandInModel:
    """What vLLM's IPC engine loads into: `load_weights` over checkpoint names."""

    def __init__(self, model_dir: str) -> None:
        from workers.model.loading import load_model

        self.model = load_model(model_dir)
        self.loads = 0

    def load_weights(self, weights) -> None:
        state = self.model.state_dict()
        with torch.no_grad():
            for name, tensor in weights:
                state[name].copy_(tensor)
        self.loads += 1


class IpcBackend:
    """A vLLM backend's four weight-transfer calls, answered by vLLM's own worker-side
    IPC engine (no engine core around it)."""

    transfer_engine = "ipc"

    def __init__(self, model_dir: str) -> None:
        from vllm.config import WeightTransferConfig
        from vllm.distributed.weight_transfer.ipc_engine import IPCWeightTransferEngine

        self.target = StandInModel(model_dir)
        vllm_config = SimpleNamespace(parallel_config=None, model_config=None)
        self.engine = IPCWeightTransferEngine(
            WeightTransferConfig(backend="ipc"), vllm_config, torch.device("cuda", RECEIVER_DEVICE), self.target
        )
        self.calls: list[str] = []
        self.go = threading.Event()  # apply waits for it (set: no wait)
        self.go.set()

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self.engine.init_transfer_engine(self.engine.parse_init_info(init_info))
        self.calls.append("init")

    def start_weight_update(self) -> None:
        assert self.go.wait(JOIN_S)
        self.calls.append("start")  # vLLM's layerwise reload needs its model runner: not here

    def update_weights(self, update_info: dict) -> None:
        self.engine.update_weights(update_info)
        self.calls.append("update")

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.calls.append(f"finish {weight_version}")


def ipc_cfg(**fields) -> SyncConfig:
    return SyncConfig(protocol="cuda_ipc", **fields)


def test_the_trainer_drives_vllms_ipc_pair_and_the_policy_arrives_exact(fake_cuda, model_dir):
    """Version after version the worker's model equals the trainer's, bit for bit (a
    tied output layer once), through one update per version, labelled as it finishes."""
    from workers.model.loading import untied

    model = trainer_model(model_dir)
    sender = make_sender(ipc_cfg(timeout_s=30), engine="ipc")
    backend = IpcBackend(model_dir)
    receiver = make_receiver(ipc_cfg(), engine="ipc", backend=backend)
    sender.attach(model)
    try:
        connect(sender, [receiver])
        assert backend.calls == ["init"] and backend.engine.packed is False
        for version in (1, 2):
            train_a_little(model, seed=40 + version)
            assert state_checksum(backend.target.model.state_dict()) != state_checksum(model.state_dict())
            sent, received = sync(sender, receiver, backend, version)
            assert state_checksum(backend.target.model.state_dict()) == state_checksum(model.state_dict())
            assert received.version == sent.version == version
            assert sent.tensors == received.tensors == len(untied(model.state_dict(), model))
            assert sent.bytes == sum(t.numel() * t.element_size() for t in untied(model.state_dict(), model).values())
            assert backend.calls[-3:] == ["start", "update", f"finish {version}"]
        assert backend.target.loads == 2
    finally:
        sender.close()
        receiver.close()


def test_the_trainer_holds_its_tensors_until_the_worker_has_loaded_them(fake_cuda, model_dir):
    """vLLM's trainer engine releases the exported tensors when `update_weights`
    returns: the send must not return before the worker's update finished."""
    model = trainer_model(model_dir)
    sender = make_sender(ipc_cfg(timeout_s=30), engine="ipc")
    backend = IpcBackend(model_dir)
    receiver = make_receiver(ipc_cfg(), engine="ipc", backend=backend)
    sender.attach(model)
    notices: queue.Queue = queue.Queue()
    sent: dict = {}
    try:
        connect(sender, [receiver])
        backend.go.clear()  # the worker is busy: it applies when the test says so
        sending = threading.Thread(target=lambda: sent.update(report=sender.send(1, notices.put)))
        sending.start()
        notice = notices.get(timeout=JOIN_S)
        applying = threading.Thread(target=receiver.apply, args=(backend, receiver.receive(notice)))
        applying.start()
        sending.join(0.5)
        assert sending.is_alive() and "report" not in sent  # waits for the worker, however long
        assert backend.calls == ["init"]
        backend.go.set()
        applying.join(JOIN_S)
        sending.join(JOIN_S)
        assert sent["report"].version == 1 and backend.calls[-1] == "finish 1"
    finally:
        backend.go.set()
        sender.close()
        receiver.close()


def test_a_worker_that_never_loads_fails_the_send_naming_the_timeout(fake_cuda, model_dir):
    model = trainer_model(model_dir)
    sender = make_sender(ipc_cfg(timeout_s=1), engine="ipc")
    backend = IpcBackend(model_dir)
    receiver = make_receiver(ipc_cfg(), engine="ipc", backend=backend)
    sender.attach(model)
    try:
        connect(sender, [receiver])
        with pytest.raises(TimeoutError, match=r"sync.timeout_s \(1 s\)"):
            sender.send(1, lambda notice: None)  # the notice is lost: no worker applies
    finally:
        sender.close()
        receiver.close()


def test_an_ipc_receiver_needs_a_backend_built_with_the_ipc_engine(model_dir):
    with pytest.raises(ValueError, match="built with that weight-transfer engine"):
        make_receiver(ipc_cfg(), engine="ipc", backend=SimpleNamespace(transfer_engine="rollway_memory"))


def _rank_beside(model_dir: str, port: int, versions: list[int]) -> None:
    """Rank 1 of a two-rank ddp pool, on a GPU of its own: its sender runs beside rank 0's."""
    import builtins
    import datetime

    import torch.distributed as dist

    stand_in_cuda(builtins.setattr, uuid="GPU-rank-1")
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=False, timeout=datetime.timedelta(seconds=JOIN_S))
    dist.init_process_group("gloo", store=store, rank=1, world_size=2)
    model = trainer_model(model_dir)
    sender = make_sender(ipc_cfg(timeout_s=30), engine="ipc", rank=1)
    sender.attach(model)
    sender.connect()
    for version in versions:
        train_a_little(model, seed=40 + version)  # as rank 0 does: a ddp pool's replicas agree
        sender.send(version, lambda notice: None)
    dist.destroy_process_group()


def test_every_rank_of_a_pool_runs_the_engine_and_the_worker_maps_its_own_gpus(fake_cuda, model_dir):
    """vLLM all-gathers the handles over the pool's group, so rank 1 must send beside
    rank 0 (`every_rank_sends`, TrainerRank.send_beside); the worker maps the handles of
    its own GPU, and the policy arrives exact."""
    import datetime
    import multiprocessing

    import torch.distributed as dist

    from workers.core.rendezvous import open_store

    store, port = open_store("127.0.0.1", 2, JOIN_S, "test pool")
    rank_1 = multiprocessing.get_context("spawn").Process(target=_rank_beside, args=(model_dir, port, [1, 2]))
    rank_1.start()
    dist.init_process_group("gloo", store=store, rank=0, world_size=2, timeout=datetime.timedelta(seconds=JOIN_S))
    model = trainer_model(model_dir)
    sender = make_sender(ipc_cfg(timeout_s=30), engine="ipc")
    assert sender.every_rank_sends
    backend = IpcBackend(model_dir)
    receiver = make_receiver(ipc_cfg(), engine="ipc", backend=backend)
    sender.attach(model)
    seen: list = []
    try:
        connect(sender, [receiver])
        for version in (1, 2):
            train_a_little(model, seed=40 + version)

            def notify(notice, put=seen.append):
                put(notice)
                threading.Thread(target=receiver.apply, args=(backend, receiver.receive(notice))).start()

            sender.send(version, notify)
            assert state_checksum(backend.target.model.state_dict()) == state_checksum(model.state_dict())
        handles = seen[-1].payload["update_info"]["ipc_handles"]
        assert all(set(h) == {UUID, "GPU-rank-1"} for h in handles)  # one per rank's GPU, merged by rank 0
        rank_1.join(JOIN_S)
        assert rank_1.exitcode == 0
    finally:
        sender.close()
        receiver.close()
        dist.destroy_process_group()
        if rank_1.is_alive():
            rank_1.kill()
