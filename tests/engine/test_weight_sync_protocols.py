"""Weight-sync protocols (workers.sync): after a sync the worker's weights are bit-identical
to the trainer's (sha256 over name-sorted tensors), LoRA moves only adapter bytes, and
per-tensor and packed broadcasts agree.

Trainer and worker run as two threads of this process (each with its own gloo group on
127.0.0.1 for the collective); the slow tests put them in Ray actors and on real vLLM.
The worker's weights are read back out of TorchBackend's fused layout, so the checksum
is of what the backend will actually compute with, not of a staging copy.
"""

from __future__ import annotations

import copy
import os
import queue
import threading

import pytest
import torch
from safetensors.torch import load_file

from workers.config.run_config import LoRAConfig, ModelConfig, SyncConfig
from workers.core.sync_messages import Notice
from workers.model.lora import effective_state_dict
from workers.sync import SyncReport, make_receiver, make_sender, state_checksum
from workers.sync.object_store import InProcessStore
from workers.sync.verify import torch_backend_state_dict

# Small enough that a sync takes milliseconds; 2 layers → 21 tensors.
MODEL = ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
JOIN_S = 60


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    from workers.model.loading import build_tiny, save_model
    from workers.model.tokenizer import CharTokenizer

    path = str(tmp_path_factory.mktemp("sync-model"))
    tokenizer = CharTokenizer()
    save_model(build_tiny(MODEL, tokenizer, seed=0), tokenizer, path)
    return path


def trainer_model(model_dir: str):
    from workers.model.loading import load_model

    return load_model(model_dir).train()


def train_a_little(model: torch.nn.Module, seed: int) -> None:
    """One real AdamW step (so flat-buffer views must survive an optimizer), then noise
    on every parameter so each version differs everywhere."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-2)
    ids = torch.arange(1, 9).unsqueeze(0)
    model(input_ids=ids).logits.float().pow(2).mean().backward()
    opt.step()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in trainable:
            p.add_(torch.randn(p.shape, generator=g) * 1e-3)


def backend_weights(backend) -> dict[str, torch.Tensor]:
    return torch_backend_state_dict(backend)


def connect(sender, receivers) -> dict:
    """Connect both sides at once, as a collective's rendezvous needs."""
    endpoint = sender.endpoint()
    threads = [threading.Thread(target=r.connect, args=(endpoint, i + 1)) for i, r in enumerate(receivers)]
    for t in threads:
        t.start()
    sender.connect()
    for t in threads:
        t.join(JOIN_S)
    return endpoint


def sync(sender, receiver, backend, version: int) -> tuple[SyncReport, SyncReport]:
    """One sync with the worker in another thread; (trainer's report, worker's report)."""
    notices: queue.Queue = queue.Queue()
    got: dict = {}

    def worker():
        try:
            got["report"] = receiver.apply(backend, receiver.receive(notices.get(timeout=JOIN_S)))
        except BaseException as exc:  # surfaced in the test thread below
            got["error"] = exc

    thread = threading.Thread(target=worker)
    thread.start()
    sent = sender.send(version, notices.put)
    thread.join(JOIN_S)
    if "error" in got:
        raise got["error"]
    return sent, got["report"]


def sync_cfg(protocol: str, **fields) -> SyncConfig:
    return SyncConfig(protocol=protocol, **fields)


SENDERS = {
    "object_store": lambda store, tmp: make_sender(sync_cfg("object_store"), store=store),
    "filesystem": lambda store, tmp: make_sender(sync_cfg("filesystem", directory=str(tmp))),
    "collective/per_tensor": lambda store, tmp: make_sender(sync_cfg("collective", packed=False, timeout_s=30)),
    "collective/packed": lambda store, tmp: make_sender(sync_cfg("collective", bucket_mb=0.01, timeout_s=30)),
    "collective/packed-copy": lambda store, tmp: make_sender(
        sync_cfg("collective", bucket_mb=0.01, flat_params=False, timeout_s=30)
    ),
}


