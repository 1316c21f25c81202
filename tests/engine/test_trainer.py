"""Trainer steps, generate_groups records, and the warm-start cache."""

from __future__ import annotations

import os
import random
import threading

import pytest
import torch

from tests.engine.helpers import fixed_groups, small_config
from workers.core.metric_names import NAMES
from workers.inference.base import Completion
from workers.inference.torch_backend import TorchBackend
from workers.model.loading import load_model
from workers.model.tokenizer import CharTokenizer
from workers.rl_tasks import make_task
from workers.rollout.generation import generate_groups
from workers.train import warmstart
from workers.train.trainer import Trainer, pack, token_logprobs

REQUIRED = {
    "loss",
    "reward/mean",
    "staleness/mean",
    "staleness/max",
    "is/ratio_mean",
    "is/clipped_frac",
    "mismatch/kl",
    "trainer/step_s",
}


def weighted_loglik(model, groups, temperature) -> float:
    """sum over tokens of advantage · log pi: what a policy-gradient step should raise."""
    from workers.train.loss import group_advantages

    rollouts = [r for g in groups for r in g.rollouts]
    adv = torch.cat([group_advantages(torch.tensor([[r.reward for r in g.rollouts]]))[0] for g in groups])
    batch = pack([r.prompt_ids for r in rollouts], [r.completion_ids for r in rollouts], 0)
    with torch.no_grad():
        logp = token_logprobs(model, batch, temperature)
    return float(((logp * batch.mask).sum(-1) * adv).sum())


def test_generate_groups_fills_the_data_contract(tiny_model_dir):
    cfg = small_config()
    tok = CharTokenizer.load(tiny_model_dir)
    task = make_task(cfg.task)
    prompts = task.sample(cfg.trainer.batch_groups, random.Random(3))
    groups = generate_groups(TorchBackend(tiny_model_dir), task, tok, prompts, cfg, 5, 3)
    assert len(groups) == cfg.trainer.batch_groups
    assert len({g.group_id for g in groups}) == len(groups)
    for g in groups:
        assert len(g.rollouts) == cfg.trainer.group_size
        for r in g.rollouts:
            assert r.prompt_ids == [tok.bos_id, *tok.encode(g.prompt)]
            assert len(r.completion_ids) == len(r.behaviour_logprobs) == len(r.token_versions)
            assert set(r.token_versions) == {5} and r.group_id == g.group_id
            assert r.reward == task.reward(tok.decode(r.completion_ids), g.answer)
            assert r.finish_reason in ("stop", "length")


def test_generate_groups_scores_with_the_task(tiny_model_dir):
    class Scripted:
        def generate(self, prompts, n, max_new_tokens, temperature, seed):
            right = CharTokenizer().encode("cba") + [2]
            wrong = CharTokenizer().encode("cbb") + [2]
            return [[Completion(right, [-0.1] * 4, "stop"), Completion(wrong, [-0.2] * 4, "stop")] for _ in prompts]

    cfg = small_config(trainer={"group_size": 2})
    groups = generate_groups(
        Scripted(), make_task(cfg.task), CharTokenizer(), [("abc=", "cba")], cfg, version=0, seed=9
    )
    assert [r.reward for r in groups[0].rollouts] == pytest.approx([1.0, 2 / 3])
    assert groups[0].group_id == "9-0"


def test_a_train_step_raises_the_advantage_weighted_likelihood(tiny_model_dir):
    cfg = small_config(trainer={"lr": 3e-3, "batch_groups": 6, "group_size": 6})
    groups = fixed_groups(tiny_model_dir, cfg)
    trainer = Trainer(cfg, tiny_model_dir)
    before = weighted_loglik(trainer.model, groups, 1.0)
    for _ in range(3):
        metrics = trainer.train_step(groups)
    after = weighted_loglik(trainer.model, groups, 1.0)
    assert after > before
    assert trainer.version == 3
    assert set(metrics) >= REQUIRED
    assert metrics["policy/version"] == 3.0
    assert set(metrics) <= NAMES


def test_first_step_on_fresh_rollouts_is_on_policy(tiny_model_dir):
    cfg = small_config()
    groups = fixed_groups(tiny_model_dir, cfg)
    metrics = Trainer(cfg, tiny_model_dir).train_step(groups)
    assert metrics["mismatch/kl"] < 1e-6  # same weights in trainer and inference
    assert metrics["is/ratio_mean"] == pytest.approx(1.0, abs=1e-3)
    assert metrics["staleness/mean"] == 0.0


def test_staleness_is_trainer_version_minus_token_version(tiny_model_dir):
    cfg = small_config(trainer={"minibatches": 2})
    trainer = Trainer(cfg, tiny_model_dir)
    trainer.train_step(fixed_groups(tiny_model_dir, cfg, version=0, seed=1))
    trainer.train_step(fixed_groups(tiny_model_dir, cfg, version=0, seed=2))
    metrics = trainer.train_step(fixed_groups(tiny_model_dir, cfg, version=0, seed=3))
    assert metrics["staleness/mean"] == 2.0 and metrics["staleness/max"] == 2.0
    assert metrics["mismatch/kl"] > 0  # behaviour logprobs came from the old weights


