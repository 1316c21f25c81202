"""The engine on a CUDA GPU: the trainer on the device it was given, checkpoints that move
between GPU and CPU, a trainer pool over NCCL, and the cuda_ipc weight hand-off between two processes (the
project's flat buffer, and vLLM's IPC engine pair where vLLM is installed).

Skipped where torch sees no GPU (CI here); run on a GPU host with
`python -m pytest tests/gpu`."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.gpu.conftest import small_config
from workers.sync.base import state_checksum
from workers.train.trainer import Trainer

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CUDA = torch.device("cuda:0")


@needs_gpu
def test_the_trainer_trains_on_the_gpu_and_hands_out_cpu_weights(tiny_model_dir, groups):
    cfg = small_config(trainer={"dtype": "bfloat16", "micro_batch_rows": 4})
    trainer = Trainer(cfg, tiny_model_dir, device=CUDA)
    assert {p.device.type for p in trainer.model.parameters()} == {"cuda"}
    before = trainer.state_dict()
    metrics = trainer.train_step(copy.deepcopy(groups))
    after = trainer.state_dict()
    assert torch.isfinite(torch.tensor(metrics["loss"]))
    assert {t.device.type for t in after.values()} == {"cpu"}
    assert state_checksum(after) != state_checksum(before)


@needs_gpu
def test_a_checkpoint_written_on_the_gpu_resumes_on_the_cpu_and_back(tiny_model_dir, groups, tmp_path):
    from workers.run.checkpoints import Checkpoint, CheckpointTarget, restore_trainer, trainer_parts, write_checkpoint

    cfg = small_config()
    on_gpu = Trainer(cfg, tiny_model_dir, device=CUDA)
    on_gpu.train_step(copy.deepcopy(groups))
    record = write_checkpoint(CheckpointTarget(str(tmp_path), 1), 1, trainer_parts(on_gpu, 0.0))

    on_cpu = Trainer(cfg, tiny_model_dir, device=torch.device("cpu"))
    restore_trainer(on_cpu, Checkpoint(record.location))
    assert state_checksum(on_cpu.state_dict()) == state_checksum(on_gpu.state_dict())
    # The next step from the restored optimizer state agrees across devices (float32).
    a = on_gpu.train_step(copy.deepcopy(groups))
    b = on_cpu.train_step(copy.deepcopy(groups))
    assert b["loss"] == pytest.approx(a["loss"], rel=1e-3, abs=1e-4)
    back = Trainer(cfg, tiny_model_dir, device=CUDA)
    restore_trainer(back, Checkpoint(record.location))
    assert {s["exp_avg"].device.type for s in back.optimizer.state.values()} == {"cuda"}


def _receive(model_dir, notices, replies) -> None:
    from workers.inference.transformers_backend import TransformersBackend
    from workers.sync.cuda_ipc import CudaIpcReceiver

    backend = TransformersBackend(model_dir, device="cuda")
    receiver = CudaIpcReceiver()
    receiver.connect(notices.get(), 1)
    notice = notices.get()
    report = receiver.apply(backend, receiver.receive(notice))
    replies.put((report.version, report.bytes, state_checksum(backend.model.state_dict())))


@needs_gpu
def test_cuda_ipc_hands_the_trainers_weights_to_another_process_bit_for_bit(tiny_model_dir, groups):
    import torch.multiprocessing as mp

    from workers.sync.cuda_ipc import CudaIpcSender

    cfg = small_config()
    trainer = Trainer(cfg, tiny_model_dir, device=CUDA)
    trainer.train_step(copy.deepcopy(groups))
    ctx = mp.get_context("spawn")
    notices, replies = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_receive, args=(tiny_model_dir, notices, replies))
    proc.start()
    sender = CudaIpcSender()
    sender.attach(trainer.model)
    notices.put(sender.endpoint())
    sent = sender.send(1, notices.put)
    version, nbytes, checksum = replies.get(timeout=120)
    proc.join(30)
    assert (version, nbytes) == (1, sent.bytes)
    assert checksum == state_checksum(trainer.model.state_dict())


def _vllm_ipc_target(model):
    """bench/gpu_scale.py's stand-in for vLLM's model runner behind vLLM's own worker-side
    IPC engine (bench/ is not a package: loaded from its file)."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "gpu_scale.py"
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location("gpu_scale", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.VllmIpcTarget(model, CUDA)


def _receive_through_vllm(model_dir, notices, replies) -> None:
    from workers.inference.transformers_backend import TransformersBackend
    from workers.sync.engine_ipc import EngineIpcReceiver

    backend = TransformersBackend(model_dir, device="cuda")
    target = _vllm_ipc_target(backend.model)
    receiver = EngineIpcReceiver(target)
    receiver.connect(notices.get(), 1)
    while (notice := notices.get()) is not None:
        report = receiver.apply(target, receiver.receive(notice))
        replies.put((report.version, target.labels[-1], state_checksum(backend.model.state_dict())))


@needs_gpu
def test_vllms_ipc_engine_pair_hands_the_policy_to_another_process_bit_for_bit(tiny_model_dir, groups):
    """`cuda_ipc` into vLLM (workers/sync/engine_ipc.py): vLLM's trainer engine exports a
    handle per tensor, its worker engine in another process maps and loads them; the
    send returns once the worker has loaded. Needs vLLM's weight-transfer modules."""
    pytest.importorskip("vllm.distributed.weight_transfer.ipc_engine")
    import torch.multiprocessing as mp

    from workers.config.run_config import SyncConfig
    from workers.sync.engine_ipc import EngineIpcSender

    trainer = Trainer(small_config(), tiny_model_dir, device=CUDA)
    ctx = mp.get_context("spawn")
    notices, replies = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_receive_through_vllm, args=(tiny_model_dir, notices, replies))
    proc.start()
    sender = EngineIpcSender(SyncConfig(protocol="cuda_ipc", timeout_s=120), num_receivers=1)
    sender.attach(trainer.model)
    notices.put(sender.endpoint())
    sender.connect()
    try:
        for version in (1, 2):
            trainer.train_step(copy.deepcopy(groups))
            sender.send(version, notices.put)  # returns once the worker has loaded
            assert replies.get(timeout=120) == (version, str(version), state_checksum(trainer.state_dict()))
    finally:
        notices.put(None)
        proc.join(30)
        sender.close()


