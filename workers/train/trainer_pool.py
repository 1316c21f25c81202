"""The trainer pool: `trainer.num_ranks` processes that train one policy together.

Every rank holds the policy the way its `trainer.backend` says and runs its share of
each step (workers/train/step_plan.py); torch.distributed joins them in one process group
(gloo on the CPU, NCCL on GPUs), met through a TCPStore that rank 0 opens
(workers/core/rendezvous.py):

- **ddp**: each rank a whole replica inside PyTorch's `DistributedDataParallel`; the
  backward all-reduces the gradients (averaged over the ranks), so every replica takes
  the same optimizer step;
- **fsdp2**: PyTorch's `fully_shard` over a device mesh of the ranks, one FSDP unit per
  decoder layer (transformers' own `_no_split_modules` names them) plus the root; each
  rank keeps 1/N of the parameters, gradients and AdamW state, all-gathers a layer's
  parameters for its forward and backward and reduce-scatters its gradients.

Both average gradients over the ranks, so the trainer scales each rank's loss by the
world size to keep a minibatch's loss a token mean over all its tokens.

`CommMeter` counts each collective a rank issues (bytes and issue → done time): DDP's
through a comm hook, FSDP2's through its custom all-gather / reduce-scatter, weight-sync
gathers where they are made. What it reports per step is what the run page shows per
rank: the communication share of the step next to its compute.
"""

from __future__ import annotations

import contextlib
import datetime
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast, get_args

import torch
import torch.distributed as dist

from workers.config.run_config import TrainerBackend
from workers.core.rendezvous import default_host, join_store, open_store

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel

# trainer.backend's choices but "single" (one process, no pool).
BACKENDS = tuple(b for b in get_args(TrainerBackend) if b != "single")


@dataclass(frozen=True)
class PoolEndpoint:
    """What ranks 1.. need to join rank 0's process group (picklable)."""

    host: str
    port: int
    world_size: int
    timeout_s: float


class CommMeter:
    """Bytes and in-flight intervals of one rank's collectives since the last `drain`.
    Thread-safe: an async collective is recorded by its future's callback."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bytes = 0
        self._intervals: list[tuple[float, float]] = []

    def record(self, nbytes: int, t0: float, t1: float) -> None:
        with self._lock:
            self._bytes += int(nbytes)
            self._intervals.append((t0, t1))

    def track(self, work, nbytes: int, t0: float) -> None:
        """Record a collective issued at `t0` (perf_counter) when it completes: now if
        `work` is None (it ran synchronously), else when its future resolves."""
        if work is None:
            self.record(nbytes, t0, time.perf_counter())
            return
        work.get_future().then(lambda fut: self.record(nbytes, t0, time.perf_counter()))

    def drain(self) -> tuple[int, list[tuple[float, float]]]:
        with self._lock:
            out = (self._bytes, self._intervals)
            self._bytes, self._intervals = 0, []
            return out


def busy_seconds(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of [start, end] with at least one interval in flight (their union)."""
    total, reach = 0.0, start
    for t0, t1 in sorted(intervals):
        t0, t1 = max(t0, reach), min(t1, end)
        if t1 > t0:
            total += t1 - t0
            reach = t1
    return total


def _metered_allreduce(meter: CommMeter, bucket):
    """DDP's default gradient all-reduce (average over the ranks), metered."""
    buf = bucket.buffer()
    t0 = time.perf_counter()
    work = dist.all_reduce(buf.div_(dist.get_world_size()), async_op=True)
    nbytes = buf.numel() * buf.element_size()

    def done(fut):
        meter.record(nbytes, t0, time.perf_counter())
        return fut.value()[0]

    return work.get_future().then(done)