@pytest.mark.parametrize("name", list(SENDERS))
def test_each_full_protocol_leaves_the_worker_bit_identical(name, model_dir, tmp_path):
    from workers.inference.torch_backend import TorchBackend

    store = InProcessStore()
    model = trainer_model(model_dir)
    sender = SENDERS[name](store, tmp_path / "ckpt")
    receiver = make_receiver(sync_cfg(name.split("/")[0]), model_dir=model_dir, store=store)
    backend = TorchBackend(model_dir)
    full_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    try:
        sender.attach(model)
        connect(sender, [receiver])
        assert state_checksum(backend_weights(backend)) == state_checksum(model.state_dict())
        for version in (1, 2):
            train_a_little(model, seed=version)
            expected = state_checksum(model.state_dict())
            assert state_checksum(backend_weights(backend)) != expected
            sent, received = sync(sender, receiver, backend, version)
            assert state_checksum(backend_weights(backend)) == expected
            assert received.version == sent.version == version
            # Filesystem bytes are the file: tensors plus the safetensors header.
            assert full_bytes <= sent.bytes == received.bytes < full_bytes + 8192
            assert sent.trainer_ms > 0 and received.inference_ms > 0
            assert received.end_to_end_ms + 1.0 >= received.inference_ms
            assert sent.tensors == len(model.state_dict())
    finally:
        sender.close()
        receiver.close()


def test_per_tensor_and_packed_broadcasts_give_identical_weights(model_dir):
    """Same trainer weights through per-tensor, packed (buckets that split tensors),
    one-bucket and copy-packed broadcasts: one checksum, different message counts."""
    model = trainer_model(model_dir)
    train_a_little(model, seed=7)
    expected = state_checksum(model.state_dict())
    n_tensors = len(list(model.parameters()))
    full_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    messages = {}
    for label, kwargs in {
        "per_tensor": {"packed": False},
        "packed-small": {"bucket_mb": 0.003},  # ~770 floats: splits tensors
        "packed-one": {"bucket_mb": full_mb * 2},
        "packed-copy": {"bucket_mb": 0.003, "flat_params": False},
    }.items():
        sender = make_sender(sync_cfg("collective", timeout_s=30, **kwargs))
        receiver = make_receiver(sync_cfg("collective"))
        sender.attach(model)
        connect(sender, [receiver])
        sent, received = sync(sender, receiver, _Recorder(), version=1)
        assert state_checksum(receiver.views) == expected, label
        messages[label] = sent.messages
        sender.close()
        receiver.close()
    assert messages["per_tensor"] == n_tensors
    assert messages["packed-one"] == 1
    assert messages["packed-small"] == messages["packed-copy"] > n_tensors / 4
    # The weights the trainer trains are still its weights after being flattened.
    assert state_checksum(model.state_dict()) == expected


def test_flattening_for_packed_sync_changes_nothing_about_training(model_dir):
    """The trainer's optimizer is built before the sender re-lays its parameters into
    one flat buffer; its steps must give bit-identical weights to an unflattened twin,
    and the parameters must still be views of the buffer afterwards."""
    from workers.sync.collective import is_flat

    flat_model, twin = trainer_model(model_dir), trainer_model(model_dir)
    flat_opt = torch.optim.AdamW(flat_model.parameters(), lr=1e-2)
    twin_opt = torch.optim.AdamW(twin.parameters(), lr=1e-2)
    sender = make_sender(sync_cfg("collective"))
    sender.attach(flat_model)
    ids = torch.arange(1, 9).unsqueeze(0)
    for _ in range(2):
        for model, opt in ((flat_model, flat_opt), (twin, twin_opt)):
            opt.zero_grad()
            model(input_ids=ids).logits.pow(2).mean().backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
    assert state_checksum(flat_model.state_dict()) == state_checksum(twin.state_dict())
    assert is_flat(flat_model, sender.layout, sender.flats)


