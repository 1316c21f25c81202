"""The trainer at real sizes: logprobs without a full float32 log-softmax, micro-batches
with gradient accumulation, gradient checkpointing, bf16 mixed precision, and the
device the trainer was given."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.engine.helpers import fixed_groups, small_config
from workers.core.devices import assigned_device
from workers.model import logprobs as logprobs_module
from workers.model.logprobs import chosen_logprobs
from workers.train.trainer import Trainer


def reference(logits: torch.Tensor, targets: torch.Tensor, temperature: float):
    logp = torch.log_softmax(logits.double() / temperature, dim=-1)
    picked = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked, -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize("chunk", [2**26, 7 * 11])  # one chunk; many, the last one short
def test_chosen_logprobs_and_entropy_match_the_log_softmax_and_their_gradients(monkeypatch, chunk):
    monkeypatch.setattr(logprobs_module, "CHUNK_ELEMENTS", chunk)
    gen = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(3, 5, 11, generator=gen, dtype=torch.float64)).requires_grad_()
    targets = torch.randint(0, 11, (3, 5), generator=gen)
    w_logp, w_ent = torch.randn(3, 5, generator=gen), torch.randn(3, 5, generator=gen)

    logp, entropy = chosen_logprobs(logits, targets, 0.7, with_entropy=True)
    ((logp * w_logp).sum() + (entropy * w_ent).sum()).backward()
    got_grad, logits.grad = logits.grad.clone(), None

    want_logp, want_ent = reference(logits, targets, 0.7)
    ((want_logp * w_logp).sum() + (want_ent * w_ent).sum()).backward()
    assert logp.dtype == torch.float32
    torch.testing.assert_close(logp.double(), want_logp.detach(), rtol=0, atol=1e-5)
    torch.testing.assert_close(entropy.double(), want_ent.detach(), rtol=0, atol=1e-5)
    torch.testing.assert_close(got_grad, logits.grad, rtol=0, atol=1e-5)


def test_the_logprob_alone_gets_its_gradient_when_the_entropy_is_not_used():
    logits = torch.randn(4, 9, dtype=torch.float64, requires_grad=True)
    targets = torch.tensor([0, 3, 8, 8])
    logp, entropy = chosen_logprobs(logits, targets, with_entropy=True)
    logp.sum().backward()
    want = torch.autograd.grad(reference(logits, targets, 1.0)[0].sum(), logits)[0]
    torch.testing.assert_close(logits.grad, want, rtol=0, atol=1e-6)


def test_bf16_logits_get_a_bf16_gradient_and_no_float32_copy_of_the_whole_vocabulary(monkeypatch):
    """The forward holds float32 only one chunk at a time: spy on the chunks' sizes."""
    vocab, rows = 1000, 64
    monkeypatch.setattr(logprobs_module, "CHUNK_ELEMENTS", 8 * vocab)
    seen = []
    real_log_softmax = torch.log_softmax

    def spy(z, dim):
        seen.append(z.numel())
        return real_log_softmax(z, dim=dim)

    monkeypatch.setattr(torch, "log_softmax", spy)
    logits = torch.randn(rows, vocab, dtype=torch.bfloat16, requires_grad=True)
    logp = chosen_logprobs(logits, torch.zeros(rows, dtype=torch.long))
    logp.sum().backward()
    assert max(seen) == 8 * vocab and len(seen) == 2 * rows // 8  # forward, then backward
    assert logits.grad.dtype == torch.bfloat16


