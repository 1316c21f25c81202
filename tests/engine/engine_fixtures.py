"""Fixtures for engine unit tests: a very small config and model directory (no services)."""

from __future__ import annotations

import pytest
import torch

from workers.config import RunConfig
from workers.model import build_tiny, save_model
from workers.tokenizer import CharTokenizer


def small_config(**overrides) -> RunConfig:
    """A RunConfig whose model and warm start take milliseconds."""
    base = {
        "model": {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32},
        "warm_start": {"steps": 2, "noisy_steps": 1, "batch_size": 8},
        "trainer": {"batch_groups": 4, "group_size": 4},
    }
    for key, value in overrides.items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
    return RunConfig.model_validate(base)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """A randomly initialised tiny Llama with sharpened weights (so sampling is not uniform)
    and an EOS bias (so some completions stop early)."""
    cfg = small_config()
    tokenizer = CharTokenizer()
    model = build_tiny(cfg.model, tokenizer, seed=0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(4)
        model.lm_head.weight[tokenizer.eos_id] += 0.5 * model.model.norm.weight
    path = str(tmp_path_factory.mktemp("tiny-model"))
    save_model(model, tokenizer, path)
    return path
