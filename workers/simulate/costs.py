"""Cost models of the simulator: how long generation, a training step and a weight sync
take on a device, from the model's shape and the hardware's published figures.

- Generation (`DecodeCost`): a roofline per decode step. Each step reads the weights
  once for the whole batch (batch amortisation) plus every running sequence's KV cache
  up to its position, at the device's memory bandwidth; or it is compute bound (2·N
  FLOPs per token) when the batch is big enough. Sequences share a worker's slots as in
  continuous batching: at most `max_seqs` run at once, fewer when the KV cache would not
  hold them, and a call ends when its longest completion ends (the long tail).
- Training (`TrainCost`): 6·N FLOPs per trained token (forward and backward) plus 2·N
  for the π_old forward the loss recomputes, at an MFU per device, over the ranks; plus
  the gradient all-reduce.
- Weight sync (`sync_cost`): the bytes each protocol of workers/sync moves, over the
  link between the pools (bandwidth + latency per message).

Every constant says where it comes from. The figures are per GPU; a tensor-parallel
inference worker splits weights, KV cache and FLOPs over its GPUs.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class Device:
    name: str
    memory_bytes: float
    hbm_bytes_per_s: float
    bf16_flops: float  # dense, no sparsity
    host_bytes_per_s: float  # host ↔ device copies (offload, object store, files)


# NVIDIA H100 SXM5 datasheet: 80 GB HBM3 at 3.35 TB/s, 989 TFLOP/s dense BF16; PCIe Gen5
# x16 is 64 GB/s per direction, about 50 GB/s achieved by pinned copies.
H100 = Device("H100", 80e9, 3.35e12, 989e12, 50e9)
# NVIDIA H20 (HGX, the export part the verl recipes ran on): 96 GB HBM3 at 4.0 TB/s,
# 148 TFLOP/s dense BF16 (296 with sparsity), PCIe Gen5. A seventh of an H100's compute
# with more bandwidth: decode is bandwidth bound, training ~6.7× slower per GPU.
H20 = Device("H20", 96e9, 4.0e12, 148e12, 50e9)
# NVIDIA H800 SXM5 (AReaL's cluster): an H100 SXM5 with NVLink cut to 400 GB/s.
H800 = Device("H800", 80e9, 3.35e12, 989e12, 50e9)


@dataclass(frozen=True)
class ModelShape:
    """What the costs need of a decoder-only transformer (a Hugging Face config's
    num_hidden_layers, hidden_size, num_key_value_heads × head_dim, intermediate_size).

    A mixture of experts computes with the parameters a token is routed through
    (`active_params`: the shared weights and num_experts_per_tok of num_experts) but
    stores, reads per decode step (a batch of dozens touches every expert) and sends all
    of them (`params`). A hybrid-attention model keeps a KV cache in its full-attention
    layers only (`kv_layers`); linear-attention layers keep a fixed-size state."""

    name: str
    params: float
    layers: int
    hidden: int
    kv_width: int  # num_key_value_heads × head_dim
    intermediate: int
    tensors: int  # parameter tensors in the state dict (messages of a per-tensor sync)
    active_params: float | None = None  # None: dense, every parameter computes
    kv_layers: int | None = None  # None: every layer attends with a KV cache
    # Tensors of the model's Hugging Face checkpoint, one per expert projection, which a
    # per-tensor sync from Megatron or FSDP sends one by one (None: `tensors`).
    checkpoint_tensors: int | None = None

    @property
    def compute_params(self) -> float:
        return self.params if self.active_params is None else self.active_params

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> float:
        layers = self.layers if self.kv_layers is None else self.kv_layers
        return 2 * layers * self.kv_width * dtype_bytes  # K and V, every attention layer

    def lora_params(self, rank: int) -> float:
        """A LoRA adapter on every linear layer (peft 'all-linear'): r·(in + out) each of
        q, k, v, o, gate, up, down."""
        h, kv, i = self.hidden, self.kv_width, self.intermediate
        return self.layers * rank * ((h + h) + 2 * (h + kv) + (h + h) + 2 * (h + i) + (i + h))


def shape_of(model, name: str | None = None) -> ModelShape:
    """The shape of a loaded Hugging Face causal LM (a torch module with a `config`):
    its config's text part for the layers, widths, experts and attention kinds, its
    state dict for the parameter and tensor counts. Experts are the state dict's
    `.experts.` tensors (transformers stacks each projection of all experts in one
    tensor: num_experts × …); of those a token computes with num_experts_per_tok."""
    cfg = model.config.get_text_config()
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    state = model.state_dict()
    total = float(sum(t.numel() for t in state.values()))
    experts = getattr(cfg, "num_experts", None) or getattr(cfg, "n_routed_experts", None)
    per_token = getattr(cfg, "num_experts_per_tok", None)
    active = None
    checkpoint_tensors = len(state)
    if experts and per_token:
        stacked = {n: t for n, t in state.items() if ".experts." in n}
        routed = float(sum(t.numel() for t in stacked.values()))
        active = total - routed * (1 - per_token / experts)
        # A checkpoint holds each expert's gate, up and down projections apart.
        unstacked = sum(experts * (2 if "gate_up" in n else 1) if t.dim() == 3 else 1 for n, t in stacked.items())
        checkpoint_tensors += unstacked - len(stacked)
    layer_types = getattr(cfg, "layer_types", None)
    kv_layers = sum(1 for kind in layer_types if kind == "full_attention") if layer_types else None
    intermediate = int(getattr(cfg, "intermediate_size", None) or getattr(cfg, "moe_intermediate_size", None) or 0)
    return ModelShape(
        name or getattr(cfg, "name_or_path", "") or cfg.model_type,
        total,
        cfg.num_hidden_layers,
        cfg.hidden_size,
        kv_heads * head_dim,
        intermediate,
        len(state),
        active,
        kv_layers if kv_layers != cfg.num_hidden_layers else None,
        checkpoint_tensors,
    )


def shape_of_config(config, name: str) -> ModelShape:
    """The shape of the causal LM a transformers config describes, built on the meta
    device (no weights allocated: a 235B model in a fraction of a second)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return shape_of(model, name)


