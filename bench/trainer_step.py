"""Where one trainer step's time goes, with each distinct prompt run once and without.

The workload is bench/peer_trl.py's batch: the tiny Qwen2 it trains (hidden 128, two
layers, a 261-token vocabulary), B=8 prompts × G=8 completions, prompts of 88 tokens
(the copy task's 64 characters in ChatML), completions mostly 65 tokens (64 + EOS), a
fifth shorter. Random tokens and rewards: the cost of a step does not depend on them.

Each side is a `Trainer` of the `async` preset on one torch thread (as a run's trainer
actor has it), warmed up for 3 steps, then timed over `--steps`; the padded side is the
same trainer with `share_prompts` off (workers/train/shared_prefix.py). Times are this
process's CPU time, not wall time, so other jobs on a shared host change them less.
Printed per side: the step and its phases (model forward and backward, the chunked
logprob + entropy forward and backward, the loss, clipping + AdamW, packing the rows),
and how many token positions the model runs against how many tokens the batch has.

    .venv/bin/python bench/trainer_step.py              # both sides, 6 steps each (~1 min)
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time

import torch

import workers.model.logprobs as logprobs_module
import workers.train.trainer as trainer_module
from workers.config.presets import build
from workers.config.run_config import TaskConfig
from workers.core.records import Group, Rollout
from workers.model.tiny_hf import make_tiny_checkpoint

TASK = {"name": "copy", "min_len": 64, "max_len": 64, "reward": "position"}
B, G, PROMPT, COMPLETION, MAX_NEW = 8, 8, 88, 65, 72
VOCAB = 261


def groups(rng: random.Random, version: int) -> list[Group]:
    out = []
    for g in range(B):
        prompt = [rng.randrange(5, VOCAB) for _ in range(PROMPT)]
        rollouts = []
        for _ in range(G):
            n = COMPLETION if rng.random() < 0.8 else rng.randrange(20, MAX_NEW + 1)
            rollouts.append(
                Rollout(
                    prompt,
                    [rng.randrange(5, VOCAB) for _ in range(n)],
                    [-3 * rng.random() for _ in range(n)],
                    [version] * n,
                    "stop",
                    reward=rng.random(),
                    group_id=f"{version}-{g}",
                )
            )
        out.append(Group(group_id=f"{version}-{g}", prompt="", answer="", rollouts=rollouts))
    return out


class PhaseClock:
    """CPU seconds spent inside each wrapped function, by label."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def wrap(self, owner, name: str, label: str, static: bool = False) -> None:
        inner = getattr(owner, name)

        def timed(*args, **kwargs):
            t = time.process_time()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds[label] = self.seconds.get(label, 0.0) + time.process_time() - t

        setattr(owner, name, staticmethod(timed) if static else timed)


def measure(model_dir: str, share: bool, steps: int, clock: PhaseClock) -> dict[str, float]:
    cfg = build(
        "async",
        {
            "model": {"source": "path", "path": model_dir},
            "task": TASK,
            "trainer": {"batch_groups": B, "group_size": G, "lr": 3e-4},
            "inference": {"max_new_tokens": MAX_NEW},
        },
    )
    trainer = trainer_module.Trainer(cfg, model_dir, num_threads=1)
    trainer.share_prompts = trainer.share_prompts and share
    clock.wrap(trainer.optimizer, "step", "optimizer")
    rng = random.Random(0)
    for v in range(3):
        trainer.train_step(groups(rng, v))
    clock.seconds.clear()
    total = 0.0
    for v in range(steps):
        batch = groups(rng, 10 + v)
        t = time.process_time()
        trainer.train_step(batch)
        total += time.process_time() - t
    ms = {k: 1e3 * s / steps for k, s in clock.seconds.items()}
    phases = {
        "model forward": ms.get("pass", 0) - ms.get("logprob fwd", 0),
        "logprob + entropy forward": ms.get("logprob fwd", 0),
        "model backward": ms.get("backward", 0) - ms.get("logprob bwd", 0),
        "logprob + entropy backward": ms.get("logprob bwd", 0),
        "loss (PPO-clip, TIS, statistics)": ms.get("loss", 0),
        "clip + AdamW": ms.get("optimizer", 0),
        "pack rows": ms.get("pack", 0),
    }
    phases["rest"] = 1e3 * total / steps - sum(phases.values())
    phases["step"] = 1e3 * total / steps
    return phases


def positions(share: bool, rng: random.Random) -> tuple[int, int]:
    """(token positions the model runs, real tokens) for one batch."""
    rollouts = [r for g in groups(rng, 0) for r in g.rollouts]
    real = sum(len(r.prompt_ids) + len(r.completion_ids) for r in rollouts)
    if not share:
        return len(rollouts) * max(len(r.prompt_ids) + len(r.completion_ids) for r in rollouts), real
    prefixes = B * (PROMPT - 1)
    return prefixes + len(rollouts) * max(len(r.completion_ids) for r in rollouts), real


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=6, help="timed steps per side (after 3 warm-up steps)")
    args = ap.parse_args(argv)
    clock = PhaseClock()
    clock.wrap(trainer_module, "token_logprobs", "pass")
    clock.wrap(trainer_module, "chosen_logprobs", "logprob fwd")
    clock.wrap(logprobs_module._ChosenLogprob, "backward", "logprob bwd", static=True)
    clock.wrap(trainer_module, "correction_loss", "loss")
    clock.wrap(trainer_module.Trainer, "_rank_rows", "pack")
    clock.wrap(torch.nn.utils, "clip_grad_norm_", "optimizer")
    clock.wrap(torch.Tensor, "backward", "backward")
    with tempfile.TemporaryDirectory(prefix="trainer-step-") as tmp:
        model_dir = make_tiny_checkpoint(
            os.path.join(tmp, "qwen2"),
            "qwen2",
            task=TaskConfig(**TASK),
            vocab_size=VOCAB,
            max_position_embeddings=PROMPT + MAX_NEW,
        )
        sides = {
            name: measure(model_dir, share, args.steps, clock)
            for name, share in (("padded", False), ("shared prompts", True))
        }
    print(f"B={B} × G={G}, prompt {PROMPT} tokens, completions ≤ {MAX_NEW}; 1 torch thread; CPU ms per step")
    print(f"load average (1 min) {os.getloadavg()[0]:.1f}")
    print("| phase | " + " | ".join(sides) + " |")
    print("|---|" + "---:|" * len(sides))
    for phase in sides["padded"]:
        cells = [f"{s[phase]:.0f} ({s[phase] / s['step']:.0%})" for s in sides.values()]
        print(f"| {phase} | " + " | ".join(cells) + " |")
    for name, share in (("padded", False), ("shared prompts", True)):
        run, real = positions(share, random.Random(0))
        print(f"{name}: the model runs {run} token positions for {real} tokens")
    print(f"step: {sides['padded']['step'] / sides['shared prompts']['step']:.2f}× less CPU time with shared prompts")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
