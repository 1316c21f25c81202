"""The small process reward model (workers/rollout/prm.py): trained briefly on countdown
solutions labelled step by step by the step verifier, its scores follow those labels on
traces it never saw, and a reward worker scores chunks with it."""

from __future__ import annotations

import random
import statistics

import pytest
import ray

from tests.engine.helpers import small_config
from workers.rollout.prm import (
    countdown_trace,
    last_token_scores,
    load_reward_model,
    make_prm,
    step_labels,
    step_prefixes,
)
from workers.rollout.reward_stage import RewardWorker


@pytest.fixture(scope="module")
def prm_dir(tmp_path_factory, one_torch_thread_module) -> str:
    return make_prm(str(tmp_path_factory.mktemp("prm")), steps=300)


@pytest.fixture(scope="module")
def one_torch_thread_module():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_the_step_verifier_labels_each_step_good_until_the_first_error():
    assert step_labels("3 5 2:16", ["3+5=8", "8*2=16"]) == [1, 1]
    assert step_labels("3 5 2:16", ["3+5=9", "9*2=18"]) == [0, 0]  # wrong result
    assert step_labels("3 5 2:16", ["3+5=8", "7*2=14"]) == [1, 0]  # 7 is not available
    assert step_labels("3 5 2:16", ["3+5=8", "8*2=16", "what"]) == [1, 1, 0]  # not a step


def test_the_prm_step_scores_follow_the_verifier_step_labels_on_held_out_traces(prm_dir):
    model, tokenizer = load_reward_model(prm_dir)
    rng = random.Random("held-out")  # the PRM trained on the stream seeded "prm-0"
    scores, labels = [], []
    for _ in range(100):
        prompt, answer, lines = countdown_trace(rng)
        scores += last_token_scores(model, tokenizer, step_prefixes(prompt, lines))
        labels += step_labels(answer, lines)
    good = [s for s, y in zip(scores, labels, strict=True) if y]
    bad = [s for s, y in zip(scores, labels, strict=True) if not y]
    assert good and bad
    # Measured: correlation 0.45, AUC 0.76 after 300 steps (an untrained model: ≈ 0 and 0.5).
    assert statistics.correlation(scores, [float(y) for y in labels]) > 0.25
    auc = sum((g > b) + 0.5 * (g == b) for g in good for b in bad) / (len(good) * len(bad))
    assert auc > 0.68


def test_a_reward_worker_scores_a_chunk_with_the_prm(cluster, prm_dir):
    cfg = small_config(rewards={"workers": 1, "scorer": "model", "model_path": prm_dir})
    worker = RewardWorker.remote(cfg, 0)
    prompt, text = "3 5 2:16=", "3+5=8\n"
    [(score, parts)] = ray.get(worker.score_chunks.remote([(prompt, "3 5 2:16", text, [], 4)], 0.0))
    model, tokenizer = load_reward_model(prm_dir)
    assert score == pytest.approx(last_token_scores(model, tokenizer, [prompt + text])[0], abs=1e-5)
    assert 0 < score < 1 and parts == {}
    ray.kill(worker)