# Qwen2.5-7B and -32B config.json (Hugging Face): 28 / 64 layers, hidden 3584 / 5120,
# 4 / 8 KV heads of 128, intermediate 18944 / 27648; 7.62e9 / 32.8e9 parameters (model
# cards). 12 tensors per layer (q, k, v weight and bias, o, gate, up, down, 2 norms) + 3.
QWEN25_7B = ModelShape("7B", 7.62e9, 28, 3584, 4 * 128, 18944, 28 * 12 + 3)
QWEN25_32B = ModelShape("32B", 32.8e9, 64, 5120, 8 * 128, 27648, 64 * 12 + 3)
MODELS = {m.name: m for m in (QWEN25_7B, QWEN25_32B)}

BF16 = 2  # bytes per weight and per KV element served in bfloat16
# Bytes per parameter the engine's object_store, collective, filesystem and lora syncs
# move: each tensor in its own dtype (workers/sync), and the trainer keeps float32
# master weights even when it computes in bfloat16 (trainer.dtype). Twice the bytes of
# the peers' bfloat16 transfers; only cuda_ipc packs in the inference dtype.
WIRE_BYTES = 4

# Share of peak HBM bandwidth a decode step achieves: vLLM's paged attention and GEMV
# kernels reach 75–85% of the H100's 3.35 TB/s in memory-bound decode (vLLM and
# FlashInfer published decode benchmarks).
DECODE_BW_EFFICIENCY = 0.8
# MFU of decode when compute bound and of prefill (large GEMMs): ~50% of dense BF16 peak.
INFERENCE_MFU = 0.5
# Sequences one inference worker decodes at once (vLLM's max_num_seqs). Fitted to the
# published single-H100 7B times at 2K and 8K (docs/simulation.md, calibration: −25% and
# +20% at 64); vLLM's own default of 256 would make the 2K batch 2.7× faster than published.
MAX_SEQS = 64
# vLLM's gpu_memory_utilization default: the share of GPU memory for weights + KV cache.
GPU_MEMORY_UTILIZATION = 0.9
# Tensor parallelism: two all-reduces per layer per decode step, each a small NCCL
# message inside one NVLink domain (~8 µs latency, NCCL tests on H100 SXM).
TP_ALLREDUCE_S = 8e-6