def _trained(cfg, model_dir, groups):
    trainer = Trainer(cfg, model_dir)
    metrics = trainer.train_step(copy.deepcopy(groups))
    return metrics, {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


@pytest.mark.parametrize("lora", [False, True])
def test_micro_batches_give_the_step_of_the_whole_minibatch(tiny_model_dir, lora):
    """Gradient accumulation over 5-row micro-batches (rows of unequal token counts) ==
    one pass over each minibatch: loss, gradient norm and weights after the step."""
    base = {"minibatches": 2, "entropy_coef": 0.01}
    cfg = small_config(trainer=base, lora={"enabled": lora, "rank": 2})
    groups = fixed_groups(tiny_model_dir, cfg)
    whole, w_whole = _trained(cfg, tiny_model_dir, groups)
    micro, w_micro = _trained(
        small_config(trainer={**base, "micro_batch_rows": 5}, lora=cfg.lora.model_dump()), tiny_model_dir, groups
    )
    for key in ("loss", "trainer/grad_norm", "is/ratio_mean", "mismatch/kl", "policy/entropy"):
        assert micro[key] == pytest.approx(whole[key], rel=1e-4, abs=1e-6), key
    start = {k: v.detach().clone() for k, v in Trainer(cfg, tiny_model_dir).model.state_dict().items()}
    changed = [k for k in w_whole if not torch.equal(w_whole[k], start[k])]
    assert changed, "the step changed no weight: the comparison would prove nothing"
    for k in w_whole:
        torch.testing.assert_close(w_micro[k], w_whole[k], rtol=1e-4, atol=1e-6)


def test_gradient_checkpointing_changes_memory_not_the_step(tiny_model_dir):
    cfg = small_config()
    groups = fixed_groups(tiny_model_dir, cfg)
    plain, w_plain = _trained(cfg, tiny_model_dir, groups)
    ckpt_cfg = small_config(trainer={"gradient_checkpointing": True})
    trainer = Trainer(ckpt_cfg, tiny_model_dir)
    assert trainer.model.is_gradient_checkpointing
    ckpt, w_ckpt = _trained(ckpt_cfg, tiny_model_dir, groups)
    assert ckpt["loss"] == pytest.approx(plain["loss"], rel=1e-5)
    for k in w_plain:
        torch.testing.assert_close(w_ckpt[k], w_plain[k], rtol=1e-5, atol=1e-7)


def test_bf16_mixed_precision_keeps_float32_masters_and_tracks_the_float32_step(tiny_model_dir):
    cfg = small_config()
    groups = fixed_groups(tiny_model_dir, cfg)
    f32, _ = _trained(cfg, tiny_model_dir, groups)
    bf16_cfg = small_config(trainer={"dtype": "bfloat16"})
    trainer = Trainer(bf16_cfg, tiny_model_dir)
    metrics = trainer.train_step(copy.deepcopy(groups))
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}
    assert {s["exp_avg"].dtype for s in trainer.optimizer.state.values()} == {torch.float32}
    # bf16 keeps 8 bits of mantissa: the loss agrees to a few parts in a hundred.
    assert metrics["loss"] == pytest.approx(f32["loss"], rel=0.05, abs=0.02)
    assert metrics["loss"] != f32["loss"], "no bf16 compute happened"


def test_a_process_ray_gave_no_gpu_computes_on_the_cpu(monkeypatch):
    import workers.core.devices as devices

    monkeypatch.setattr(devices, "_ray_gpu_ids", lambda: [])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert assigned_device() == torch.device("cpu")
    monkeypatch.setattr(devices, "_ray_gpu_ids", lambda: ["0"])
    assert assigned_device() == torch.device("cuda:0")
    monkeypatch.setattr(devices, "_ray_gpu_ids", lambda: None)  # outside Ray: what torch sees
    assert assigned_device() == torch.device("cuda:0")


def test_the_chunks_give_exactly_the_log_softmax_path_values_and_gradients(monkeypatch):
    """Bit for bit what log_softmax over the whole float32 tensor gives (one chunk or
    many): a trained run's numbers do not depend on the chunking."""
    monkeypatch.setattr(logprobs_module, "CHUNK_ELEMENTS", 3 * 50)
    gen = torch.Generator().manual_seed(1)
    logits = (4 * torch.randn(4, 6, 50, generator=gen)).requires_grad_()
    targets = torch.randint(0, 50, (4, 6), generator=gen)
    weight = torch.randn(4, 6, generator=gen)
    (chosen_logprobs(logits, targets, 0.9) * weight).sum().backward()
    got, logits.grad = logits.grad.clone(), None
    logp = torch.log_softmax(logits / 0.9, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    assert torch.equal(chosen_logprobs(logits, targets, 0.9), logp)
    (logp * weight).sum().backward()
    assert torch.equal(got, logits.grad)
