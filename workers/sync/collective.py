"""Protocol "collective": broadcast over a torch.distributed process group (gloo on CPU,
NCCL on GPU) from the trainer (rank 0) to every inference worker (ranks 1..N).

Two modes move the same bytes in a different number of messages:

- `per_tensor`: one broadcast per parameter (~9 per transformer layer). Simple, and
  every message pays the collective's fixed cost (a round of handshakes).
- `packed`: broadcasts of `bucket_mb` slices of one flat buffer per dtype. The trainer's
  parameters are re-laid as views of that buffer at `attach` (same Parameter objects,
  same values), so a bucket is a slice: no copy in, no copy out. On CPU the copies are
  what decide it: packing by copying into a bucket and back costs more than it saves
  (docs/performance.md). `sync.flat_params=false` keeps the copying variant, for
  measurement.

The group is a standalone one (a TCPStore + ProcessGroupGloo/NCCL), not the default
process group: an in-process vLLM engine initialises its own default group, and the
sync group must not collide with it or with a trainer's FSDP group.

Order: the trainer notifies, then broadcasts a small header [seq, version] and the
payload. Each receiver joins broadcasts strictly in `seq` order (notices may reach a
threaded actor out of order) into one staging flat buffer; `apply` loads whatever
version is newest in staging.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from workers.core.rendezvous import default_host, join_store, open_store
from workers.core.sync_messages import Notice, Notify, SyncReport, end_to_end_ms
from workers.model.loading import tied_weight_names
from workers.sync.base import Stopwatch, WeightReceiver, WeightSender
from workers.sync.weights import gathered_parameters, is_sharded

if TYPE_CHECKING:
    from workers.config.run_config import SyncConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Entry:
    name: str  # checkpoint name
    dtype: str
    shape: tuple[int, ...]
    offset: int  # in elements, within its dtype's flat buffer
    numel: int


@dataclass(frozen=True)
class Layout:
    """Where each parameter lives in one flat buffer per dtype (checkpoint names)."""

    entries: tuple[Entry, ...]
    sizes: tuple[tuple[str, int], ...]  # (dtype, numel) per flat buffer, sorted by dtype

    @classmethod
    def of(cls, model: torch.nn.Module) -> Layout:
        named = list(model.named_parameters())
        # A tied weight is one parameter under two state-dict names: it moves once.
        extra = sorted(set(model.state_dict()) - {n for n, _ in named} - tied_weight_names(model))
        if extra:
            raise NotImplementedError(
                f"collective sync moves parameters only; this model's state dict also has "
                f"{extra[:5]} (buffers): use sync.protocol 'object_store' or 'filesystem'"
            )
        sizes: dict[str, int] = {}
        entries = []
        for name, p in named:
            dtype = str(p.dtype).removeprefix("torch.")
            entries.append(Entry(name, dtype, tuple(p.shape), sizes.get(dtype, 0), p.numel()))
            sizes[dtype] = sizes.get(dtype, 0) + p.numel()
        return cls(tuple(entries), tuple(sorted(sizes.items())))

    @property
    def nbytes(self) -> int:
        return sum(n * torch.empty((), dtype=getattr(torch, d)).element_size() for d, n in self.sizes)

    def digest(self) -> str:
        return hashlib.sha256(repr(self).encode()).hexdigest()[:16]

    def allocate(self, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
        return {d: torch.empty(n, dtype=getattr(torch, d), device=device) for d, n in self.sizes}

    def views(self, flats: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """name → view of its slice of the flat buffers (no copy)."""
        return {e.name: flats[e.dtype][e.offset : e.offset + e.numel].view(e.shape) for e in self.entries}

    def bucket_ranges(self, bucket_mb: float) -> list[tuple[str, int, int]]:
        """(dtype, start, end) element ranges of at most `bucket_mb` each, covering every buffer."""
        out = []
        for dtype, n in self.sizes:
            size = torch.empty((), dtype=getattr(torch, dtype)).element_size()
            step = max(1, int(bucket_mb * 2**20) // size)
            out += [(dtype, s, min(s + step, n)) for s in range(0, n, step)]
        return out


def flatten_parameters(model: torch.nn.Module, layout: Layout) -> dict[str, torch.Tensor]:
    """Move every parameter into one flat buffer per dtype and make it a view of it.

    The Parameter objects stay the same (an optimizer built before keeps working); only
    their storage moves. Returns the flat buffers."""
    params = dict(model.named_parameters())
    device = next(iter(params.values())).device
    flats = layout.allocate(device)
    with torch.no_grad():
        for e, view in zip(layout.entries, layout.views(flats).values(), strict=True):
            p = params[e.name]
            view.copy_(p.data)
            p.data = view
    return flats


def is_flat(model: torch.nn.Module, layout: Layout, flats: dict[str, torch.Tensor]) -> bool:
    """True while every parameter still views its slot (a `.to()` or `load_state_dict`
    with assign=True would silently break the layout)."""
    params = dict(model.named_parameters())
    for e in layout.entries:
        flat = flats[e.dtype]
        expected = flat.data_ptr() + e.offset * flat.element_size()
        if params[e.name].data_ptr() != expected:
            return False
    return True


def _new_group(store: dist.Store, rank: int, world_size: int, backend: str, timeout_s: float):
    prefixed = dist.PrefixStore("rollway-sync", store)
    timeout = datetime.timedelta(seconds=timeout_s)
    if backend == "nccl":
        # torch's stub makes `options` required; its binding defaults it.
        return dist.ProcessGroupNCCL(prefixed, rank, world_size)  # type: ignore[call-arg]
    return dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)


def _broadcast_all(group, tensors: list[torch.Tensor]) -> None:
    """Broadcast from rank 0, in order: all posted, then all awaited (the transport
    pipelines them instead of idling between messages)."""
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    works = [group.broadcast([t], opts) for t in tensors]
    for w in works:
        w.wait()


class CollectiveSender(WeightSender):
    protocol = "collective"

    def __init__(self, sync: SyncConfig, num_receivers: int, host: str | None = None) -> None:
        """`sync`: the run's sync section (packed, bucket_mb, flat_params, timeout_s)."""
        super().__init__()
        if num_receivers < 1:
            raise ValueError(f"a collective sync needs ≥ 1 inference worker (got {num_receivers})")
        self.num_receivers = num_receivers
        self.mode = "packed" if sync.packed else "per_tensor"
        self.bucket_mb, self.flat_params = sync.bucket_mb, sync.flat_params
        self.host = host
        self.timeout_s = sync.timeout_s
        self.layout: Layout | None = None
        self.flats: dict[str, torch.Tensor] | None = None
        self.sharded = False
        self._store: dist.Store | None = None
        self._port: int | None = None
        self._group: dist.ProcessGroup | None = None

    def attach(self, model: torch.nn.Module) -> None:
        super().attach(model)
        self.layout = Layout.of(model)
        # A sharded trainer's parameters are DTensors: they stream through `_send_gathered`.
        self.sharded = is_sharded(model)
        if self.sharded and self.mode == "packed" and len(self.layout.sizes) > 1:
            raise NotImplementedError(
                "collective sync from a sharded trainer packs one dtype's buckets: this model's parameters "
                f"come in {[d for d, _ in self.layout.sizes]}; set sync.packed to false"
            )
        if self.mode == "packed" and self.flat_params and not self.sharded:
            self.flats = flatten_parameters(model, self.layout)

    @property
    def backend(self) -> str:
        return "nccl" if self._device().type == "cuda" else "gloo"

    def endpoint(self) -> dict[str, Any]:
        """Opens the rendezvous (binds a port of workers.core.rendezvous.PORT_RANGE) and describes it."""
        if self.layout is None:
            raise RuntimeError("CollectiveSender.endpoint before attach(model)")
        self._open_store()
        return {
            "protocol": self.protocol,
            "host": self.host,
            "port": self._port,
            "world_size": self.num_receivers + 1,
            "backend": self.backend,
            "mode": self.mode,
            "bucket_mb": self.bucket_mb,
            "layout": self.layout,
            "timeout_s": self.timeout_s,
        }

    def _open_store(self) -> dist.Store:
        """The rendezvous' store, opened on a port of workers.core.rendezvous.PORT_RANGE at the first call."""
        if self._store is None:
            self.host = self.host or default_host()
            self._store, self._port = open_store(self.host, self.num_receivers + 1, self.timeout_s, "weight sync")
        return self._store

    def _require_layout(self) -> Layout:
        if self.layout is None:
            raise RuntimeError("CollectiveSender used before attach(model): attach the trainer's model first")
        return self.layout

    def connect(self) -> None:
        """Blocks until every receiver has called `connect` too (call them concurrently)."""
        self.endpoint()  # opens the rendezvous, if `endpoint` has not
        self._group = _new_group(self._open_store(), 0, self.num_receivers + 1, self.backend, self.timeout_s)

    def _payload(self) -> tuple[list[torch.Tensor], int]:
        """What to broadcast, and how many tensors it carries."""
        model, layout = self._require_model(), self._require_layout()
        if self.mode == "per_tensor":
            return [p.data.contiguous() for _, p in model.named_parameters()], len(layout.entries)
        ranges = layout.bucket_ranges(self.bucket_mb)
        if self.flat_params:
            flats = self.flats
            if flats is None or not is_flat(model, layout, flats):
                log.warning("trainer parameters were moved out of the flat sync buffer; re-flattening")
                flats = self.flats = flatten_parameters(model, layout)
            return [flats[d][s:e] for d, s, e in ranges], len(layout.entries)
        # Copying variant: gather each bucket's pieces of the logical flat layout.
        params = dict(model.named_parameters())
        buckets = []
        for dtype, s, e in ranges:
            bucket = torch.empty(e - s, dtype=getattr(torch, dtype), device=next(iter(params.values())).device)
            for ent in layout.entries:
                if ent.dtype != dtype or ent.offset >= e or ent.offset + ent.numel <= s:
                    continue
                lo, hi = max(s, ent.offset), min(e, ent.offset + ent.numel)
                bucket[lo - s : hi - s] = params[ent.name].data.reshape(-1)[lo - ent.offset : hi - ent.offset]
            buckets.append(bucket)
        return buckets, len(layout.entries)

    def send(self, version: int, notify: Notify) -> SyncReport:
        if self._group is None:
            raise RuntimeError("CollectiveSender.send before connect(): connect the trainer and workers first")
        sent_at, clock = time.time(), Stopwatch()
        seq = self._next_seq()
        layout = self._require_layout()
        nbytes = layout.nbytes
        notify(Notice(self.protocol, version, seq, nbytes, sent_at, {"layout": layout.digest()}))
        with torch.no_grad():
            if self.sharded:
                header = torch.tensor([seq, version], dtype=torch.int64, device=self._device())
                _broadcast_all(self._group, [header])
                messages = self._send_gathered(self._group, layout)
                tensors = len(layout.entries)
            else:
                payload, tensors = self._payload()
                header = torch.tensor([seq, version], dtype=torch.int64, device=payload[0].device)
                _broadcast_all(self._group, [header, *payload])
                messages = len(payload)
        return SyncReport(self.protocol, version, nbytes, trainer_ms=clock.ms(), tensors=tensors, messages=messages)

    def _device(self) -> torch.device:
        return next(self._require_model().parameters()).device

    def _send_gathered(self, group: dist.ProcessGroup, layout: Layout) -> int:
        """A sharded trainer's broadcast: the same messages the receivers expect from a
        whole one (a tensor per parameter, or the layout's buckets), each filled from
        parameters gathered as they are needed (workers/sync/weights.py; the pool's other
        ranks join the gathers), so rank 0 holds at most about one bucket at a time."""
        stream = gathered_parameters(self._require_model())
        if self.mode == "per_tensor":
            count = 0
            for _, full in stream:
                _broadcast_all(group, [full.contiguous()])
                count += 1
            return count
        ((dtype, _),) = layout.sizes
        buckets = layout.bucket_ranges(self.bucket_mb)
        entries = iter(layout.entries)
        held, held_at = None, 0  # the gathered parameter being copied, and its offset
        for _, s, e in buckets:
            bucket = torch.empty(e - s, dtype=getattr(torch, dtype), device=self._device())
            at = s
            while at < e:
                if held is None or held_at + held.numel() <= at:
                    entry = next(entries)
                    held, held_at = next(stream)[1].reshape(-1), entry.offset
                lo, hi = at, min(e, held_at + held.numel())
                bucket[lo - s : hi - s] = held[lo - held_at : hi - held_at]
                at = hi
            _broadcast_all(group, [bucket])
        for _ in stream:  # nothing is left, but every rank must finish the same gathers
            pass
        return len(buckets)

    def close(self) -> None:
        self._group = None
        self._store = None


