"""The trainer's half of a GPU it shares with a sleeping vLLM (inference.sleep_level,
workers/run/colocation.py): AdamW's moments wait in host memory while vLLM generates and
come back for the step only, and what the step cached returns to the CUDA driver.

Returning the cache matters as much as the moments: PyTorch's caching allocator keeps the
blocks a process freed (the step's activations, the moments' old home) for its own later
use, so without `empty_cache` vLLM's `wake_up` in the other process would find the GPU as
full as during the step.

The host copies go to page-locked (pinned) buffers made once and reused every step: a
copy from pageable memory is staged through a driver buffer and runs at a fraction of the
link's speed, and pinning afresh each step costs more than the copy. The price is host
memory the kernel cannot swap out: 8 bytes per trained parameter (two float32 moments).
"""

from __future__ import annotations

import time

import torch


class OptimizerOffload:
    """Moves `optimizer`'s per-parameter state (AdamW's moments) between its device and
    host buffers kept for the trainer's life. AdamW's step counters stay where they are
    (it keeps them on the CPU). `load_s` / `offload_s` time the last move of each way,
    copies included."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self.host: dict[tuple[int, str], torch.Tensor] = {}
        self.load_s = 0.0
        self.offload_s = 0.0

    def _tensors(self):
        for index, state in enumerate(self.optimizer.state.values()):
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and key != "step":
                    yield (index, key), state, key, value

    def load(self, device: torch.device) -> None:
        """The moments onto `device` for a step (none before the first step: AdamW makes
        them there)."""
        start = time.perf_counter()
        for _, state, key, value in self._tensors():
            state[key] = value.to(device, non_blocking=True)
        _wait(device)
        self.load_s = time.perf_counter() - start

    def offload(self, device: torch.device) -> None:
        """The moments into host memory, then the process's cached GPU blocks back to the
        driver. Call after the step's gradients are dropped (`zero_grad(set_to_none=True)`)."""
        start = time.perf_counter()
        pinned = device.type == "cuda"
        for slot, state, key, value in self._tensors():
            if value.device.type == "cpu":
                continue
            host = self.host.get(slot)
            if host is None or host.shape != value.shape or host.dtype != value.dtype:
                host = torch.empty(value.shape, dtype=value.dtype, pin_memory=pinned)
                self.host[slot] = host
            host.copy_(value, non_blocking=pinned)
            state[key] = host
        _wait(device)  # the copies land before their GPU source can be reused or released
        if device.type == "cuda":
            torch.cuda.empty_cache()
        self.offload_s = time.perf_counter() - start


def _wait(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
