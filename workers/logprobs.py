"""Per-token logprobs and entropy from logits, without a full-vocabulary float32 copy.

The trainer needs, at every completion slot, log pi(target) under
log_softmax(logits / temperature) and (for the entropy bonus and its metric) the entropy
of that distribution. `log_softmax(logits.float())` holds the whole (rows × tokens ×
vocabulary) tensor in float32 several times over (the upcast, the log-softmax, its
gradient): at a 152k vocabulary and 128 × 512 tokens that is some 40 GB per copy. Here
the forward keeps only the logits the model produced (bf16 under autocast) and one
float32 chunk at a time; the backward recomputes the softmax chunk by chunk and writes
the logits' gradient once, in the logits' own dtype:

    d logp / d z   = onehot(target) − p                 (z = logits / temperature)
    d H / d z      = −p · (z − Σ p z)                   (H = logsumexp(z) − Σ p z)

`torch.autograd.Function` by hand because no library op returns the chosen token's
logprob without materialising the log-softmax (torch's cross_entropy does the same
internally in float32 for bf16 input, and gives no entropy).
"""

from __future__ import annotations

import torch

# Float32 elements per chunk: 2**26 = 256 MiB. Larger → fewer kernel launches; smaller
# → less transient memory (a chunk lives in 3–4 float32 copies while it is processed).
CHUNK_ELEMENTS = 2**26


def _chunk_rows(vocab: int) -> int:
    return max(1, CHUNK_ELEMENTS // max(vocab, 1))


class _ChosenLogprob(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool):
        vocab = logits.shape[-1]
        flat, idx = logits.reshape(-1, vocab), targets.reshape(-1)
        n = flat.shape[0]
        logp = torch.empty(n, dtype=torch.float32, device=logits.device)
        lse = torch.empty(n, dtype=torch.float32, device=logits.device)
        entropy = torch.empty(n if with_entropy else 0, dtype=torch.float32, device=logits.device)
        step = _chunk_rows(vocab)
        for s in range(0, n, step):
            z = flat[s : s + step].float() / temperature
            chunk_lse = torch.logsumexp(z, dim=-1)
            lse[s : s + step] = chunk_lse
            logp[s : s + step] = z.gather(-1, idx[s : s + step, None]).squeeze(-1) - chunk_lse
            if with_entropy:
                p = torch.exp(z - chunk_lse[:, None])
                entropy[s : s + step] = chunk_lse - (p * z).sum(-1)
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature = temperature
        ctx.set_materialize_grads(False)
        if not with_entropy:
            ctx.mark_non_differentiable(entropy)
        shape = targets.shape
        return logp.view(shape), entropy.view(shape) if with_entropy else entropy

    @staticmethod
    def backward(ctx, grad_logp: torch.Tensor | None, grad_entropy: torch.Tensor | None):
        logits, targets, lse = ctx.saved_tensors
        if grad_logp is None and (grad_entropy is None or grad_entropy.numel() == 0):
            return None, None, None, None
        vocab, t = logits.shape[-1], ctx.temperature
        flat, idx = logits.reshape(-1, vocab), targets.reshape(-1)
        g_logp = grad_logp.reshape(-1).float() if grad_logp is not None else None
        g_ent = grad_entropy.reshape(-1).float() if grad_entropy is not None and grad_entropy.numel() else None
        grad = torch.empty_like(flat)
        step = _chunk_rows(vocab)
        for s in range(0, flat.shape[0], step):
            z = flat[s : s + step].float() / t
            p = torch.exp(z - lse[s : s + step, None])
            gz = torch.zeros_like(z)
            if g_logp is not None:
                g = g_logp[s : s + step, None]
                gz -= p * g
                gz.scatter_add_(-1, idx[s : s + step, None], g)
            if g_ent is not None:
                mean_z = (p * z).sum(-1, keepdim=True)
                gz -= p * (z - mean_z) * g_ent[s : s + step, None]
            grad[s : s + step] = (gz / t).to(grad.dtype)
        return grad.view_as(logits), None, None, None


def chosen_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0, with_entropy: bool = False
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """log softmax(logits / temperature)[target] at every position, float32, shaped like
    `targets` (logits: targets' shape + (vocabulary,), any float dtype); with
    `with_entropy`, also the entropy of that distribution. Differentiable in `logits`."""
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} do not match targets {tuple(targets.shape)} + (vocab,)")
    logp, entropy = _ChosenLogprob.apply(logits, targets, float(temperature), bool(with_entropy))
    return (logp, entropy) if with_entropy else logp