class _Recorder:
    """A backend that keeps a copy of what it is given."""

    def __init__(self):
        self.loaded = None
        self.adapters: list[tuple[str, int, str, str]] = []

    def load_weights(self, state_dict):
        self.loaded = {k: v.clone() for k, v in state_dict.items()}


class _AdapterBackend(_Recorder):
    """A backend with adapter support, like vLLM with enable_lora: records (name, id,
    path, checksum of the adapter file) per registration."""

    def load_lora_adapter(self, name: str, lora_int_id: int, path: str) -> None:
        from safetensors.torch import load_file

        tensors = load_file(os.path.join(path, "adapter_model.safetensors"))
        self.adapters.append((name, lora_int_id, path, state_checksum(tensors)))


def test_collective_worker_joins_broadcasts_in_send_order_even_if_notices_arrive_reversed(model_dir):
    """A threaded actor may run the handler of notice 2 before that of notice 1; the
    receiver must still take broadcast 1 first, or versions and bytes get crossed."""
    model = trainer_model(model_dir)
    sender, receiver = make_sender(sync_cfg("collective", timeout_s=30)), make_receiver(sync_cfg("collective"))
    sender.attach(model)
    endpoint = connect(sender, [receiver])
    digest = {"layout": endpoint["layout"].digest()}
    staged: dict[int, object] = {}
    later = threading.Thread(
        target=lambda: staged.setdefault(2, receiver.receive(Notice("collective", 2, 1, 0, 0.0, digest)))
    )
    later.start()  # notice 2 first: it must wait for seq 0
    sums = []

    def trainer():
        for version in (1, 2):
            train_a_little(model, seed=version)
            sums.append(state_checksum(model.state_dict()))
            sender.send(version, lambda n: None)

    sending = threading.Thread(target=trainer)
    sending.start()
    threading.Event().wait(0.2)
    assert 2 not in staged
    staged[1] = receiver.receive(Notice("collective", 1, 0, 0, 0.0, digest))
    sending.join(JOIN_S)
    later.join(JOIN_S)
    assert staged[1].notice.version == 1 and staged[2].notice.version == 2
    assert state_checksum(receiver.views) == sums[1]
    receiver.close()
    sender.close()


def test_collective_apply_loads_the_newest_staged_version_once(model_dir):
    model = trainer_model(model_dir)
    sender, receiver = make_sender(sync_cfg("collective", timeout_s=30)), make_receiver(sync_cfg("collective"))
    sender.attach(model)
    connect(sender, [receiver])
    notices: queue.Queue = queue.Queue()
    staged = []

    def worker():
        for _ in range(2):
            staged.append(receiver.receive(notices.get(timeout=JOIN_S)))

    thread = threading.Thread(target=worker)
    thread.start()
    for version in (1, 2):
        train_a_little(model, seed=version)
        sender.send(version, notices.put)
    thread.join(JOIN_S)
    backend = _Recorder()
    # The worker popped v1 before v2 landed in staging: apply loads v2 and says so.
    report = receiver.apply(backend, staged[0])
    assert report.version == 2
    assert state_checksum(backend.loaded) == state_checksum(model.state_dict())
    assert receiver.apply(backend, staged[1]) is None  # already loaded
    receiver.close()
    sender.close()


# ---- LoRA ------------------------------------------------------------------------


def lora_model(model_dir: str):
    from workers.model.lora import apply_lora

    torch.manual_seed(0)
    return apply_lora(trainer_model(model_dir), LoRAConfig(enabled=True, rank=4, alpha=8.0))


