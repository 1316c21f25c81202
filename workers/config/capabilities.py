"""Which fields take effect in which runs: the capability matrix.

Most fields of a RunConfig are read by every run. The ones here are read only where a
backend or a stage reads them: vLLM's engine arguments and a tensor-parallel split by
vLLM alone, a chunk size by the pipelined reward stage alone, a verifier's cost by reward
workers alone. Set where nothing reads them, they would parse cleanly and do nothing, so
a launch that sets one there is refused (workers/run/admission.py `engine_errors`),
naming the field and what would read it. docs/config.md holds the table (`markdown`),
written with the rest of the reference.

A field is "set" when it differs from its default: null for vLLM's knobs (null takes the
engine's default for the device), 1 for the split, 0 for a size or a cost. A field whose
default is a value that some runs do not read (`inference.gpu_memory_utilization` 0.3,
read by vLLM on a GPU only; `sync.packed` true, read by a collective only) cannot be told
set from defaulted in a stored config, so it is not here; its description says where it
applies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from workers.config.run_config import RunConfig

# InferenceConfig's fields that are vLLM's engine arguments (null: the default per device).
VLLM_ENGINE_KNOBS = (
    "enforce_eager",
    "max_num_seqs",
    "max_num_batched_tokens",
    "enable_prefix_caching",
    "enable_chunked_prefill",
)


@dataclass(frozen=True)
class Capability:
    """`field` (dotted) is read only where `honoured(cfg)`; `is_set(cfg)` says whether a
    config sets it; `reader` names what reads it, `instead(cfg)` what the run uses
    instead, `fix` how to stop setting it."""

    field: str
    reader: str
    fix: str
    is_set: Callable[[RunConfig], bool]
    honoured: Callable[[RunConfig], bool]
    instead: Callable[[RunConfig], str]

    def refusal(self, cfg: RunConfig) -> str | None:
        """The sentence refusing `cfg`, or None where the field is unset or read."""
        if not self.is_set(cfg) or self.honoured(cfg):
            return None
        return f"{self.field} is read only by {self.reader}, and {self.instead(cfg)}: {self.fix}"


def _vllm(cfg: RunConfig) -> bool:
    return cfg.inference.backend == "vllm"


def _backend(cfg: RunConfig) -> str:
    return f"this run's inference.backend is {cfg.inference.backend!r}"


def _knob(name: str) -> Capability:
    return Capability(
        field=f"inference.{name}",
        reader="vLLM's engine (inference.backend 'vllm')",
        fix=f"set inference.backend to 'vllm', or inference.{name} to null",
        is_set=lambda cfg: getattr(cfg.inference, name) is not None,
        honoured=_vllm,
        instead=_backend,
    )


CAPABILITIES: tuple[Capability, ...] = (
    *(_knob(name) for name in VLLM_ENGINE_KNOBS),
    Capability(
        field="inference.tensor_parallel_size",
        reader="vLLM (inference.backend 'vllm'), which splits a worker's model over several devices",
        fix="set inference.backend to 'vllm', or tensor_parallel_size to 1 and raise inference.num_workers instead",
        is_set=lambda cfg: cfg.inference.tensor_parallel_size > 1,
        honoured=_vllm,
        instead=_backend,
    ),
    Capability(
        field="rewards.chunk_tokens",
        reader="the pipelined reward stage (rewards.mode 'pipelined'), which streams completions in chunks",
        fix="set rewards.mode to 'pipelined' (with rewards.workers ≥ 1), or rewards.chunk_tokens to 0",
        is_set=lambda cfg: cfg.rewards.chunk_tokens > 0,
        honoured=lambda cfg: cfg.rewards.mode == "pipelined",
        instead=lambda cfg: f"this run's rewards.mode is {cfg.rewards.mode!r}",
    ),
    Capability(
        field="rewards.verifier_cost_ms_per_token",
        reader="reward workers scoring with the verifier (rewards.workers ≥ 1, rewards.scorer 'verifier')",
        fix="set rewards.workers ≥ 1 with rewards.scorer 'verifier', or rewards.verifier_cost_ms_per_token to 0",
        is_set=lambda cfg: cfg.rewards.verifier_cost_ms_per_token > 0,
        honoured=lambda cfg: cfg.rewards.workers >= 1 and cfg.rewards.scorer == "verifier",
        instead=lambda cfg: (
            "this run's inference workers score their own groups (rewards.workers 0)"
            if cfg.rewards.workers == 0
            else f"this run's rewards.scorer is {cfg.rewards.scorer!r}"
        ),
    ),
)


def ignored(cfg: RunConfig) -> dict[str, str]:
    """{dotted field: refusal} for each field `cfg` sets where nothing reads it."""
    return {c.field: sentence for c in CAPABILITIES if (sentence := c.refusal(cfg)) is not None}


def markdown() -> str:
    """The table docs/config.md holds: each field, what reads it, and the way out."""
    rows = [
        "| field | read only by | otherwise |",
        "|---|---|---|",
        *(f"| [`{c.field}`](#{c.field.split('.')[0]}) | {c.reader} | {c.fix} |" for c in CAPABILITIES),
    ]
    return "\n".join(rows) + "\n"
