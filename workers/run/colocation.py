"""Colocated placement that time-shares a GPU: the order of one step, and its memory.

With placement.mode 'colocated', inference worker k and trainer rank k share a GPU
(workers/run/placement.py). With inference.sleep_level 0 both stay resident: the GPU must
hold vLLM's share (inference.gpu_memory_utilization) and the trainer's peak at once.
With 1 or 2 they take turns, through vLLM's `sleep(level)` / `wake_up(tags)`:

    generate                  vLLM awake; the trainer holds its weights only
    sleep(level)              vLLM frees the GPU: level 1 copies its weights to host
                              memory and drops the KV cache, level 2 drops both
    load optimizer state      the trainer brings its AdamW moments and gradients back
    train                     one optimizer step
    offload optimizer state   ... and sends them back to host memory
    wake_up(["weights"])      vLLM's weight memory returns (level 1: the old weights,
                              level 2: uninitialised until the update fills it)
    update_weights            the step's weight sync
    wake_up(["kv_cache"])     the KV cache last, so the sync never shares the GPU with it

Waking the weights before the KV cache keeps the sync's transient buffers and the KV
cache off the GPU at the same time (vLLM's own RL examples and verl wake in this order).
Level 2's weights come only from the sync, so every step must carry a full-weight one.

The calls are made by `VLLMBackend.sleep` / `wake_up` (workers/inference/vllm_backend.py)
from the inference worker's loop (workers/run/inference_worker.py) and by `Trainer.train_rank`
(`OptimizerOffload`, workers/train/offload.py). The trainer's step begins only once every
inference worker says its vLLM sleeps (`InferenceWorker.wait_asleep`, asked by the trainer
actor's loop, workers/run/trainer_actors.py); this module says their order.

Admission (workers/run/admission.py) plans one shared GPU as `peak`: the larger of the two
phases when vLLM sleeps, their sum when it does not. Everything here is pure: no vLLM,
no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Pool = Literal["inference", "trainer"]


@dataclass(frozen=True)
class Phase:
    """One call of a colocated step: which pool makes it, vLLM's or the trainer's name
    for it, and its arguments."""

    pool: Pool
    call: str
    args: tuple = ()


# What the trainer sends to host memory while vLLM generates: it needs them only for its step.
OFFLOADED = ("optimizer state", "gradients")


def step_phases(level: int) -> list[Phase]:
    """The calls of one colocated training step, from one generation to the next
    (module doc). Level 0: nothing sleeps, the trainer trains beside resident vLLM."""
    if level not in (0, 1, 2):
        raise ValueError(f"inference.sleep_level must be 0, 1 or 2 (got {level})")
    if level == 0:
        return [Phase("inference", "generate"), Phase("trainer", "train"), Phase("inference", "update_weights")]
    return [
        Phase("inference", "generate"),
        Phase("inference", "sleep", (level,)),
        Phase("trainer", "load", OFFLOADED),
        Phase("trainer", "train"),
        Phase("trainer", "offload", OFFLOADED),
        Phase("inference", "wake_up", (("weights",),)),
        Phase("inference", "update_weights"),
        Phase("inference", "wake_up", (("kv_cache",),)),
    ]


@dataclass(frozen=True)
class SharedGpu:
    """Bytes one shared GPU holds in each phase, and the figure admission plans for."""

    generating: int  # vLLM awake + the trainer's resident part
    training: int  # the trainer's peak + what a sleeping vLLM keeps
    peak: int


def shared_gpu(level: int, vllm_awake: int, vllm_asleep: int, trainer_peak: int, trainer_resident: int) -> SharedGpu:
    """The peak of one GPU shared by a vLLM engine (`vllm_awake` bytes when generating,
    `vllm_asleep` when sleeping: its CUDA context) and a trainer rank (`trainer_peak` at its
    step; between steps `trainer_resident`: its weights, with its optimizer state and
    gradients offloaded and no activations). Level 0: vLLM's share and the trainer's peak
    at once, their sum; 1 or 2: the larger of the two phases."""
    if level == 0:
        both = vllm_awake + trainer_peak
        return SharedGpu(both, both, both)
    generating = vllm_awake + trainer_resident
    training = trainer_peak + vllm_asleep
    return SharedGpu(generating, training, max(generating, training))
