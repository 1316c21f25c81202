"""Keep Routing: the experts a mixture-of-experts model chose for each token at
generation, recorded, carried with the rollout, and replayed in the trainer's forward.

Why: the trainer's router can pick other experts than the inference engine did for the
same token (other kernels, rounding, and in an async run newer weights), so pi/mu would
compare two different sub-networks, which importance sampling cannot repair. Replaying
the generation's top-k selection makes the trainer score the sub-network that sampled
the token, while the gate weights are recomputed from the router's own softmax at the
forced ids, so gradients still reach the router (verl's R3 and slime's routing replay do
the same).

The routers are found the way transformers itself finds them: the module class a
model's `_can_record_outputs["router_logits"]` names (what `output_router_logits`
records). In transformers 5 such a router returns (logits, top-k weights, top-k ids)
and its weights are the top-k of softmax(logits), renormalised over the k where the
router does so (`norm_topk_prob`; Mixtral's always). `Replay` forces the ids and
recomputes the weights the same way; it checks that claim against the router's own
output on the first forward and refuses a router whose weights are made otherwise.

A record is an integer array [tokens, layers, top_k] over the prompt and completion
tokens, `NO_EXPERT` (−1) where a token has none (padding, a token never run through the
model at generation: the last sampled one); replay leaves such tokens to the router's
own choice. `pack` stores each (token, layer)'s top-k as one code of its set
(`packed_bits_per_slot`: 2.5 bits a slot for top-2 of 8 experts, 5.1 for top-8 of 128).
"""

from __future__ import annotations

import base64
import dataclasses
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

NO_EXPERT = -1


def routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's MoE routers in layer order; [] for a dense model. Works through peft's
    and the trainer pool's wrappers (they keep the inner modules)."""
    classes: set[type] = set()
    for module in model.modules():
        recorder = (getattr(type(module), "_can_record_outputs", None) or {}).get("router_logits")
        target = getattr(recorder, "target_class", None)
        if isinstance(target, type):
            classes.add(target)
    if not classes:
        return []
    return [m for m in model.modules() if isinstance(m, tuple(classes))]


def _shape(found: list[torch.nn.Module]) -> tuple[int, int, int]:
    top_k, experts = getattr(found[0], "top_k"), getattr(found[0], "num_experts")  # noqa: B009 (nn.Module's typing)
    return len(found), int(top_k), int(experts)


def router_shape(model: torch.nn.Module) -> tuple[int, int, int] | None:
    """(layers, top_k, experts) of an MoE model, None for a dense one."""
    found = routers(model)
    return _shape(found) if found else None


class _RouterHooks:
    """A forward hook on each of a model's routers (`_hook(layer)` makes it) while
    entered; `layers`, `top_k`, `num_experts` describe the routers."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.routers = routers(model)
        self.layers, self.top_k, self.num_experts = _shape(self.routers) if self.routers else (0, 0, 0)
        self._handles: list = []

    def _hook(self, layer: int):
        raise NotImplementedError

    def __enter__(self):
        for layer, router in enumerate(self.routers):
            self._handles.append(router.register_forward_hook(self._hook(layer)))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


class Recorder(_RouterHooks):
    """Keeps each router's top-k expert ids of every forward while entered; `take`
    returns the last forward's as [layers, rows, top_k] (rows: the forward's batch ×
    positions, flattened as the router sees them)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__(model)
        self._last: list[torch.Tensor | None] = [None] * len(self.routers)

    def _hook(self, layer: int):
        def hook(module, inputs, output):
            self._last[layer] = output[2].detach().to("cpu", torch.int16)

        return hook

    def take(self) -> torch.Tensor:
        if any(t is None for t in self._last):
            raise RuntimeError("Recorder.take: no forward ran through every router since the last take")
        out = torch.stack([t for t in self._last if t is not None])
        self._last = [None] * len(self.routers)
        return out


@dataclass
class Agreement:
    """How often the router's own top-k set equals the replayed one (token × layer
    selections with a record)."""

    agreed: int = 0
    counted: int = 0

    @property
    def share(self) -> float:
        return self.agreed / self.counted if self.counted else float("nan")


