"""Fixtures of the GPU tests. They import neither Ray nor Django: a GPU host that runs
them needs only torch, transformers, peft and pydantic."""

from __future__ import annotations

import random

import pytest

from workers.config.run_config import RunConfig
from workers.core.records import Group, Rollout
from workers.model.loading import build_tiny, save_model
from workers.model.tokenizer import CharTokenizer


def small_config(**overrides) -> RunConfig:
    base = {
        "model": {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32},
        "warm_start": {"steps": 0, "noisy_steps": 0},
        "trainer": {"batch_groups": 4, "group_size": 4},
    }
    for key, value in overrides.items():
        base[key] = {**base.get(key, {}), **value}
    return RunConfig.model_validate(base)


def random_groups(cfg: RunConfig, vocab: int, seed: int = 0) -> list[Group]:
    """Rollouts of random tokens and rewards, of unequal lengths (GRPO has signal)."""
    rng = random.Random(seed)
    groups = []
    for k in range(cfg.trainer.batch_groups):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(2, 5))]
        group = Group(group_id=f"g{k}", prompt="", answer="")
        for _ in range(cfg.trainer.group_size):
            completion = [rng.randrange(3, vocab) for _ in range(rng.randint(1, cfg.inference.max_new_tokens))]
            group.rollouts.append(
                Rollout(prompt, completion, [-rng.random() for _ in completion], [0] * len(completion), "length",
                        reward=rng.random(), group_id=f"g{k}")
            )  # fmt: skip
        groups.append(group)
    return groups


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    tokenizer = CharTokenizer()
    model = build_tiny(small_config().model, tokenizer, seed=0)
    path = str(tmp_path_factory.mktemp("tiny-model"))
    save_model(model, tokenizer, path)
    return path


@pytest.fixture
def groups() -> list[Group]:
    return random_groups(small_config(), CharTokenizer().vocab_size)
