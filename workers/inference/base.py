"""One interface for every inference backend (vLLM, torch reference)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    import torch

    from workers.core.routing import RoutingRecord
    from workers.core.sampling_mask import Kept
    from workers.model.loading import ModelDims

# Sequences one vLLM engine decodes together (its max_num_seqs): 16 prompts x 8 samples
# = 128 is the default run's batch; more only costs KV-cache memory. Admission sizes a
# vLLM inference worker's KV cache by it, so it lives here, where the web process reads
# it without torch.
VLLM_MAX_NUM_SEQS = 256
# vLLM-CPU's KV blocks are 128 tokens; a sequence always holds whole blocks.
VLLM_CPU_BLOCK_SIZE = 128


def vllm_cpu_kv_cache_bytes(dims: ModelDims, max_model_len: int, max_num_seqs: int = VLLM_MAX_NUM_SEQS) -> int:
    """The KV cache a vLLM-CPU engine reserves: `max_num_seqs` sequences of
    `max_model_len` tokens (float32), no more (and at least 16 MiB).

    On CPU `gpu_memory_utilization` would reserve a fraction of the NUMA node's RAM
    (GiBs); a tiny model needs kilobytes per token, and several engines share a box.
    Admission counts the same bytes."""
    blocks_per_seq = -(-max_model_len // VLLM_CPU_BLOCK_SIZE)
    needed = dims.kv_bytes_per_token * blocks_per_seq * VLLM_CPU_BLOCK_SIZE * max_num_seqs
    return max(needed + needed // 4, 16 * 2**20)


# Keep Routing on vLLM: its V2 model runner alone returns routed experts, and it needs
# Triton, which vLLM-CPU lacks (workers/inference/vllm_backend.py
# `routed_experts_engine_args`). Here, torch-free, for admission in the web process too.
ROUTED_EXPERTS_ON_CPU = (
    "correction.keep_routing on the vLLM backend needs vLLM's V2 model runner (it alone returns routed "
    "experts), which needs Triton; vLLM-CPU has none: set inference.backend to 'torch' on the CPU, or "
    "correction.keep_routing to false"
)


# What the rows running on an engine do while its weights change, in vLLM's words
# (vllm.v1.engine.PauseMode, `AsyncLLM.pause_generation`'s `mode`): "wait" for them to
# finish, "abort" them, or "keep" them frozen and continue them after the update. Here,
# not imported from vLLM: the torch backends and the web process run without it.
PauseMode = Literal["wait", "abort", "keep"]


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[float]  # log-prob of each sampled token under the sampling policy
    finish_reason: str  # "stop" | "length"
    # The experts an MoE model chose for the prompt's and the completion's tokens
    # (workers.core.routing.RoutingRecord), when the backend records them.
    routing: RoutingRecord | None = None
    # Per token, its kept set under top-k / top-p / min-p (workers.core.sampling_mask.Kept)
    # or None where none was recorded; empty from a backend that records none.
    kept: list[Kept | None] = field(default_factory=list)
    # Per token, the policy version of the weights that sampled it as the engine itself
    # labelled them (`InferenceBackend.label_weights`); empty from a backend that keeps no
    # labels, where the caller's own version stands.
    versions: list[int] = field(default_factory=list)


@dataclass
class StepToken:
    """One token a `DecodeSession.step` produced for one row."""

    row: int
    token: int
    logprob: float
    finish_reason: str | None  # "stop" | "length" when this token ends the row, else None
    kept: Kept | None = None  # the set it was drawn from, when the backend records it


class DecodeSession(Protocol):
    """Generation one decode step at a time, so weights can change between two steps
    (workers/rollout/partial_rollouts.py: the abort and in-flight update modes).

    Rows are the prompts given to `start`, one sequence each. Each `step` runs the model
    once with the weights loaded *now* and samples the next token of every unfinished
    row: a token's logits come entirely from the weights live at its step. KV already
    computed stays as it was (stale KV after an in-flight update, as in PipelineRL)."""

    def step(self) -> list[StepToken]: ...

    def unfinished(self) -> list[int]:
        """Rows still generating."""
        ...

    def routing(self, row: int) -> RoutingRecord | None:
        """The experts chosen for `row`'s prompt and completion tokens run so far (an MoE
        model on a backend that records them), else None."""
        ...

    def close(self) -> None:
        """Abort the unfinished rows and free the session's memory."""
        ...


class InferenceBackend(Protocol):
    """Generates completions with per-token logprobs and takes new weights.

    `generate` returns, for each prompt, `n` completions (prompt-major order). Sampling is
    temperature sampling, cut by the top-k / top-p / min-p the backend was built with
    (`inference.top_k` …; none by default), stopping at `eos_id` or `max_new_tokens`.
    """

    def generate(
        self, prompts: list[list[int]], n: int, max_new_tokens: int, temperature: float, seed: int
    ) -> list[list[Completion]]: ...

    def start(
        self,
        prompts: list[list[int]],
        max_new_tokens: list[int],
        temperature: float,
        seed: int,
        n: int = 1,
    ) -> DecodeSession:
        """A stepped generation of `n` sequences per prompt: rows prompt-major (row
        i·n + j is sample j of prompt i), prompt i with budget `max_new_tokens[i]`."""
        ...

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Full reload: replace every weight with the trainer's (checkpoint-format names)."""
        ...

    def label_weights(self, version: int) -> None:
        """Say that the weights loaded now are policy `version` (after every sync), for a
        backend that stamps its outputs with it (`Completion.versions`)."""
        ...

    def close(self) -> None: ...
