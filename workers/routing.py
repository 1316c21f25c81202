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
own choice. `pack` stores it in fewer bits than a byte per slot where the expert count
allows (`packed_bits_per_slot`).
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


def packed_bits_per_slot(num_experts: int, top_k: int) -> float:
    """Bits one (token, layer, slot) takes in `pack`: the smaller of a bit per expert per
    (token, layer) (the chosen set, order dropped: the weights are recomputed anyway) and
    ceil(log2(experts + 1)) bits per id (room for NO_EXPERT)."""
    return min(num_experts / top_k, math.ceil(math.log2(num_experts + 1)))


def pack(record: np.ndarray, num_experts: int) -> bytes:
    """A [tokens, layers, top_k] record in `packed_bits_per_slot` bits a slot."""
    record = np.asarray(record)
    tokens, layers, top_k = record.shape
    if num_experts / top_k <= math.ceil(math.log2(num_experts + 1)):
        # A set of experts per (token, layer); an empty set is NO_EXPERT (a real
        # selection always holds top_k of them).
        sets = np.zeros((tokens, layers, num_experts), dtype=bool)
        t, la, s = np.nonzero(record != NO_EXPERT)
        sets[t, la, record[t, la, s]] = True
        return np.packbits(sets.reshape(-1)).tobytes()
    bits = math.ceil(math.log2(num_experts + 1))
    shifted = (record.reshape(-1).astype(np.int64) + 1).astype(np.uint64)  # NO_EXPERT → 0
    places = np.arange(bits, dtype=np.uint64)
    as_bits = ((shifted[:, None] >> places[None, :]) & 1).astype(bool)
    return np.packbits(as_bits.reshape(-1)).tobytes()


def unpack(data: bytes, tokens: int, layers: int, top_k: int, num_experts: int) -> np.ndarray:
    """`pack`'s inverse: [tokens, layers, top_k] int16, NO_EXPERT where none. A set comes
    back in ascending expert order (the order of a top-k never mattered)."""
    raw = np.unpackbits(np.frombuffer(data, dtype=np.uint8))
    if num_experts / top_k <= math.ceil(math.log2(num_experts + 1)):
        sets = raw[: tokens * layers * num_experts].reshape(tokens, layers, num_experts).astype(bool)
        out = np.full((tokens, layers, top_k), NO_EXPERT, dtype=np.int16)
        has = sets.any(-1)
        # Each non-empty set has exactly top_k members: their ids in ascending order.
        ids = np.nonzero(sets[has])[1].reshape(-1, top_k)
        out[has] = ids
        return out
    bits = math.ceil(math.log2(num_experts + 1))
    slots = tokens * layers * top_k
    as_bits = raw[: slots * bits].reshape(slots, bits).astype(np.int64)
    values = (as_bits << np.arange(bits, dtype=np.int64)[None, :]).sum(-1) - 1
    return values.reshape(tokens, layers, top_k).astype(np.int16)


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