def test_lora_moves_only_adapter_bytes_and_merges_bit_identically(model_dir):
    from workers.inference.torch_backend import TorchBackend
    from workers.model.lora import adapter_state_dict

    store = InProcessStore()
    model = lora_model(model_dir)
    sender, receiver = (
        make_sender(sync_cfg("lora"), store=store),
        make_receiver(sync_cfg("lora"), model_dir=model_dir, store=store),
    )
    backend = TorchBackend(model_dir)
    sender.attach(model)
    connect(sender, [receiver])
    adapter = adapter_state_dict(model)
    adapter_bytes = sum(t.numel() * t.element_size() for t in adapter.values())
    full_bytes = sum(t.numel() * t.element_size() for t in effective_state_dict(model).values())
    base_sum = state_checksum(backend_weights(backend))
    for version in (1, 2):
        train_a_little(model, seed=version)  # moves the adapter only: the base is frozen
        sent, received = sync(sender, receiver, backend, version)
        assert sent.bytes == received.bytes == adapter_bytes
        assert adapter_bytes * 5 < full_bytes
        assert sent.tensors == len(adapter) == 2 * 7 * MODEL.num_layers
        # The worker computes with exactly the trainer's merged policy (peft's own merge).
        merged = copy.deepcopy(model).merge_and_unload().state_dict()
        assert state_checksum(backend_weights(backend)) == state_checksum(merged) != base_sum
    receiver.close()


def test_lora_registers_a_versioned_adapter_on_adapter_backends(model_dir):
    from workers.model.lora import adapter_state_dict

    store = InProcessStore()
    model = lora_model(model_dir)
    sender, receiver = (
        make_sender(sync_cfg("lora"), store=store),
        make_receiver(sync_cfg("lora"), model_dir=model_dir, store=store),
    )
    sender.attach(model)
    connect(sender, [receiver])
    backend = _AdapterBackend()
    sums = []
    for version in (1, 2, 3):
        train_a_little(model, seed=version)
        sums.append(state_checksum(adapter_state_dict(model)))
        sync(sender, receiver, backend, version)
    assert [(n, i) for n, i, _, _ in backend.adapters] == [("policy-v1", 2), ("policy-v2", 3), ("policy-v3", 4)]
    assert [s for _, _, _, s in backend.adapters] == sums
    assert backend.loaded is None  # the base was never reloaded
    assert not os.path.exists(backend.adapters[0][2])  # oldest adapter dir pruned
    assert os.path.exists(backend.adapters[2][2])
    receiver.close()


def test_lora_refuses_workers_with_a_different_base(model_dir, tmp_path):
    from workers.model.loading import build_tiny, save_model
    from workers.model.tokenizer import CharTokenizer

    other = str(tmp_path / "other")
    save_model(build_tiny(MODEL, CharTokenizer(), seed=1), CharTokenizer(), other)
    sender = make_sender(sync_cfg("lora"), store=InProcessStore())
    sender.attach(lora_model(model_dir))
    receiver = make_receiver(sync_cfg("lora"), model_dir=other)
    with pytest.raises(ValueError, match="same model directory"):
        receiver.connect(sender.endpoint())


def test_lora_sender_needs_a_peft_model(model_dir):
    with pytest.raises(TypeError, match="peft LoRA adapter"):
        make_sender(sync_cfg("lora"), store=InProcessStore()).attach(trainer_model(model_dir))


# ---- interface -------------------------------------------------------------------


def test_unknown_protocol_names_the_choices():
    with pytest.raises(ValueError, match="object_store"):
        sync_cfg("carrier_pigeon")


def test_full_reload_is_the_object_store():
    assert sync_cfg("full_reload").protocol == "object_store"
    assert make_sender(sync_cfg("full_reload"), store=InProcessStore()).protocol == "object_store"


def test_receiver_refuses_an_endpoint_of_another_protocol():
    with pytest.raises(ValueError, match="same sync.protocol"):
        make_receiver(sync_cfg("filesystem")).connect({"protocol": "object_store"})


