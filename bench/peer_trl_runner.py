"""TRL's GRPOTrainer on one JSON spec, timed per step: the TRL side of bench/peer_trl.py.

Runs in a virtual environment of its own (TRL and the transformers it is pinned with),
never in the project's. The `copy` task's reward is written out again below (`reward`),
and tests/test_bench_scripts.py checks it against `workers.rl_tasks` on random strings;
the learning benchmark's tasks (`task` in the spec: countdown, gsm8k) are scored by the
project's own verifiers (workers/rl_tasks, pure Python on pydantic, which TRL's venv has
as a dependency of its own), so both sides reward a completion with the same code. trl
is imported inside `main` only, so the project's venv can import this module for that
test.

    python bench/peer_trl_runner.py SPEC.json OUT.json

SPEC: model_dir, prompts ([{"prompt": text, "answer": text}] in training order), reward
("exact" | "prefix" | "position"), batch_groups, group_size, max_new_tokens, temperature,
lr, clip_eps, max_grad_norm, seed, steps, max_minutes, work_dir; optional threads (torch's
intra-op threads; absent: torch's default, one per core); optional precision ("fp32": bf16
and fp16 off; absent: GRPOConfig's default, bf16 mixed precision, which on the CPU is
accelerate's bf16 autocast around the model's forward, in generation as in training);
optional task ({"name", "options"}: a built-in task of workers/rl_tasks whose reward
replaces `reward`); optional save_every and save_dir (the policy, with its tokenizer,
written to save_dir/step-K every save_every steps and after the last, for the held-out
eval the caller runs on them).

OUT: per step (1-based) its end time from the start of training, the batch's mean reward,
its completion tokens (EOS included, as Rollway counts them), and the seconds spent in
generation proper (`model.generate`, via GRPOTrainer._generate_single_turn), in the whole
rollout (generation + decoding + reward + advantages: _generate_and_score_completions)
and in the whole step (rollout + forward/backward + optimizer step); plus the first
prompt's token ids, to check that both sides feed the model the same input.
"""

from __future__ import annotations

import json
import os
import sys
import time
from types import SimpleNamespace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def reward(completion: str, answer: str, kind: str) -> float:
    """workers.rl_tasks.ReverseTask.reward, the same rule: partial credit over the longer
    of completion and answer (`prefix`: the correct prefix; `position`: every matching
    position; `exact`: all or nothing)."""
    denom = max(len(completion), len(answer))
    if denom == 0:
        return 1.0
    if kind == "exact":
        return 1.0 if completion == answer else 0.0
    if kind == "prefix":
        hits = next(
            (i for i, (a, b) in enumerate(zip(completion, answer, strict=False)) if a != b),
            min(len(completion), len(answer)),
        )
    elif kind == "position":
        hits = sum(a == b for a, b in zip(completion, answer, strict=False))
    else:
        raise ValueError(f"unknown reward {kind!r}")
    return hits / denom


def project_reward(task: dict):
    """The reward of the project's built-in task `task["name"]` with `task["options"]`:
    workers/rl_tasks imported from the checkout this script lies in."""
    sys.path.insert(0, ROOT)
    from workers.rl_tasks import task_class

    return task_class(task["name"])(SimpleNamespace(options=task.get("options", {}))).reward


def _timed(fn, seconds: list[float], after=None):
    """`fn` that appends each call's wall time to `seconds` (and hands its result to `after`)."""

    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        out = fn(*args, **kwargs)
        seconds.append(time.perf_counter() - t)
        if after is not None:
            after(out)
        return out

    return wrapper