class CallProfile:
    """One generate call of a worker: its sequences' lengths (in the order they were
    served), when each ends (seconds from the call's start), and the wall time. Lookups
    by time are a bisection over the sorted ends (a profile is reused by many calls)."""

    def __init__(self, lengths: np.ndarray, ends_s: np.ndarray, seconds: float) -> None:
        self.lengths, self.ends_s, self.seconds = lengths, ends_s, seconds
        self.tokens = int(lengths.sum())
        self.order = np.argsort(ends_s, kind="stable")  # sequences by when they end
        ends = ends_s[self.order]
        lens = lengths[self.order].astype(np.float64)
        self._ends = ends.tolist()
        # After j sequences have ended: their tokens, and the token rate of the rest (each
        # sequence's tokens spread evenly over its time).
        self._finished_tokens = np.concatenate(([0.0], np.cumsum(lens))).tolist()
        rate = lens / np.maximum(ends, 1e-12)
        self._rate_left = np.concatenate((np.cumsum(rate[::-1])[::-1], [0.0])).tolist()

    def finished_by(self, t: float) -> int:
        return bisect.bisect_right(self._ends, t)

    def finished_tokens(self, t: float) -> float:
        return self._finished_tokens[self.finished_by(t)]

    def tokens_by(self, t: float) -> float:
        """Tokens generated by `t` seconds into the call."""
        if t <= 0:
            return 0.0
        j = self.finished_by(t)
        return self._finished_tokens[j] + t * self._rate_left[j]

    def unfinished(self, t: float) -> np.ndarray:
        """Indices of the sequences still generating at `t`."""
        return self.order[self.finished_by(t) :]