@pytest.mark.parametrize(
    "device, placement, protocol, tp, changed_only, engine",
    [
        # CPU: the project's engines (vLLM's need CUDA); a collective is vLLM's NCCL pair over gloo.
        ("cpu", "disaggregated", "object_store", 1, False, "rollway_memory"),
        ("cpu", "disaggregated", "collective", 1, False, "rollway_gloo"),
        ("cpu", "disaggregated", "collective", 2, False, "rollway_gloo"),
        ("cpu", "disaggregated", "filesystem", 1, False, "rollway_memory"),
        ("cpu", "disaggregated", "lora", 1, False, "rollway_memory"),
        ("cpu", "disaggregated", "object_store", 2, False, "rollway_files"),
        # GPU: vLLM's own where the trainer sends into vLLM ...
        ("gpu", "disaggregated", "collective", 1, False, "nccl"),
        ("gpu", "disaggregated", "collective", 2, False, "nccl"),
        ("gpu", "disaggregated", "collective", 1, True, "sparse_nccl"),
        ("gpu", "colocated", "cuda_ipc", 1, False, "ipc"),
        ("gpu", "disaggregated", "cuda_ipc", 1, False, "ipc"),
        # ... and the CPU's where a state dict reaches the worker: one path on both.
        ("gpu", "disaggregated", "object_store", 1, False, "rollway_memory"),
        ("gpu", "disaggregated", "object_store", 2, False, "rollway_files"),
        ("gpu", "colocated", "object_store", 1, False, "rollway_memory"),
        ("gpu", "disaggregated", "filesystem", 1, False, "rollway_memory"),
        ("gpu", "disaggregated", "lora", 1, False, "rollway_memory"),
        ("gpu", "colocated", "collective", 1, False, "rollway_memory"),
    ],
)
def test_the_vllm_transfer_engine_follows_device_placement_and_protocol(
    device, placement, protocol, tp, changed_only, engine
):
    from workers.sync import vllm_transfer_engine

    assert (
        vllm_transfer_engine(device, placement, protocol, tensor_parallel_size=tp, changed_only=changed_only) == engine
    )


def test_a_run_on_vllm_cpu_gets_the_in_memory_engine_by_default():
    from workers.config.run_config import RunConfig
    from workers.sync import vllm_transfer_engine

    cfg = RunConfig.model_validate({"inference": {"backend": "vllm"}})
    got = vllm_transfer_engine(cfg.placement.devices, cfg.placement.mode, cfg.sync.protocol)
    assert got == "rollway_memory"


@pytest.mark.parametrize(
    "fields, engine",
    [
        ({"inference": {"backend": "vllm"}, "sync": {"protocol": "collective"}}, "rollway_gloo"),
        ({"inference": {"backend": "vllm"}, "sync": {"protocol": "object_store"}}, None),
        ({"inference": {"backend": "torch"}, "sync": {"protocol": "collective"}}, None),
        (
            {"inference": {"backend": "vllm"}, "sync": {"protocol": "collective"}, "placement": {"devices": "gpu"}},
            "nccl",
        ),
        (
            {
                "inference": {"backend": "vllm"},
                "sync": {"protocol": "collective"},
                "placement": {"devices": "gpu", "mode": "colocated"},
            },
            None,  # one GPU: not vLLM's broadcast pair; the worker loads what it receives
        ),
        (
            {
                "inference": {"backend": "vllm"},
                "sync": {"protocol": "cuda_ipc"},
                "placement": {"devices": "gpu", "mode": "colocated"},
            },
            "ipc",
        ),
        (
            {
                "inference": {"backend": "torch"},
                "sync": {"protocol": "cuda_ipc"},
                "placement": {"devices": "gpu", "mode": "colocated"},
            },
            None,
        ),
    ],
)
def test_the_engine_the_trainer_drives_into_vllm(fields, engine):
    from workers.config.run_config import RunConfig
    from workers.sync import driven_engine

    assert driven_engine(RunConfig.model_validate(fields)) == engine