class Replay(_RouterHooks):
    """While entered, every router's top-k ids are the forced ones where a record has them
    (`forced`: [batch, positions, layers, top_k], NO_EXPERT elsewhere) and its weights
    are gathered from its own softmax at those ids (renormalised as the router does).
    `agreement` counts, over recorded tokens, the selections the router would have made
    itself. Set `forced` before each forward (`use`)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__(model)
        if not self.routers:
            raise ValueError("correction.keep_routing needs a mixture-of-experts model; this one has no router")
        self.forced: torch.Tensor | None = None
        self.agreement = Agreement()
        self._checked: set[type] = set()

    @contextmanager
    def use(self, forced: torch.Tensor | None) -> Iterator[None]:
        self.forced = forced
        try:
            yield
        finally:
            self.forced = None

    def _hook(self, layer: int):
        def hook(module, inputs, output):
            if self.forced is None:
                return None
            logits, weights, ids = output
            forced = self.forced[:, :, layer].reshape(-1, ids.shape[-1]).to(ids.device)
            if forced.shape != ids.shape:
                raise ValueError(
                    f"routing record covers {forced.shape[0]} tokens but the forward runs {ids.shape[0]}: "
                    "the record and the batch must be laid out alike"
                )
            probs = torch.softmax(logits.float(), dim=-1)
            normalise = bool(getattr(module, "norm_topk_prob", True))
            if type(module) not in self._checked:
                own = probs.gather(-1, ids.long())
                if normalise:
                    own = own / own.sum(-1, keepdim=True)
                if not torch.allclose(own.to(weights.dtype), weights, atol=1e-5, rtol=1e-4):
                    raise ValueError(
                        f"correction.keep_routing: {type(module).__name__} does not weight its experts by the "
                        "top-k of its softmax; replaying its choice would change the model. Turn keep_routing off."
                    )
                self._checked.add(type(module))
            recorded = (forced != NO_EXPERT).all(-1)
            chosen = torch.where(recorded[:, None], forced.long(), ids.long())
            gathered = probs.gather(-1, chosen)
            if normalise:
                gathered = gathered / gathered.sum(-1, keepdim=True)
            with torch.no_grad():
                same = (chosen.sort(-1).values == ids.long().sort(-1).values).all(-1) & recorded
                self.agreement.agreed += int(same.sum())
                self.agreement.counted += int(recorded.sum())
            return logits, gathered.to(weights.dtype), chosen.to(ids.dtype)

        return hook


# ---- the record, compact ------------------------------------------------------------
#
# A (token, layer)'s top-k is stored as a set: its rank among the C(E, k) sets of k of E
# experts (the combinatorial number system), 0 for NO_EXPERT, in ceil(log2(C(E, k) + 1))
# bits. The slots' order is dropped: replay gathers each forced id's weight from the
# router's softmax, slot by slot, and the experts' outputs are summed expert by expert,
# so a permuted top-k gives the same forward. A set comes back in ascending order.


def _binomials(num_experts: int, top_k: int) -> np.ndarray:
    """[num_experts + 1, top_k + 1] uint64: C(n, i)."""
    return np.array([[math.comb(n, i) for i in range(top_k + 1)] for n in range(num_experts + 1)], dtype=np.uint64)


def packed_bits(num_experts: int, top_k: int) -> int:
    """Bits one (token, layer) takes in `pack`: room for every top-k set and NO_EXPERT."""
    return max(1, math.ceil(math.log2(math.comb(num_experts, top_k) + 1)))


def packed_bits_per_slot(num_experts: int, top_k: int) -> float:
    """Bits one (token, layer, slot) takes in `pack` (`packed_bits` over top_k)."""
    return packed_bits(num_experts, top_k) / top_k


def _check_packable(num_experts: int, top_k: int) -> None:
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"a routing record needs 1 ≤ top_k ≤ num_experts (got top_k {top_k}, {num_experts} experts)")
    if packed_bits(num_experts, top_k) > 63:
        raise ValueError(
            f"top-{top_k} of {num_experts} experts has more sets than a 63-bit code holds; "
            "turn correction.keep_routing off for this model"
        )


def pack(record: np.ndarray, num_experts: int) -> bytes:
    """A [tokens, layers, top_k] record (ids in any slot order, NO_EXPERT for a whole
    (token, layer) without one) in `packed_bits` bits a (token, layer)."""
    record = np.asarray(record)
    tokens, layers, top_k = record.shape
    _check_packable(num_experts, top_k)
    flat = record.reshape(-1, top_k).astype(np.int64)
    none = flat == NO_EXPERT
    empty = none.all(-1)
    if (none.any(-1) & ~empty).any():
        raise ValueError("a routing record's (token, layer) holds all top_k experts or none (NO_EXPERT in every slot)")
    chosen = np.sort(flat[~empty], -1)
    if chosen.size and ((chosen[:, 0] < 0) | (chosen[:, -1] >= num_experts)).any():
        raise ValueError(f"a routing record's expert ids lie in [0, {num_experts}) or are NO_EXPERT ({NO_EXPERT})")
    if (np.diff(chosen, axis=-1) == 0).any():
        raise ValueError("a routing record's (token, layer) names each of its top_k experts once")
    binomials = _binomials(num_experts, top_k)
    codes = np.zeros(len(flat), dtype=np.uint64)
    # colex rank of c_1 < … < c_k: Σ C(c_i, i); + 1 keeps 0 for NO_EXPERT
    ranks = binomials[chosen, np.arange(1, top_k + 1)[None, :]].sum(-1, dtype=np.uint64)
    codes[~empty] = ranks + np.uint64(1)
    bits = packed_bits(num_experts, top_k)
    places = np.arange(bits, dtype=np.uint64)
    as_bits = ((codes[:, None] >> places[None, :]) & np.uint64(1)).astype(bool)
    return np.packbits(as_bits.reshape(-1)).tobytes()


def unpack(data: bytes, tokens: int, layers: int, top_k: int, num_experts: int) -> np.ndarray:
    """`pack`'s inverse: [tokens, layers, top_k] int16, NO_EXPERT where none; a set in
    ascending expert order."""
    _check_packable(num_experts, top_k)
    bits = packed_bits(num_experts, top_k)
    count = tokens * layers
    raw = np.unpackbits(np.frombuffer(data, dtype=np.uint8))
    if len(raw) < count * bits:
        raise ValueError(f"a routing record of {tokens} tokens × {layers} layers needs {count * bits} bits")
    as_bits = raw[: count * bits].reshape(count, bits).astype(np.uint64)
    codes = (as_bits << np.arange(bits, dtype=np.uint64)[None, :]).sum(-1, dtype=np.uint64)
    if (codes > np.uint64(math.comb(num_experts, top_k))).any():
        raise ValueError("a routing record holds a code no top-k set has: it was packed for another shape")
    out = np.full((count, top_k), NO_EXPERT, dtype=np.int16)
    has = codes > 0
    rest = codes[has] - np.uint64(1)
    binomials = _binomials(num_experts, top_k)
    for i in range(top_k, 0, -1):
        # the largest c with C(c, i) ≤ rest: C(·, i) is nondecreasing in c
        c = np.searchsorted(binomials[:, i], rest, side="right") - 1
        out[has, i - 1] = c
        rest = rest - binomials[c, i]
    return out.reshape(tokens, layers, top_k)


@dataclass(frozen=True)
class RoutingRecord:
    """One rollout's routing, packed: what `Rollout.expert_routing` holds (the prompt's
    tokens then the completion's)."""

    data: bytes
    tokens: int
    layers: int
    top_k: int
    num_experts: int

    @classmethod
    def of(cls, record: np.ndarray, num_experts: int) -> RoutingRecord:
        tokens, layers, top_k = np.asarray(record).shape
        return cls(pack(record, num_experts), tokens, layers, top_k, num_experts)

    def array(self) -> np.ndarray:
        return unpack(self.data, self.tokens, self.layers, self.top_k, self.num_experts)

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "data": base64.b64encode(self.data).decode("ascii")}

    @classmethod
    def from_json(cls, data: dict) -> RoutingRecord:
        return cls(**{**data, "data": base64.b64decode(data["data"])})

    @property
    def bytes_per_token(self) -> float:
        return len(self.data) / self.tokens if self.tokens else 0.0


def batch_routing(
    records: list[RoutingRecord | None], lengths: list[int], length: int, layers: int, top_k: int
) -> torch.Tensor:
    """Records of right-padded rows (row i `lengths[i]` tokens long) as one [rows, length,
    layers, top_k] tensor, NO_EXPERT past each row's tokens and for a row without a record.
    A record may run past its row (a session decodes a row on after its turn ended)."""
    out = torch.full((len(records), length, layers, top_k), NO_EXPERT, dtype=torch.int16)
    for i, rec in enumerate(records):
        if rec is None:
            continue
        arr = torch.from_numpy(rec.array()[: min(lengths[i], length)].astype(np.int16))
        out[i, : arr.shape[0]] = arr
    return out