def test_cuda_ipc_refuses_a_trainer_on_the_cpu(tiny_model_dir):
    from workers.sync.cuda_ipc import CudaIpcSender

    trainer = Trainer(small_config(), tiny_model_dir, device=torch.device("cpu"))
    with pytest.raises(ValueError, match="give the trainer a GPU"):
        CudaIpcSender().attach(trainer.model)


def test_a_cuda_ipc_run_is_refused_unless_its_worker_shares_the_trainers_gpu():
    from pydantic import ValidationError

    from workers.config.run_config import RunConfig

    colocated = {"devices": "gpu", "mode": "colocated"}
    for placement, workers in (({}, 1), ({"devices": "gpu"}, 1), (colocated, 2)):
        with pytest.raises(ValidationError, match="must share the trainer's GPU"):
            RunConfig.model_validate(
                {"sync": {"protocol": "cuda_ipc"}, "placement": placement, "inference": {"num_workers": workers}}
            )
    assert RunConfig.model_validate({"sync": {"protocol": "cuda_ipc"}, "placement": colocated})


@needs_gpu
def test_a_trainer_taking_turns_holds_its_weights_alone_between_steps_and_trains_as_a_resident_one(
    tiny_model_dir, groups
):
    """inference.sleep_level: between steps (vLLM generating) the trainer's process holds
    its weights and nothing else on the GPU, and returns its cache to the driver."""
    torch.cuda.empty_cache()
    turns = Trainer(small_config(inference={"sleep_level": 1}), tiny_model_dir, device=CUDA)
    weights_only, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    for _ in range(2):  # the second step loads the moments the first offloaded
        turns.train_step(copy.deepcopy(groups))
    moments = [v for s in turns.optimizer.state.values() for k, v in s.items() if k != "step"]
    assert moments and all(v.device.type == "cpu" and v.is_pinned() for v in moments)
    moment_bytes = sum(v.numel() * v.element_size() for v in moments)
    assert torch.cuda.memory_allocated() - weights_only < moment_bytes / 2
    assert torch.cuda.memory_reserved() <= reserved + 4 * 2**20  # the step's cache went back to the driver
    assert turns.offload.load_s > 0 and turns.offload.offload_s > 0

    resident = Trainer(small_config(), tiny_model_dir, device=CUDA)
    assert resident.offload is None
    for _ in range(2):
        resident.train_step(copy.deepcopy(groups))
    assert all(v.device.type == "cuda" for s in resident.optimizer.state.values() for k, v in s.items() if k != "step")
    for name, weight in resident.state_dict().items():  # GPU kernels' own nondeterminism aside
        torch.testing.assert_close(turns.state_dict()[name], weight, rtol=1e-5, atol=1e-6)