def test_every_vllm_worker_is_built_with_the_engine_its_weights_arrive_through():
    """For every device, placement, protocol and tensor-parallel size the config admits
    into vLLM, the engine a worker is built with is the one the trainer drives, or, where
    the protocol hands the worker a state dict, the project's own, which the backend's
    `load_weights` goes through: no worker holds an engine nothing uses, and no weights
    reach vLLM outside its weight-transfer calls."""
    from pydantic import ValidationError

    from workers.config.run_config import RunConfig
    from workers.sync import driven_engine, vllm_transfer_engine

    seen = 0
    for devices in ("cpu", "gpu"):
        for mode in ("disaggregated", "colocated"):
            for protocol in ("object_store", "filesystem", "collective", "cuda_ipc", "lora"):
                for tp in (1, 2):
                    fields = {
                        "inference": {"backend": "vllm", "tensor_parallel_size": tp},
                        "sync": {"protocol": protocol},
                        "placement": {"devices": devices, "mode": mode},
                        **({"lora": {"rank": 4}} if protocol == "lora" else {}),
                    }
                    try:
                        cfg = RunConfig.model_validate(fields)
                    except ValidationError:
                        continue  # refused where the config is checked
                    built = vllm_transfer_engine(devices, mode, protocol, tensor_parallel_size=tp)
                    driven = driven_engine(cfg)
                    own = "rollway_memory" if tp == 1 else "rollway_files"
                    assert built == (driven or own), (fields, built, driven)
                    seen += 1
    assert seen >= 16, seen  # colocated on a CPU and cuda_ipc between GPUs are refused


def test_cuda_ipc_on_the_cpu_is_refused_naming_the_field():
    from workers.sync import vllm_transfer_engine

    with pytest.raises(ValueError, match="placement.devices 'gpu'"):
        vllm_transfer_engine("cpu", "disaggregated", "cuda_ipc")


def test_combined_report_takes_the_slowest_worker():
    sent = SyncReport("collective", 3, 100, trainer_ms=5.0, tensors=4, messages=1)
    a = SyncReport("collective", 3, 100, inference_ms=7.0, end_to_end_ms=9.0)
    b = SyncReport("collective", 3, 100, inference_ms=6.0, end_to_end_ms=12.0)
    both = SyncReport.combine(sent, [a, b])
    assert (both.trainer_ms, both.inference_ms, both.end_to_end_ms) == (5.0, 7.0, 12.0)
    assert both.metrics()["sync/latency_ms"] == 12.0
    with pytest.raises(ValueError, match="versions"):
        SyncReport.combine(sent, [SyncReport("collective", 2, 100)])


def test_checksum_sees_one_flipped_bit():
    t = torch.zeros(4)
    flipped = t.clone()
    flipped.view(torch.int32)[2] ^= 1
    assert state_checksum({"w": t}) != state_checksum({"w": flipped})
    assert state_checksum({"w": t}) != state_checksum({"v": t})


# ---- through Ray actors ------------------------------------------------------------