@dataclass(frozen=True)
class DecodeCost:
    """Generation on one inference worker of `tp` GPUs."""

    model: ModelShape
    device: Device = H100
    tp: int = 1
    prompt_tokens: int = 512  # a reasoning prompt with its chat template (the Workload default)
    max_seqs: int = MAX_SEQS
    bw_efficiency: float = DECODE_BW_EFFICIENCY
    mfu: float = INFERENCE_MFU

    @property
    def weight_bytes(self) -> float:
        return self.model.params * BF16

    def slots(self, mean_completion: float) -> int:
        """Sequences the worker runs at once: max_seqs, or fewer when the KV cache left
        beside the weights would not hold them at their mean length (paged KV)."""
        room = self.device.memory_bytes * GPU_MEMORY_UTILIZATION * self.tp - self.weight_bytes
        per_seq = self.model.kv_bytes_per_token(BF16) * (self.prompt_tokens + mean_completion)
        fit = int(room // per_seq) if room > 0 else 0
        if fit < 1:
            raise ValueError(
                f"a {self.model.name} model in bfloat16 and one sequence of {self.prompt_tokens + mean_completion:.0f} "
                f"tokens do not fit on {self.tp} {self.device.name} GPU(s): raise the tensor parallel size"
            )
        return min(self.max_seqs, fit)

    def step_seconds(self, batch: int, context: float) -> float:
        """One decode step of `batch` sequences at `context` tokens each (the roofline)."""
        memory = (self.weight_bytes + batch * context * self.model.kv_bytes_per_token(BF16)) / self.tp
        flops = 2 * self.model.compute_params * batch / self.tp
        seconds = max(
            memory / (self.device.hbm_bytes_per_s * self.bw_efficiency), flops / (self.device.bf16_flops * self.mfu)
        )
        return seconds + (2 * self.model.layers * TP_ALLREDUCE_S if self.tp > 1 else 0.0)

    def tokens_per_s(self, batch: int, context: float) -> float:
        """Generated tokens per second of the worker at that batch and context."""
        return batch / self.step_seconds(batch, context)

    def call(self, lengths: np.ndarray, slots: int) -> CallProfile:
        """The wall time of decoding `lengths` (one per sequence, served in this order)
        with `slots` running at once: a roofline per step, summed in closed form over the
        stretches where the running set does not change."""
        lengths = np.asarray(lengths, dtype=np.int64)
        m = len(lengths)
        if m == 0:
            return CallProfile(lengths, np.zeros(0), 0.0)
        starts = _slot_starts(lengths, slots)
        ends = starts + lengths
        # Stretch boundaries, in decode steps, and the running set on each stretch.
        bounds = np.unique(np.concatenate((starts, ends)))
        k0, k1 = bounds[:-1], bounds[1:]
        n = (k1 - k0).astype(np.float64)
        s_sorted = np.sort(starts)
        order_end = np.argsort(ends, kind="stable")
        e_sorted = ends[order_end]
        started = np.searchsorted(s_sorted, k0, side="right")
        ended = np.searchsorted(e_sorted, k0, side="right")
        b = (started - ended).astype(np.float64)
        cum_s = np.concatenate(([0], np.cumsum(s_sorted)))
        cum_s_ended = np.concatenate(([0], np.cumsum(starts[order_end])))
        sum_starts = (cum_s[started] - cum_s_ended[ended]).astype(np.float64)
        # Σ over the stretch's steps k of Σ over running sequences of its context P + k − s.
        ctx = b * self.prompt_tokens * n + b * (k0 + k1 - 1) * n / 2 - sum_starts * n
        tp = self.tp
        mem_s = (n * self.weight_bytes / tp + ctx * self.model.kv_bytes_per_token(BF16) / tp) / (
            self.device.hbm_bytes_per_s * self.bw_efficiency
        )
        flop_s = 2 * self.model.compute_params * b * n / tp / (self.device.bf16_flops * self.mfu)
        step_s = np.maximum(mem_s, flop_s) + (n * 2 * self.model.layers * TP_ALLREDUCE_S if tp > 1 else 0.0)
        prefill_s = self.prefill_seconds(m * self.prompt_tokens)
        t_at = np.concatenate(([0.0], np.cumsum(step_s))) + prefill_s
        ends_s = t_at[np.searchsorted(bounds, ends)]
        return CallProfile(lengths, ends_s, float(t_at[-1]))

    def prefill_seconds(self, tokens: float) -> float:
        """Compute-bound prefill (prompts, or kept tokens re-prefilled after an abort)."""
        return 2 * self.model.compute_params * tokens / self.tp / (self.device.bf16_flops * self.mfu)

    def load_seconds(self) -> float:
        """Putting staged weights into the engine: a device-to-device copy of its shard
        (each byte read once and written once)."""
        return 2 * self.weight_bytes / self.tp / (self.device.hbm_bytes_per_s * self.bw_efficiency)

    def handoff_seconds(self) -> float:
        """A call's Ray calls to the buffer (admission, handing over the groups): a few
        milliseconds against calls of minutes at these sizes, so left out."""
        return 0.0


@dataclass(frozen=True)
class StreamingDecode:
    """Generation on a rollout server that streams (verl's and AReaL's): prompts are
    submitted one by one, a freed slot takes the next at once, and each finished
    sample leaves at once. Modelled as lanes of one group each sharing a worker's
    continuous batch: every sequence advances one token per decode step of the full
    batch (`running` sequences at their mean context), so a lane's call lasts as long as
    its own group's longest completion, not the longest of the worker's whole share."""

    inner: DecodeCost
    step_s: float  # one decode step of the worker's full batch

    @classmethod
    def of(cls, inner: Decode, running: int, prompt_tokens: int, mean_completion: float) -> StreamingDecode:
        if not isinstance(inner, DecodeCost):
            raise ValueError("streaming generation needs the roofline's decode model, not measured costs")
        # A running sequence is, on average, halfway through its completion.
        return cls(inner, inner.step_seconds(running, prompt_tokens + mean_completion / 2))

    def slots(self, mean_completion: float) -> int:
        return self.inner.slots(mean_completion)

    def call(self, lengths: np.ndarray, slots: int) -> CallProfile:
        lengths = np.asarray(lengths, dtype=np.int64)
        ends = self.inner.prefill_seconds(len(lengths) * self.inner.prompt_tokens) + lengths * self.step_s
        return CallProfile(lengths, ends, float(ends.max()) if len(ends) else 0.0)

    def prefill_seconds(self, tokens: float) -> float:
        return self.inner.prefill_seconds(tokens)

    def load_seconds(self) -> float:
        return self.inner.load_seconds()

    def handoff_seconds(self) -> float:
        return 0.0


def _slot_starts(lengths: np.ndarray, slots: int) -> np.ndarray:
    """The decode step at which each sequence gets a slot: all at 0 when they fit, else
    each waits for the first slot to free (continuous batching, in arrival order)."""
    m = len(lengths)
    if m <= slots:
        return np.zeros(m, dtype=np.int64)
    free = [0] * slots
    starts = np.empty(m, dtype=np.int64)
    for i, n in enumerate(lengths.tolist()):
        t = heapq.heappop(free)
        starts[i] = t
        heapq.heappush(free, t + n)
    return starts


# Model FLOPs utilisation of FSDP/Megatron dense training on H100: 35–45% (Llama 3
# report: 38–43% on 16K H100s); 0.4 here.
TRAIN_MFU = 0.4


@dataclass(frozen=True)
class TrainCost:
    """One training step over `ranks` GPUs (data parallel, weights sharded).

    Data parallelism splits a batch by whole sequences, so a pass ends when its busiest
    rank ends: at best the pass's tokens spread evenly, at worst one rank holds the
    longest sequence. Each minibatch (`trainer.minibatches`: one optimizer update each)
    is such a pass, with its own gradient reduction."""

    model: ModelShape
    ranks: int
    device: Device = H100
    mfu: float = TRAIN_MFU
    lora_rank: int | None = None  # LoRA: the adapter's rank; None: full fine-tuning
    grad_link_bytes_per_s: float = 0.0  # the slowest link of the gradient reduction; 0: one GPU
    # The engine recomputes π_old with a forward over the batch before the updates; a
    # system that trains against the rollout's own logprobs skips it.
    recompute_old: bool = True

    def seconds(self, tokens: float, longest: Sequence[float] = ()) -> float:
        """`tokens` trained (prompt + completion) in one step, in `len(longest)` minibatches
        of equal tokens whose longest sequences are `longest` (none given: one minibatch,
        evenly spread): forward + backward (6·N per token; LoRA skips the weight
        gradients: 4·N) per minibatch, plus the π_old forward (2·N) over the batch."""
        lora = self.lora_rank is not None
        parts = list(longest) or [0.0]
        per_part = tokens / len(parts)
        rate = self.ranks * self.device.bf16_flops * self.mfu

        def pass_s(flops_per_token: float, part_tokens: float, part_longest: float) -> float:
            return flops_per_token * max(part_tokens, part_longest * self.ranks) / rate

        n = self.model.compute_params
        compute = sum(pass_s((4 if lora else 6) * n, per_part, big) for big in parts)
        if self.recompute_old:
            compute += pass_s(2 * n, tokens, max(parts))
        trained = self.model.lora_params(self.lora_rank) if self.lora_rank is not None else self.model.params
        # Ring reduce-scatter + all-gather of bf16 gradients: 2·(R−1)/R of their bytes per
        # rank, once per optimizer update.
        comm = 0.0
        if self.ranks > 1 and self.grad_link_bytes_per_s:
            comm = len(parts) * 2 * (self.ranks - 1) / self.ranks * trained * BF16 / self.grad_link_bytes_per_s
        return compute + comm

    def overhead_seconds(self) -> float:
        """A step's time outside the step and the send (taking the batch, the metrics):
        milliseconds against steps of seconds to minutes at these sizes, so left out."""
        return 0.0


@dataclass(frozen=True)
class Link:
    name: str
    bytes_per_s: float  # per GPU, one direction
    latency_s: float  # per message


# NVLink 4 (H100 SXM): 900 GB/s per GPU both directions → 450 GB/s each way; NCCL adds
# ~0.3 ms per collective call on top of the wire (launch, sync): 100+ tensors sent one by
# one then cost 100–500 ms for a 7B model, as the peers report for per-tensor broadcast.
NVLINK = Link("NVLink", 450e9, 3e-4)
# NVLink on the H800: 400 GB/s both directions → 200 GB/s each way.
NVLINK_H800 = Link("NVLink-H800", 200e9, 3e-4)
# InfiniBand NDR, one 400 Gb/s HCA per GPU (DGX H100): 50 GB/s.
INFINIBAND = Link("InfiniBand", 50e9, 3e-4)
# 100 GbE per node shared by its 8 GPUs, TCP sockets: ~1.5 GB/s each, ms latency.
ETHERNET = Link("Ethernet", 12.5e9 / 8, 1e-3)
# A parallel filesystem seen from one node: ~5 GB/s write or read per client (Lustre,
# GPFS, FSx class), 5 ms to create, fsync and open a file (metadata round trips).
FILESYSTEM = Link("filesystem", 5e9, 5e-3)
LINKS = {link.name: link for link in (NVLINK, INFINIBAND, ETHERNET, FILESYSTEM)}


@dataclass(frozen=True)
class SyncCost:
    bytes: float  # payload each inference worker gets
    trainer_s: float  # how long the send blocks the trainer
    latency_s: float  # trainer publish → weights staged on every inference worker
    # Measured latencies to draw each sync's from instead (workers/simulate/measured.py):
    # a loaded host delivers most syncs in milliseconds and a few a step late.
    latency_draws: tuple[float, ...] = ()


def sync_cost(
    protocol: str,
    model: ModelShape,
    *,
    link: Link,
    workers: int,
    nodes: int,
    packed: bool = True,
    bucket_mb: float = 32.0,
    lora_rank: int = 8,
    device: Device = H100,
    delta_changed: float | None = None,
    wire_bytes: int = WIRE_BYTES,
    tensors: int | None = None,
    senders: int = 1,
) -> SyncCost:
    """What one weight sync of `protocol` (workers/sync) costs between the pools over
    `link`, to `workers` inference workers on `nodes` nodes. `delta_changed`
    (`sync.delta`, object_store): the share of bf16 elements a step changes.
    `wire_bytes`: bytes per parameter sent (the engine's float32 master weights; 2 for a
    system that sends bfloat16); `tensors`: the messages of an unpacked collective
    (the model's state-dict tensors unless said); `senders`: trainer ranks that each
    pack their own share of the tensors into buckets, broadcast one after another
    (verl's checkpoint engine): the payload crosses the link once all the same, in
    `senders` × ⌈share / bucket⌉ messages."""
    full = model.params * wire_bytes
    if protocol == "object_store" and delta_changed is not None:
        # workers/sync/delta.py: the trainer casts the version to bf16 in host memory,
        # compares it with the last one sent (both read), and puts the whole version and
        # its changes (6 bytes an element: an int32 index and the value; never more than
        # the element's 2) into the node's shared memory; a caught-up worker pulls the
        # changes. So the trainer moves more host bytes than a whole float32 put (2 + 4 + 2
        # against 4 a parameter) and is blocked longer, as measured (docs/performance.md:
        # 1.2-1.5 s against 0.2-0.3 s at Qwen2.5-0.5B on 2 cores, where the comparison
        # also runs slower than memory); what it saves is the bytes on the link.
        whole = model.params * BF16
        changes = model.params * min(6 * delta_changed, BF16)
        compared = 2 * whole  # the new cast and the last one sent, each read once
        put = (whole + compared + whole + changes) / device.host_bytes_per_s
        hops = math.ceil(math.log2(nodes + 1))
        pull = hops * (changes / link.bytes_per_s + link.latency_s) + changes / device.host_bytes_per_s
        return SyncCost(changes, put, put + pull)
    if protocol == "lora":
        size = model.lora_params(lora_rank) * wire_bytes
        put = size / device.host_bytes_per_s
        # The object store's pull by each node: a broadcast tree of ⌈log2(nodes+1)⌉ hops.
        hops = math.ceil(math.log2(nodes + 1))
        return SyncCost(size, put, put + hops * (size / link.bytes_per_s + link.latency_s))
    if protocol == "collective":
        # A pipelined NCCL broadcast: the payload once over the link, plus a call per
        # bucket (packed) or per tensor.
        share = full / senders
        messages = senders * math.ceil(share / (bucket_mb * 2**20)) if packed else (tensors or model.tensors)
        t = full / link.bytes_per_s + messages * link.latency_s
        return SyncCost(full, t, t)
    if protocol == "object_store":
        put = full / device.host_bytes_per_s  # device → the trainer node's shared memory
        hops = math.ceil(math.log2(nodes + 1))
        pull = hops * (full / link.bytes_per_s + link.latency_s) + full / device.host_bytes_per_s
        return SyncCost(full, put, put + pull)
    if protocol == "filesystem":
        write = full / FILESYSTEM.bytes_per_s + FILESYSTEM.latency_s
        # Every node reads the file; the filesystem's aggregate read scales with clients.
        read = full / FILESYSTEM.bytes_per_s + FILESYSTEM.latency_s
        return SyncCost(full, write, write + read)
    if protocol == "cuda_ipc":
        # One GPU: a handle to the trainer's flat buffer, packed in the engine's bfloat16,
        # copied into the engine's weights.
        packed_bytes = model.params * BF16
        copy = packed_bytes / device.hbm_bytes_per_s
        return SyncCost(packed_bytes, copy, copy)
    raise ValueError(f"sync.protocol {protocol!r} has no cost model")


class Decode(Protocol):
    """What the simulation asks of a generation cost model (`DecodeCost`, or one read
    off a measured run)."""

    def slots(self, mean_completion: float) -> int: ...
    def call(self, lengths: np.ndarray, slots: int) -> CallProfile: ...
    def prefill_seconds(self, tokens: float) -> float: ...
    def load_seconds(self) -> float: ...
    def handoff_seconds(self) -> float: ...


class Train(Protocol):
    def seconds(self, tokens: float, longest: Sequence[float] = ()) -> float: ...
    def overhead_seconds(self) -> float: ...


@dataclass(frozen=True)
class Costs:
    """Everything the simulation pays for: generation, a training step (the tokens it
    trains), a weight sync, and (colocated) switching the GPUs between the pools."""

    decode: Decode
    train: Train
    sync: SyncCost
    switch_s: float = 0.0