def pool_round_trip(device: torch.device, backend: str, model_dir: str, groups, root: str) -> dict:
    """A trainer pool of one rank on `device` (NCCL on a GPU, gloo on the CPU): a step, a
    checkpoint, a second step; then a pool formed afresh resumes the checkpoint and takes
    the second step again, and the policy is exported. One rank because NCCL refuses two
    ranks of one communicator on one GPU; what it runs is every pool's path on a GPU: the
    process group, `fully_shard` (or DDP) over a CUDA mesh, the metered all-gathers and
    reduce-scatters, torch.distributed.checkpoint's shards, the streamed export."""
    from workers.run.checkpoints import Checkpoint, CheckpointTarget, restore_trainer, trainer_parts, write_checkpoint
    from workers.train.export import export_policy
    from workers.train.trainer_pool import Rendezvous

    cfg = small_config(trainer={"backend": backend, "num_ranks": 1, "minibatches": 2, "micro_batch_rows": 3})

    def pool_trainer() -> Trainer:
        pool = Rendezvous(1, 60.0, host="127.0.0.1").join(backend, device)
        return Trainer(cfg, model_dir, device=device, pool=pool)

    trainer = pool_trainer()
    first = trainer.train_step(copy.deepcopy(groups))
    at_checkpoint = state_checksum(trainer.state_dict())
    record = write_checkpoint(CheckpointTarget(root, 1), trainer.version, trainer_parts(trainer, 0.0))
    whole = trainer.train_step(copy.deepcopy(groups))
    whole_checksum = state_checksum(trainer.state_dict())

    resumed = pool_trainer()
    restore_trainer(resumed, Checkpoint(record.location))
    restored = state_checksum(resumed.state_dict())
    again = resumed.train_step(copy.deepcopy(groups))
    manifest = export_policy(resumed.model, resumed.model_dir, f"{root}/export", resumed.cfg)
    out = {
        "first": first,
        "whole": whole,
        "again": again,
        "checkpoint_files": {f["name"] for f in Checkpoint(record.location).meta["files"]},
        "at_checkpoint": at_checkpoint,
        "restored": restored,
        "whole_checksum": whole_checksum,
        "resumed_checksum": state_checksum(resumed.state_dict()),
        "manifest": manifest,
        "export": f"{root}/export",
    }
    resumed.pool.close()
    return out


@needs_gpu
@pytest.mark.parametrize("backend", ["fsdp2", "ddp"])
def test_a_trainer_pool_trains_checkpoints_and_resumes_exactly_over_nccl(backend, tiny_model_dir, groups, tmp_path):
    from transformers import AutoModelForCausalLM

    from workers.model.loading import checkpoint_state_dict

    out = pool_round_trip(CUDA, backend, tiny_model_dir, groups, str(tmp_path))
    assert torch.isfinite(torch.tensor(out["first"]["loss"]))
    if backend == "ddp":  # the gradients' all-reduce went through NCCL (fsdp2 at one rank skips its gathers)
        assert out["first"]["trainer/rank_comm_bytes/0"] > 0
    else:  # the rank's shards through torch.distributed.checkpoint, no whole optimizer file
        assert "sharded/__0_0.distcp" in out["checkpoint_files"], out["checkpoint_files"]
        assert "optimizer.pt" not in out["checkpoint_files"]
    # Resumed on a pool formed afresh, the second step again, bit for bit.
    assert out["restored"] == out["at_checkpoint"]
    assert out["again"]["loss"] == out["whole"]["loss"]
    assert out["again"]["trainer/grad_norm"] == out["whole"]["trainer/grad_norm"]
    assert out["resumed_checksum"] == out["whole_checksum"]
    exported = AutoModelForCausalLM.from_pretrained(out["export"])
    assert state_checksum(checkpoint_state_dict(exported)) == out["whole_checksum"]