def _ray_actors():
    """Trainer and worker actors wired the way workers/run/actors.py is meant to use
    workers.sync. Ray ships this module by value: workers cannot import a test file."""
    import sys

    import ray
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])

    @ray.remote(num_cpus=0, max_concurrency=2)
    class Trainer:
        def __init__(self, model_dir):
            import torch

            torch.set_num_threads(1)
            self.model_dir = model_dir

        def setup(self, protocol, options, lora):
            """A fresh policy (LoRA-wrapped if asked) and a sender; returns the endpoint."""
            import torch

            from workers.model.loading import load_model
            from workers.model.lora import apply_lora

            model = load_model(self.model_dir).train()
            if lora:
                torch.manual_seed(0)
                model = apply_lora(model, LoRAConfig(enabled=True, rank=4, alpha=8.0), init_lora_weights=False)
            self.model = model
            self.sender = make_sender(SyncConfig(protocol=protocol, **options), num_receivers=2)
            self.sender.attach(model)
            return self.sender.endpoint()

        def connect(self):
            self.sender.connect()

        def step_and_sync(self, version, workers):
            train_a_little(self.model, seed=version)
            return self.sender.send(version, lambda n: [w.update_weights.remote(n) for w in workers])

        def checksum(self):
            return state_checksum(effective_state_dict(self.model))

        def close(self):
            self.sender.close()

    @ray.remote(num_cpus=0, max_concurrency=4)
    class Worker:
        def __init__(self, model_dir):
            import torch

            from workers.inference.torch_backend import TorchBackend

            torch.set_num_threads(1)
            self.model_dir = model_dir
            self.backend = TorchBackend(model_dir)

        def setup(self, protocol, endpoint, rank):
            """A receiver for `protocol`, connected (blocks until all ranks connect)."""
            self.backend.load_weights(load_file(os.path.join(self.model_dir, "model.safetensors")))
            self.receiver = make_receiver(SyncConfig(protocol=protocol), model_dir=self.model_dir)
            self.reports = {}
            self.receiver.connect(endpoint, rank)

        def update_weights(self, notice):
            report = self.receiver.apply(self.backend, self.receiver.receive(notice))
            if report is not None:
                self.reports[report.version] = report

        def report(self, version):
            return self.reports.get(version)

        def checksum(self):
            from workers.sync.verify import backend_checksum

            return backend_checksum(self.backend)

        def close(self):
            self.receiver.close()

    return Trainer, Worker


@pytest.mark.slow
def test_every_protocol_through_ray_actors_leaves_workers_bit_identical(cluster, model_dir, tmp_path):
    """One trainer, two workers, two versions per protocol, each worker checked."""
    import time

    import ray

    Trainer, Worker = _ray_actors()
    trainer = Trainer.remote(model_dir)
    workers = [Worker.remote(model_dir) for _ in range(2)]
    try:
        cases = [
            ("object_store", {}, False),
            ("filesystem", {"directory": str(tmp_path / "ckpt")}, False),
            ("collective", {"packed": False, "timeout_s": 60}, False),
            ("collective", {"bucket_mb": 0.01, "timeout_s": 60}, False),
            ("lora", {}, True),
        ]
        for protocol, options, lora in cases:
            endpoint = ray.get(trainer.setup.remote(protocol, options, lora))
            ray.get(
                [trainer.connect.remote()] + [w.setup.remote(protocol, endpoint, i + 1) for i, w in enumerate(workers)]
            )
            for version in (1, 2):
                sent = ray.get(trainer.step_and_sync.remote(version, workers))
                deadline = time.monotonic() + 60
                got = [None] * len(workers)
                while None in got and time.monotonic() < deadline:
                    got = ray.get([w.report.remote(version) for w in workers])
                assert None not in got, f"{protocol}: a worker never applied version {version}"
                assert all(r.bytes == sent.bytes for r in got)
            expected = ray.get(trainer.checksum.remote())
            assert ray.get([w.checksum.remote() for w in workers]) == [expected] * len(workers), protocol
            ray.get([trainer.close.remote()] + [w.close.remote() for w in workers])
    finally:
        for actor in [trainer, *workers]:
            ray.kill(actor)


# ---- vLLM LoRA adapters ----------------------------------------------------------------


def _vllm_lora_weights(worker, lora_int_id):
    # Runs inside vLLM's worker: the adapter as vLLM holds it (lora_b has the scaling folded in).
    manager = worker.model_runner.lora_manager._adapter_manager
    lora_model = manager._registered_adapters[lora_int_id]

    def as_list(x):
        return [t.clone() for t in x] if isinstance(x, list) else [x.clone()]

    return {name: (as_list(w.lora_a), as_list(w.lora_b)) for name, w in lora_model.loras.items()}


# vLLM stacks these projections into one layer: (packed name, index in the stack).
_VLLM_PACKED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