def main(spec_path: str, out_path: str) -> int:
    with open(spec_path) as f:
        spec = json.load(f)
    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    B, G = spec["batch_groups"], spec["group_size"]
    tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"])
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32)
    dataset = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": p["prompt"]}], "answer": p["answer"]} for p in spec["prompts"]]
    )
    batch_rewards: list[list[float]] = []
    score = project_reward(spec["task"]) if spec.get("task") else (lambda c, a: reward(c, a, spec["reward"]))

    def task_reward(prompts, completions, answer, **kwargs) -> list[float]:
        # Conversational prompts: each completion is [{"role": "assistant", "content": text}],
        # the text decoded up to the first EOS without special tokens (as Rollway decodes).
        scores = [score(c[0]["content"], a) for c, a in zip(completions, answer, strict=True)]
        batch_rewards.append(scores)
        return scores

    args = GRPOConfig(
        output_dir=os.path.join(spec["work_dir"], "trl-out"),
        # One generation of B prompts × G completions and one optimizer step on all of
        # them per step, as Rollway's trainer step.
        per_device_train_batch_size=B * G,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_generations=G,
        num_iterations=1,
        max_completion_length=spec["max_new_tokens"],
        temperature=spec["temperature"],
        top_p=1.0,
        top_k=0,
        learning_rate=spec["lr"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=spec["max_grad_norm"],
        beta=0.0,
        epsilon=spec["clip_eps"],
        loss_type="bnpo",  # token mean over the batch: Rollway's aggregation
        scale_rewards="group",
        shuffle_dataset=False,  # prompts in the order Rollway's inference worker draws them
        max_steps=spec["steps"],
        seed=spec["seed"],
        use_cpu=True,
        **precision_args(spec),
        gradient_checkpointing=False,
        disable_dropout=True,  # as Rollway's trainer.disable_dropout default
        use_vllm=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        log_completions=False,
        dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(
        model=model, reward_funcs=task_reward, args=args, train_dataset=dataset, processing_class=tokenizer
    )
    gen_s: list[float] = []
    rollout_s: list[float] = []
    tokens: list[int] = []
    trainer._generate_single_turn = _timed(
        trainer._generate_single_turn, gen_s, after=lambda out: tokens.append(sum(len(c) for c in out[0]))
    )
    trainer._generate_and_score_completions = _timed(trainer._generate_and_score_completions, rollout_s)
    steps: list[dict] = []
    clock: dict[str, float] = {}
    limit_s = spec["max_minutes"] * 60
    saved: list[int] = []

    def save(step: int) -> None:
        # Outside the timed training: a step's end time is taken before it.
        path = os.path.join(spec["save_dir"], f"step-{step}")
        trainer.model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        saved.append(step)

    class StepTimes(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            clock["start"] = time.perf_counter()

        def on_step_begin(self, args, state, control, **kwargs):
            clock["step"] = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            now = time.perf_counter()
            scores = batch_rewards[-1]
            steps.append(
                {
                    "step": state.global_step,
                    "t": now - clock["start"],
                    "reward": sum(scores) / len(scores),
                    "tokens": tokens[-1],
                    "gen_s": gen_s[-1],
                    "rollout_s": rollout_s[-1],
                    "step_s": now - clock["step"],
                }
            )
            if now - clock["start"] >= limit_s:
                control.should_training_stop = True
            every = spec.get("save_every")
            if every and (state.global_step % every == 0 or state.global_step >= spec["steps"]):
                t = time.perf_counter()
                save(state.global_step)
                clock["start"] += time.perf_counter() - t  # saving is not training time

    trainer.add_callback(StepTimes())
    first_prompt_ids, _, _ = trainer._tokenize_prompts([dataset[0]["prompt"]])
    t = time.perf_counter()
    trainer.train()
    if spec.get("save_every") and (not saved or saved[-1] != len(steps)):
        save(len(steps))  # stopped by max_minutes between two saves
    out = {
        "saved": saved,
        "steps": steps,
        "train_s": time.perf_counter() - t,
        "first_prompt_ids": [int(i) for i in first_prompt_ids[0]],
        "threads": torch.get_num_threads(),
        # What the Trainer ran with (its accelerator's mixed precision), not what was asked.
        "precision": str(trainer.accelerator.mixed_precision),
        "versions": {"trl": trl.__version__, "torch": torch.__version__, "transformers": _version("transformers")},
    }
    with open(out_path, "w") as f:
        json.dump(out, f)
    return 0


def precision_args(spec: dict) -> dict:
    """GRPOConfig's precision arguments: none (its own default, bf16 mixed precision: bf16
    unless fp16 is set) unless the spec asks for float32."""
    precision = spec.get("precision")
    if precision not in (None, "fp32"):
        raise SystemExit(f"spec precision must be absent (TRL's default) or 'fp32' (got {precision!r})")
    return {"bf16": False, "fp16": False} if precision == "fp32" else {}


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: peer_trl_runner.py SPEC.json OUT.json")
    raise SystemExit(main(sys.argv[1], sys.argv[2]))