@dataclass
class StagedBroadcast:
    notice: Notice
    receive_ms: float


class CollectiveReceiver(WeightReceiver):
    protocol = "collective"

    def __init__(self) -> None:
        self._group: dist.ProcessGroup | None = None
        self._store: dist.Store | None = None
        self.layout: Layout | None = None
        # One staging buffer: receive and apply take the lock, so a broadcast never lands
        # in the middle of a load. A second buffer would let the trainer's broadcast
        # never wait on a worker's load (ms here) at the price of a second model copy.
        self._lock = threading.Lock()
        self._turn = threading.Condition()
        self._next_seq = 0
        self._staged: StagedBroadcast | None = None  # the version in staging now
        self._applied_seq = -1

    def connect(self, endpoint: dict[str, Any], rank: int = 1) -> None:
        """Blocks until the trainer and every other receiver connect too."""
        super().connect(endpoint, rank)
        world = endpoint["world_size"]
        if not 1 <= rank < world:
            raise ValueError(f"receiver rank must be in 1..{world - 1} (got {rank})")
        self.endpoint = endpoint
        self.layout = endpoint["layout"]
        device = "cuda" if endpoint["backend"] == "nccl" else "cpu"
        self.flats = self.layout.allocate(device)
        self.views = self.layout.views(self.flats)
        if endpoint["mode"] == "per_tensor":
            self._targets = list(self.views.values())
        else:
            self._targets = [self.flats[d][s:e] for d, s, e in self.layout.bucket_ranges(endpoint["bucket_mb"])]
        self._store = store = join_store(endpoint["host"], endpoint["port"], world, endpoint["timeout_s"])
        self._group = _new_group(store, rank, world, endpoint["backend"], endpoint["timeout_s"])

    def receive(self, notice: Notice) -> StagedBroadcast:
        """Join the broadcast of `notice` (blocks until the trainer sends it)."""
        if self._group is None or self.layout is None:
            raise RuntimeError("CollectiveReceiver.receive before connect(endpoint)")
        if notice.payload.get("layout") != self.layout.digest():
            raise RuntimeError("the trainer's parameter layout changed since connect; reconnect the sync group")
        with self._turn:
            if notice.seq < self._next_seq:
                raise RuntimeError(f"notice seq {notice.seq} already received (next is {self._next_seq})")
            self._turn.wait_for(lambda: self._next_seq == notice.seq)
        try:
            with self._lock:
                clock = Stopwatch()
                header = torch.empty(2, dtype=torch.int64, device=self._targets[0].device)
                _broadcast_all(self._group, [header, *self._targets])
                got = tuple(header.tolist())
                if got != (notice.seq, notice.version):
                    raise RuntimeError(
                        f"collective sync out of step: expected (seq, version) "
                        f"{(notice.seq, notice.version)}, the trainer sent {got}"
                    )
                self._staged = StagedBroadcast(notice, clock.ms())
                return self._staged
        finally:
            with self._turn:
                self._next_seq = notice.seq + 1
                self._turn.notify_all()

    def apply(self, backend: Any, staged: StagedBroadcast) -> SyncReport | None:
        """Load the newest version in staging (may be newer than `staged`, if another
        arrived since); None if it is already loaded."""
        with self._lock:
            current, layout = self._staged, self.layout
            if current is None or layout is None or current.notice.seq <= self._applied_seq:
                return None
            clock = Stopwatch()
            backend.load_weights(self.views)
            load_ms = clock.ms()
            self._applied_seq = current.notice.seq
        notice = current.notice
        return SyncReport(
            self.protocol,
            notice.version,
            notice.nbytes,
            inference_ms=current.receive_ms + load_ms,
            end_to_end_ms=end_to_end_ms(notice),
            receive_ms=current.receive_ms,
            tensors=len(layout.entries),
            messages=len(self._targets),
        )

    def close(self) -> None:
        self._group = None
        self._store = None
