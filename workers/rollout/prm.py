"""Reward models as the reward stage runs them (rewards.scorer 'model').

A reward model is a Hugging Face directory loaded through transformers' own classes:
`AutoModelForTokenClassification` when its config names a token-classification
architecture (a process reward model: a score at every token, read at the end of each
step), `AutoModelForSequenceClassification` otherwise (an outcome reward model, read at
the last token). Its score of a text is the probability of its last label (the "good"
one), or a sigmoid of a single logit.

    python -m workers.rollout.prm DIR [--steps 400] [--seed 0]    # the small countdown PRM below
"""

from __future__ import annotations

import argparse
import random
import re
from typing import Any

from workers.config.run_config import TaskConfig
from workers.core.hub import is_repo_id
from workers.model.tiny_hf import train_tokenizer
from workers.rl_tasks.countdown import parse_problem


def load_reward_model(path: str) -> tuple[Any, Any]:
    """(model in eval mode, tokenizer) of the reward model at `path`: a local directory
    (absolute, confined by workers/run/paths.py) or a Hub id, downloaded from the Hub into
    its cache first, so that no directory of that relative name is read instead."""
    if not path.startswith(("/", "~")) and is_repo_id(path):
        from huggingface_hub import snapshot_download

        path = snapshot_download(path)
    from transformers import (
        AutoConfig,
        AutoModelForSequenceClassification,
        AutoModelForTokenClassification,
        AutoTokenizer,
    )

    config = AutoConfig.from_pretrained(path)
    token_level = any(a.endswith("ForTokenClassification") for a in (config.architectures or []))
    auto = AutoModelForTokenClassification if token_level else AutoModelForSequenceClassification
    model = auto.from_pretrained(path)
    model.eval()
    return model, AutoTokenizer.from_pretrained(path)


def last_token_scores(model: Any, tokenizer: Any, texts: list[str]) -> list[float]:
    """Each text's score: the model's probability of "good" at its last token."""
    import torch

    scores = []
    with torch.inference_mode():
        for text in texts:
            ids = tokenizer(text, return_tensors="pt")["input_ids"]
            if ids.shape[1] == 0:
                ids = torch.tensor([[tokenizer.bos_token_id or tokenizer.eos_token_id or 0]])
            logits = model(input_ids=ids.to(model.device)).logits
            last = logits[0, -1] if logits.dim() == 3 else logits[0]
            prob = torch.sigmoid(last[0]) if last.numel() == 1 else torch.softmax(last.float(), -1)[-1]
            scores.append(float(prob))
    return scores


# -- a small process reward model, made here ------------------------------------------
#
# Nothing can be downloaded on the project's machines, so the PRM the tests and benches
# score with is trained here, briefly, on countdown solutions written one step a line
# ("3+5=8\n8*2=16\n"), each step labelled by a step verifier: good while every step so
# far uses numbers still available and computes its result right, bad from the first
# step that does not on (the "first error" labels of process-supervision data sets).

# Numbers of the problems the PRM learns on: small enough that a tiny model can learn
# to check the arithmetic in a few hundred steps.
PRM_NUMBERS = range(1, 10)
PRM_OPS = ("+", "-", "*")


def countdown_trace(rng: random.Random, steps: int = 3) -> tuple[str, str, list[str]]:
    """(prompt, answer, step lines) of a countdown problem in the task's format
    ("3 5 7 2:16=", answer "3 5 7 2:16") and a solution, its steps corrupted half the
    time at a random step: a wrong result or a number that is not available."""
    numbers = [rng.choice(PRM_NUMBERS) for _ in range(steps + 1)]
    pool, lines = list(numbers), []
    bad_at = rng.randrange(steps) if rng.random() < 0.5 else None
    for k in range(steps):
        a = pool.pop(rng.randrange(len(pool)))
        b = pool.pop(rng.randrange(len(pool)))
        op = rng.choice(PRM_OPS)
        c = _apply(a, op, b)
        if k == bad_at:
            if rng.random() < 0.5:
                c += rng.choice((-3, -2, -1, 1, 2, 3))
            else:
                a = rng.choice([n for n in range(1, 30) if n not in pool and n != b] or [99])
                c = _apply(a, op, b)
        lines.append(f"{a}{op}{b}={c}")
        pool.append(c)
    target = pool[-1]
    answer = f"{' '.join(map(str, numbers))}:{target}"
    return f"{answer}=", answer, lines


def _apply(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def step_labels(answer: str, lines: list[str]) -> list[int]:
    """The step verifier: per line "a op b=c", 1 while every step so far takes two
    available numbers (the problem's, then results) and computes c right, else 0."""
    pool, _ = parse_problem(answer)
    labels, good = [], True
    for line in lines:
        match = _STEP.fullmatch(line.strip())
        if good and match:
            a, op, b, c = int(match[1]), match[2], int(match[3]), int(match[4])
            rest = list(pool)
            for n in (a, b):
                if n in rest:
                    rest.remove(n)
                else:
                    good = False
            good = good and _apply(a, op, b) == c
            pool = [*rest, c]
        else:
            good = False
        labels.append(int(good))
    return labels


_STEP = re.compile(r"(-?\d+)([+\-*])(-?\d+)=(-?\d+)")


def step_prefixes(prompt: str, lines: list[str]) -> list[str]:
    """The texts a pipelined reward stage scores: prompt + the steps up to each one's end."""
    return [prompt + "".join(f"{line}\n" for line in lines[: k + 1]) for k in range(len(lines))]


def make_prm(directory: str, steps: int = 400, seed: int = 0, batch_size: int = 32, lr: float = 3e-3) -> str:
    """Train a tiny token-classification PRM (a Llama body, 2 labels) on labelled
    countdown traces and write it at `directory` with its tokenizer; returns `directory`.
    Each step's label sits on the last token of its line."""
    import torch
    from transformers import AutoConfig, AutoModelForTokenClassification

    tokenizer = train_tokenizer(TaskConfig(name="countdown"), seed=seed)
    config = AutoConfig.for_model(
        "llama",
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id,
        num_labels=2,
        architectures=["LlamaForTokenClassification"],
    )
    torch.manual_seed(seed)
    model = AutoModelForTokenClassification.from_config(config)
    rng = random.Random(f"prm-{seed}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        ids, labels = _batch(tokenizer, [countdown_trace(rng) for _ in range(batch_size)])
        loss = model(input_ids=ids, attention_mask=(labels != -200).long(), labels=labels.clamp(min=-100)).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def _batch(tokenizer: Any, traces: list[tuple[str, str, list[str]]]):
    """Right-padded ids and labels: each step's label at its line's last token, -100
    elsewhere, -200 on padding (masked out of attention as well)."""
    import torch

    rows, targets = [], []
    for prompt, answer, lines in traces:
        prefixes = step_prefixes(prompt, lines)
        ids = tokenizer(prefixes[-1])["input_ids"]
        target = [-100] * len(ids)
        for text, label in zip(prefixes, step_labels(answer, lines), strict=True):
            end = len(tokenizer(text)["input_ids"])
            target[end - 1] = label
        rows.append(ids)
        targets.append(target)
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    labels = torch.tensor([t + [-200] * (width - len(t)) for t in targets])
    return ids, labels


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Train the small countdown PRM and write it at DIR.")
    ap.add_argument("directory")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print(make_prm(args.directory, steps=args.steps, seed=args.seed))


if __name__ == "__main__":
    main()