def test_state_dict_uses_checkpoint_names_and_loads_into_the_backend(tiny_model_dir):
    cfg = small_config()
    trainer = Trainer(cfg, tiny_model_dir)
    trainer.train_step(fixed_groups(tiny_model_dir, cfg))
    sd = trainer.state_dict()
    assert set(sd) == set(load_model(tiny_model_dir).state_dict())
    assert all(t.is_contiguous() and t.device.type == "cpu" and not t.requires_grad for t in sd.values())
    backend = TorchBackend(tiny_model_dir)
    backend.load_weights(sd)
    groups = generate_groups(backend, make_task(cfg.task), CharTokenizer(), [("abc=", "cba")], cfg, version=1, seed=0)
    metrics = trainer.train_step(groups)
    assert metrics["mismatch/kl"] < 1e-6  # inference now runs the trainer's weights


def test_warm_start_is_cached_and_deterministic(tmp_path, monkeypatch):
    cfg = small_config()
    first = warmstart.policy_dir(cfg, str(tmp_path / "a"))
    for name in ("config.json", "model.safetensors", "rollway_tokenizer.json"):
        assert os.path.exists(os.path.join(first, name))
    again = warmstart.policy_dir(cfg, str(tmp_path / "b"))
    a, b = load_model(first).state_dict(), load_model(again).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)  # same seed, same weights

    def no_rebuild(*args, **kwargs):
        raise AssertionError("cache miss: the policy was rebuilt")

    monkeypatch.setattr(warmstart, "build_policy", no_rebuild)
    assert warmstart.policy_dir(cfg, str(tmp_path / "a")) == first
    other = small_config(seed=1)
    with pytest.raises(AssertionError, match="cache miss"):
        warmstart.policy_dir(other, str(tmp_path / "a"))  # a different key builds anew


def test_concurrent_callers_build_the_policy_once(tmp_path, monkeypatch):
    calls = []
    real = warmstart.build_policy

    def counting(cfg, out_dir, progress=None):
        calls.append(out_dir)
        return real(cfg, out_dir, progress)

    monkeypatch.setattr(warmstart, "build_policy", counting)
    cfg = small_config()
    paths = []
    threads = [
        threading.Thread(target=lambda: paths.append(warmstart.policy_dir(cfg, str(tmp_path)))) for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(calls) == 1 and len(set(paths)) == 1 and len(paths) == 3
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".building-")]


def test_a_local_model_directory_is_a_real_source(tiny_model_dir, tmp_path):
    cfg = small_config(model={"source": "path", "path": tiny_model_dir}, warm_start={"steps": 0, "noisy_steps": 0})
    out = warmstart.policy_dir(cfg, str(tmp_path))
    src, got = load_model(tiny_model_dir).state_dict(), load_model(out).state_dict()
    assert all(torch.equal(src[k], got[k]) for k in src)
    assert CharTokenizer.load(out).chars == CharTokenizer.load(tiny_model_dir).chars


def test_a_missing_model_path_is_named(tmp_path):
    cfg = small_config(model={"source": "path", "path": str(tmp_path / "nope")})
    with pytest.raises(FileNotFoundError, match="model.path"):
        warmstart.policy_dir(cfg, str(tmp_path / "cache"))


@pytest.mark.parametrize("minibatches", [1, 2, 3])
def test_pi_old_is_the_policy_at_step_start_with_one_forward_per_minibatch(tiny_model_dir, monkeypatch, minibatches):
    """Each minibatch's loss gets the logprobs of the policy as the step began: the
    first minibatch's own forward (no update has run yet), the others' from one extra
    no-grad forward of their rows; with one minibatch a step runs one forward only."""
    import copy

    import workers.train.trainer as trainer_module

    cfg = small_config(trainer={"minibatches": minibatches})
    groups = fixed_groups(tiny_model_dir, cfg)
    trainer = Trainer(cfg, tiny_model_dir)
    start = copy.deepcopy(trainer.model)
    rollouts = [r for g in groups for r in g.rollouts]
    batch = pack([r.prompt_ids for r in rollouts], [r.completion_ids for r in rollouts], trainer.pad_id)
    with torch.no_grad():
        reference = token_logprobs(start, batch, cfg.inference.temperature)
    seen = []
    real_loss = trainer_module.correction_loss

    def spy(trainer, correction, logp, old_logp, behaviour, advantages, mask, **knobs):
        seen.append((old_logp.clone(), mask.clone()))
        return real_loss(trainer, correction, logp, old_logp, behaviour, advantages, mask, **knobs)

    monkeypatch.setattr(trainer_module, "correction_loss", spy)
    # A pass over rows: one forward of the model, or two with shared prompts (the
    # distinct prompts, then the completions: workers/train/shared_prefix.py).
    passes = []
    real_logprobs = trainer_module.token_logprobs

    def count(*args, **kwargs):
        passes.append(1)
        return real_logprobs(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "token_logprobs", count)
    forwards = []
    trainer.model.register_forward_hook(lambda *a: forwards.append(1))
    trainer.train_step(groups)

    order = list(range(len(groups)))
    random.Random(cfg.seed).shuffle(order)  # the trainer's first shuffle
    size = cfg.trainer.group_size
    assert len(seen) == minibatches
    for k, (old_logp, mask) in enumerate(seen):
        rows = [gi * size + j for gi in order[k::minibatches] for j in range(size)]
        assert torch.allclose(old_logp * mask, reference[rows] * mask, atol=1e-5)
    assert len(passes) == minibatches + (minibatches > 1)
    assert len(forwards) == len(passes) * (2 if trainer.share_prompts else 1)