def _fsdp_comms(meter: CommMeter):
    """FSDP2's default all-gather and reduce-scatter, metered. The classes live in a
    private torch module: `set_custom_all_gather` / `set_custom_reduce_scatter` are the
    public hooks, and subclassing the defaults keeps torch's own allocation and calls."""
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

    class MeteredAllGather(DefaultAllGather):
        def __call__(self, output_tensor, input_tensor, group, async_op=False):
            t0 = time.perf_counter()
            work = super().__call__(output_tensor, input_tensor, group, async_op)
            meter.track(work, output_tensor.numel() * output_tensor.element_size(), t0)
            return work

    class MeteredReduceScatter(DefaultReduceScatter):
        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
            t0 = time.perf_counter()
            work = super().__call__(output_tensor, input_tensor, group, op, async_op)
            meter.track(work, input_tensor.numel() * input_tensor.element_size(), t0)
            return work

    return MeteredAllGather(), MeteredReduceScatter()


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks, by transformers' own `_no_split_modules` (the classes
    it never splits across devices): the natural FSDP units."""
    get_base_model = getattr(model, "get_base_model", None)  # a peft model's
    base = get_base_model() if get_base_model is not None else model
    names = set(getattr(base, "_no_split_modules", None) or [])
    layers = [m for m in base.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(
            f"trainer.backend 'fsdp2' shards a model layer by layer, but {type(base).__name__} names no "
            "decoder layer class (transformers' _no_split_modules): use trainer.backend 'ddp'"
        )
    return layers


class Pool:
    """This process's place in the trainer pool: its rank, the process group, and the
    wrapping of its model. Made by `open_pool` (rank 0) or `join_pool` (the others)."""

    def __init__(self, backend: str, rank: int, world_size: int, device: torch.device) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"trainer.backend {backend!r} is not a pool backend ({', '.join(BACKENDS)})")
        self.backend, self.rank, self.world_size, self.device = backend, rank, world_size, device
        self.meter = CommMeter()
        self.mesh: DeviceMesh | None = None

    @property
    def sharded(self) -> bool:
        return self.backend == "fsdp2"

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module the trainer runs forward and backward through: a DDP wrapper around
        `model`, or `model` itself sharded in place (fsdp2). Optimizers are built on
        `model`'s parameters after this call."""
        if self.backend == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index or 0] if self.device.type == "cuda" else None
            ddp = DistributedDataParallel(model, device_ids=ids)
            ddp.register_comm_hook(self.meter, _metered_allreduce)
            return ddp
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import FSDPModule, fully_shard

        # On the CPU the mesh must be named explicitly: FSDP2 defaults to the GPU.
        self.mesh = init_device_mesh(self.device.type, (self.world_size,))
        for layer in decoder_layers(model):
            fully_shard(layer, mesh=self.mesh)
        fully_shard(model, mesh=self.mesh)
        for module in model.modules():
            if isinstance(module, FSDPModule):
                gather, scatter = _fsdp_comms(self.meter)
                module.set_custom_all_gather(gather)
                module.set_custom_reduce_scatter(scatter)
        return model

    def gradient_sync(self, forward_model: torch.nn.Module, on: bool):
        """Context for one backward: with `on` False the gradients only accumulate
        locally (a minibatch's earlier micro-batches); the last one syncs them all."""
        if self.backend == "ddp":
            return contextlib.nullcontext() if on else cast("DistributedDataParallel", forward_model).no_sync()
        cast("FSDPModule", forward_model).set_requires_gradient_sync(on)
        return contextlib.nullcontext()

    def all_reduce_sum(self, values: list[float]) -> list[float]:
        """Sum `values` over the ranks (a float64 vector; every rank calls it)."""
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        t0 = time.perf_counter()
        dist.all_reduce(t)
        self.meter.record(t.numel() * t.element_size(), t0, time.perf_counter())
        return t.tolist()

    def close(self) -> None:
        if dist.is_initialized():
            with contextlib.suppress(Exception):  # a peer already gone
                dist.destroy_process_group()


def _comm_backend(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def _init_group(store, rank: int, world_size: int, device: torch.device, timeout_s: float) -> None:
    if dist.is_initialized():
        dist.destroy_process_group()  # a previous pool of this process (tests reuse actors)
    dist.init_process_group(
        _comm_backend(device),
        store=dist.PrefixStore("rollway-trainer", store),
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


class Rendezvous:
    """Rank 0's side of forming the pool: `endpoint()` binds the store (call before
    handing the endpoint to the other ranks), `join()` blocks until all have joined."""

    def __init__(self, world_size: int, timeout_s: float, host: str | None = None) -> None:
        self.world_size, self.timeout_s = world_size, timeout_s
        self.host = host or default_host()
        self._store, self._port = open_store(self.host, world_size, timeout_s, "trainer pool")

    def endpoint(self) -> PoolEndpoint:
        return PoolEndpoint(self.host, self._port, self.world_size, self.timeout_s)

    def join(self, backend: str, device: torch.device) -> Pool:
        _init_group(self._store, 0, self.world_size, device, self.timeout_s)
        return Pool(backend, 0, self.world_size, device)


def join_pool(endpoint: PoolEndpoint, backend: str, rank: int, device: torch.device) -> Pool:
    """Rank `rank` (≥ 1) joins the pool rank 0 opened; blocks until every rank has."""
    if not 1 <= rank < endpoint.world_size:
        raise ValueError(f"trainer rank must be in 1..{endpoint.world_size - 1} (got {rank})")
    store = join_store(endpoint.host, endpoint.port, endpoint.world_size, endpoint.timeout_s)
    _init_group(store, rank, endpoint.world_size, device, endpoint.timeout_s)
    return Pool(backend, rank, endpoint.world_size, device)
