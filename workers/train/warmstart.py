"""A supervised warm-start, so RL begins from a policy that has the skill but is unreliable.

RL post-training starts from a pretrained model; here the "pretraining" is supervised
steps on the task's own (prompt, answer) pairs: clean ones teach the skill, then noisy
ones (characters replaced at random) make the policy sample wrong characters often, so
RL starts at a low reward and has real sharpening to do (see WarmStartConfig). The result
is a Hugging Face directory cached under `cache_dir`, keyed by a hash of everything that
shapes it (model, task, warm_start, seed, the held-out eval prompts it never teaches,
and for a model from a directory or the Hub, its files: workers/train/policy_cache.py),
built once per machine: a lock file serialises concurrent builders and an atomic rename
publishes the finished directory.

A model from a directory or the Hub goes through the same loop on its own tokenizer's
ids (the prompt as its chat template renders it, the answer then EOS); with
`warm_start.steps = noisy_steps = 0` its policy directory is the checkpoint as loaded,
saved with the stop and pad ids the engine uses (workers.model.loading.save_model).
Beside the model, the policy directory keeps its sizes as its config class reads them
(`workers.model.loading.write_dims`), so that a process needing only those need not
import the class.
"""

from __future__ import annotations

import fcntl
import os
import random
import shutil
import tempfile
from collections.abc import Callable

import torch

from workers.config.run_config import RunConfig
from workers.core.char_vocab import tiny_chars
from workers.model.loading import build_tiny, has_weights, load_model, save_model, source_dir, write_dims
from workers.model.tokenizer import CharTokenizer, Tokenizer, load_tokenizer
from workers.rl_tasks import make_task, task_class
from workers.rollout.evaluation import training_prompts
from workers.rollout.generation import encode_prompt
from workers.rollout.task_data import SPLIT_FILE, train_prompts, write_split_record
from workers.train.policy_cache import policy_path
from workers.train.trainer import pack, token_logprobs

# progress(done, total): supervised steps done out of the build's total.
Progress = Callable[[int, int], None]


def policy_dir(cfg: RunConfig, cache_dir: str, progress: Progress | None = None) -> str:
    """Path of the warm-started policy's HF directory, building it on first use;
    `progress(done, total)` is called after each supervised step of a build."""
    os.makedirs(cache_dir, exist_ok=True)
    target = policy_path(cfg, cache_dir)
    if has_weights(target):
        return target
    with open(target + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it right now
        try:
            if has_weights(target):
                return target
            tmp = tempfile.mkdtemp(prefix=".building-", dir=cache_dir)
            try:
                build_policy(cfg, tmp, progress)
                os.rename(tmp, target)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return target


def build_policy(cfg: RunConfig, out_dir: str, progress: Progress | None = None) -> dict[str, float]:
    """Base model (tiny, a local directory or the Hub) + clean then noisy supervised
    steps → `out_dir`.

    Deterministic from `cfg.seed`. Returns {"final_loss": …} for logging.
    """
    if cfg.model.source != "tiny":
        src = source_dir(cfg.model)
        model = load_model(src)
        tokenizer = load_tokenizer(src)
    else:
        tokenizer = CharTokenizer(tiny_chars(getattr(task_class(cfg.task.name), "extra_chars", "")))
        model = build_tiny(cfg.model, tokenizer, cfg.seed)
    ws = cfg.warm_start
    total = ws.steps + ws.noisy_steps

    def clean_done(k: int) -> None:
        if progress is not None:
            progress(k, total)

    def noisy_done(k: int) -> None:
        if progress is not None:
            progress(ws.steps + k, total)

    # Without clean steps nothing asks the task for demonstrations: a task without them
    # runs from the model as it is.
    final_loss = float("nan")
    if ws.steps:
        final_loss = supervised_steps(model, tokenizer, cfg, ws.steps, noise=0.0, phase="clean", on_step=clean_done)
    if ws.noisy_steps:
        final_loss = supervised_steps(
            model, tokenizer, cfg, ws.noisy_steps, noise=ws.label_noise, phase="noisy", on_step=noisy_done
        )
    save_model(model, tokenizer, out_dir)
    write_dims(out_dir, model.config)
    _record_split(cfg, out_dir, total)
    return {"final_loss": final_loss}


def _record_split(cfg: RunConfig, out_dir: str, steps: int) -> None:
    """The dataset split the policy in `out_dir` trained on: the run's, after supervised
    steps on its train rows; without any, the source checkpoint's own record, if it has one."""
    if steps:
        write_split_record(cfg, out_dir)
    elif cfg.model.source == "path":
        recorded = os.path.join(source_dir(cfg.model), SPLIT_FILE)
        if os.path.exists(recorded):
            shutil.copyfile(recorded, os.path.join(out_dir, SPLIT_FILE))


def demonstrations(cfg: RunConfig):
    """(pairs source, demonstration, noise characters) for the warm start of `cfg`'s
    task: pairs from its dataset's train split or its generator, the completion it
    teaches for a pair, and what the noisy phase replaces characters with (the task's
    `noise_chars`, else the demonstration's own characters). ValueError, naming the
    fix, for a task that offers no demonstration."""
    task = make_task(cfg.task)
    demo = getattr(task, "demonstration", None)
    if demo is None:
        raise ValueError(
            f"task {cfg.task.name!r} offers no demonstration (a demonstration(prompt, answer) method) for the "
            "supervised warm start: set warm_start.steps and warm_start.noisy_steps to 0"
        )
    return training_prompts(cfg, task, train_prompts(cfg, task)), demo, getattr(task, "noise_chars", None)


def corrupt(answer: str, noise: float, alphabet: str, rng: random.Random) -> str:
    """`answer` with each character replaced, with probability `noise`, by a random one."""
    if noise <= 0:
        return answer
    return "".join(rng.choice(alphabet) if rng.random() < noise else c for c in answer)


def supervised_steps(
    model,
    tokenizer: Tokenizer,
    cfg: RunConfig,
    steps: int,
    noise: float,
    phase: str,
    on_step: Callable[[int], None] | None = None,
) -> float:
    """`steps` AdamW steps of next-token cross-entropy on answer+EOS given the prompt,
    each answer character replaced by a random one with probability `noise`."""
    source, demo, noise_chars = demonstrations(cfg)
    # A multi-agent task teaches every role of an episode (each its own prompt); any other
    # task one demonstration per pair.
    roles = getattr(make_task(cfg.task), "role_demonstrations", None)

    def teach(prompt: str, answer: str) -> list[tuple[str, str]]:
        return roles(prompt, answer) if roles is not None else [(prompt, demo(prompt, answer))]

    rng = random.Random(f"warm-start-{phase}-{cfg.seed}")
    ws = cfg.warm_start
    optimizer = torch.optim.AdamW(model.parameters(), lr=ws.lr)
    model.train()
    loss_value = float("nan")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        for k in range(steps):
            taught = [pc for p, a in source.sample(ws.batch_size, rng) for pc in teach(p, a)]
            shown = [d for _, d in taught]
            targets = [corrupt(d, noise, noise_chars or "".join(sorted(set(d))), rng) for d in shown]
            batch = pack(
                [encode_prompt(tokenizer, p) for p, _ in taught],
                [tokenizer.encode(a) + [tokenizer.eos_id] for a in targets],
                tokenizer.pad_id,
            )
            logp = token_logprobs(model, batch, temperature=1.0)
            loss = -(logp * batch.mask).sum() / batch.mask.sum()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss_value = loss.item()
            if on_step is not None:
                on_step(k + 1)
    model.eval()
    return loss_value