def _vllm_logprobs(backend, prompt: list[int], max_tokens: int = 6) -> tuple[list[int], list[float]]:
    """One seeded completion of `prompt` under the backend's current adapter."""
    (completion,) = backend.generate([prompt], n=1, max_new_tokens=max_tokens, temperature=1.0, seed=3)[0]
    return completion.token_ids, completion.logprobs


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_serves_each_version_as_a_named_adapter_holding_the_trainers_tensors(tmp_path):
    pytest.importorskip("vllm")
    from workers.config.run_config import InferenceConfig
    from workers.inference.vllm_backend import VLLMBackend
    from workers.model.loading import build_tiny, save_model
    from workers.model.lora import adapter_state_dict, apply_lora
    from workers.model.tokenizer import CharTokenizer

    model_dir = str(tmp_path / "model")  # head_dim 32: a size vLLM-CPU attention has
    save_model(build_tiny(ModelConfig(num_heads=2), CharTokenizer(), seed=0), CharTokenizer(), model_dir)
    torch.manual_seed(0)
    model = apply_lora(trainer_model(model_dir), LoRAConfig(enabled=True, rank=8, alpha=16.0), init_lora_weights=False)
    store = InProcessStore()
    sender, receiver = (
        make_sender(sync_cfg("lora"), store=store),
        make_receiver(sync_cfg("lora"), model_dir=model_dir, store=store),
    )
    sender.attach(model)
    endpoint = connect(sender, [receiver])
    backend = VLLMBackend(model_dir, InferenceConfig(backend="vllm"), max_num_seqs=8, lora_rank=8)
    prompt = [1, 5, 6, 7, 8]
    load_ms = []
    try:
        base_tokens, base_logprobs = _vllm_logprobs(backend, prompt)
        for version in (1, 2):
            train_a_little(model, seed=version)
            sent, received = sync(sender, receiver, backend, version)
            load_ms.append(received.inference_ms)
            assert backend._lora_request.lora_name == f"policy-v{version}"  # what generate serves
            assert sent.bytes == sum(t.numel() * 4 for t in adapter_state_dict(model).values())
        assert backend._llm.llm_engine.list_loras() == {3}  # only the newest stays registered
        # Bit-identical: vLLM holds A as sent and B · scaling (folded in, one multiply).
        held = backend._llm.collective_rpc(_vllm_lora_weights, args=(3,))[0]
        adapter = adapter_state_dict(model)
        checked = 0
        for key, t in adapter.items():
            module = key.removeprefix("base_model.model.").rsplit(".lora_", 1)[0]
            parent, leaf = module.rsplit(".", 1)
            packed, index = _VLLM_PACKED.get(leaf, (leaf, 0))
            a, b = held[f"{parent}.{packed}"]
            if ".lora_A." in key:
                assert torch.equal(a[index], t), key
            else:
                assert torch.equal(b[index], t * endpoint["scaling"]), key
            checked += 1
        assert checked == len(adapter) == 2 * 7 * 2
        # And it computes the trainer's merged policy (up to float rounding in vLLM's kernels).
        tokens, logprobs = _vllm_logprobs(backend, prompt)
        merged = copy.deepcopy(model).merge_and_unload().eval()
        with torch.no_grad():
            ref = torch.log_softmax(merged(input_ids=torch.tensor([prompt + tokens])).logits[0], -1)
        expected = [ref[len(prompt) - 1 + k, t].item() for k, t in enumerate(tokens)]
        assert max(abs(x - y) for x, y in zip(logprobs, expected, strict=False)) < 1e-3
        assert (tokens, logprobs) != (base_tokens, base_logprobs)
        print(
            f"vLLM adapter receive + register ms per version: {[round(x, 1) for x in load_ms]}; "
            f"adapter {sent.bytes / 2**10:.0f} KiB"
        )
    finally:
        backend.close()
        receiver.close()
