"""Per-token logprobs and entropy from logits, without a full-vocabulary float32 copy.

The trainer needs, at every completion slot, log pi(target) under
log_softmax(logits / temperature) and (for the entropy bonus and its metric) the entropy
of that distribution. `log_softmax(logits.float())` holds the whole (rows × tokens ×
vocabulary) tensor in float32 several times over (the upcast, the log-softmax, its
gradient): at a 152k vocabulary and 128 × 512 tokens that is some 40 GB per copy. Here
the forward keeps only the logits the model produced (bf16 under autocast) and one
float32 chunk at a time; the backward runs each chunk's forward again under autograd
and writes the logits' gradient once, in the logits' own dtype. Values and gradients
are bit for bit those of log_softmax over the whole tensor.

`torch.autograd.Function` by hand because no library op returns the chosen token's
logprob without materialising the log-softmax (torch's cross_entropy does the same
internally in float32 for bf16 input, and gives no entropy).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from workers.core.sampling_mask import KeptLayout

# Float32 elements per chunk: 2**26 = 256 MiB. Larger → fewer kernel launches; smaller
# → less transient memory (a chunk lives in 3–4 float32 copies while it is processed).
CHUNK_ELEMENTS = 2**26


def _chunk_rows(vocab: int) -> int:
    return max(1, CHUNK_ELEMENTS // max(vocab, 1))


def _log_softmax(x: torch.Tensor, temperature: float, keep: torch.Tensor | None) -> torch.Tensor:
    """log_softmax(x / temperature) in float32, over the `keep` ids only where given
    (Keep Sampling Mask: renormalised over the set the token was drawn from)."""
    z = x.float() / temperature
    if keep is not None:
        z = z.masked_fill(~keep, float("-inf"))
    return torch.log_softmax(z, dim=-1)


def _entropy(lp: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    if keep is None:
        return -(lp.exp() * lp).sum(-1)
    return -(lp.exp() * lp.masked_fill(~keep, 0.0)).sum(-1)  # 0 · −inf would be nan


class _ChosenLogprob(torch.autograd.Function):
    # Each chunk goes through torch's own log_softmax, forward and backward alike, so the
    # values and gradients are bit for bit those of log_softmax over the whole tensor.
    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool, kept):
        vocab = logits.shape[-1]
        flat, idx = logits.reshape(-1, vocab), targets.reshape(-1)
        n = flat.shape[0]
        logp = torch.empty(n, dtype=torch.float32, device=logits.device)
        entropy = torch.empty(n if with_entropy else 0, dtype=torch.float32, device=logits.device)
        step = _chunk_rows(vocab)
        for s in range(0, n, step):
            keep = kept.chunk(s, min(s + step, n), vocab, logits.device) if kept is not None else None
            lp = _log_softmax(flat[s : s + step], temperature, keep)
            logp[s : s + step] = lp.gather(-1, idx[s : s + step, None]).squeeze(-1)
            if with_entropy:
                entropy[s : s + step] = _entropy(lp, keep)
        ctx.save_for_backward(logits, targets)
        ctx.kept = kept
        ctx.temperature = temperature
        ctx.set_materialize_grads(False)
        if not with_entropy:
            ctx.mark_non_differentiable(entropy)
        shape = targets.shape
        return logp.view(shape), entropy.view(shape) if with_entropy else entropy

    @staticmethod
    def backward(ctx, grad_logp: torch.Tensor | None, grad_entropy: torch.Tensor | None):
        logits, targets = ctx.saved_tensors
        grad_ent = grad_entropy if grad_entropy is not None and grad_entropy.numel() > 0 else None
        if grad_logp is None and grad_ent is None:
            return None, None, None, None, None
        vocab, t, kept = logits.shape[-1], ctx.temperature, ctx.kept
        flat, idx = logits.reshape(-1, vocab), targets.reshape(-1)
        grad = torch.empty_like(flat)
        step = _chunk_rows(vocab)
        for s in range(0, flat.shape[0], step):
            # The chunk's forward again, under autograd: torch's own backward kernels, so
            # the gradient is bit for bit that of the unchunked graph.
            keep = kept.chunk(s, min(s + step, flat.shape[0]), vocab, logits.device) if kept is not None else None
            with torch.enable_grad():
                x = flat[s : s + step].detach().requires_grad_()
                lp = _log_softmax(x, t, keep)
                outs, grads = [], []
                if grad_logp is not None:
                    outs.append(lp.gather(-1, idx[s : s + step, None]).squeeze(-1))
                    grads.append(grad_logp.reshape(-1)[s : s + step])
                if grad_ent is not None:
                    outs.append(_entropy(lp, keep))
                    grads.append(grad_ent.reshape(-1)[s : s + step])
                (grad[s : s + step],) = torch.autograd.grad(outs, x, grads)
        return grad.view_as(logits), None, None, None, None


def chosen_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    kept: KeptLayout | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """log softmax(logits / temperature)[target] at every position, float32, shaped like
    `targets` (logits: targets' shape + (vocabulary,), any float dtype); with
    `with_entropy`, also the entropy of that distribution. Differentiable in `logits`.
    `kept` (Keep Sampling Mask): at a position with a recorded set, the softmax is over
    that set only (the flat positions are targets' rows × columns)."""
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} do not match targets {tuple(targets.shape)} + (vocab,)")
    logp, entropy = _ChosenLogprob.apply(logits, targets, float(temperature), bool(with_entropy), kept)
    return (logp, entropy) if with_entropy else logp
