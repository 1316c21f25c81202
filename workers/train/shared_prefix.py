"""A batch's logits at its completion positions only, each distinct prompt run once.

GRPO trains G completions of every prompt. A right-padded forward over prompt +
completion rows runs each prompt G times, forward and backward, and projects every
prompt position onto the vocabulary only to throw those logits away. Here the batch's
distinct prompts, less their last token, run once into a KV cache (transformers'
`past_key_values`); each row then runs its completion after its prompt's cache, from
the prompt's last token, so the second pass's logits are exactly those that score the
completion's tokens. The gradient reaches a prompt's keys and values through the cache,
summed over the rows that read it, as in the padded forward: the same function of the
weights, computed in fewer operations (values agree to float rounding).

The prefixes are left-padded, so every prompt ends at the same cache position and a
completion token's distance in cache positions to any prompt token is its distance in
the sequence (a sliding-window layer counts cache positions). Position ids are given
explicitly, so rotary and absolute position embeddings see each token where the padded
layout puts it.

Only valid where a row's forward depends on its own tokens alone: no dropout (the G
rows would share one mask on the prompt), no recorded routing to replay (it is laid
out per padded row), and no gradient checkpointing (it turns the cache off). The
trainer checks those (`Trainer.share_prompts`); `completion_view` checks the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class CompletionView:
    """Logits at the completion positions of a batch of N rows, C = the longest
    completion: `logits` (N, C, vocab) score `targets` (N, C); `valid` (N, C) marks real
    completion tokens; `slots` (N, C) is each one's column in the padded (N, T-1)
    target layout (workers.train.trainer.pack)."""

    logits: torch.Tensor
    targets: torch.Tensor
    valid: torch.Tensor
    slots: torch.Tensor

    def spread(self, values: torch.Tensor, width: int) -> torch.Tensor:
        """(N, C) values laid into the (N, `width`) target layout, 0 at every other slot
        (prompt and padding); differentiable in `values`."""
        rows = torch.arange(values.shape[0], device=values.device)[:, None].expand_as(self.slots)
        out = values.new_zeros((values.shape[0], width))
        return out.index_put((rows[self.valid], self.slots[self.valid]), values[self.valid])


def completion_view(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_lengths: torch.Tensor,
) -> CompletionView | None:
    """The completion logits of right-padded prompt+completion rows (the trainer's
    `pack`), each distinct prompt run once; None where nothing is shared (every prompt
    distinct) or a prompt is a single token (no prefix to cache)."""
    device = input_ids.device
    plen = prompt_lengths.tolist()
    if min(plen) < 2:
        return None
    host_ids = input_ids.cpu()
    owners: dict[tuple[int, ...], int] = {}
    owner = [owners.setdefault(tuple(host_ids[i, : p - 1].tolist()), len(owners)) for i, p in enumerate(plen)]
    if len(owners) == len(plen):
        return None
    width = max(len(p) for p in owners)
    pre_ids = torch.zeros((len(owners), width), dtype=torch.long)  # padding: masked, any id will do
    pre_mask = torch.zeros((len(owners), width), dtype=torch.long)
    pre_pos = torch.zeros((len(owners), width), dtype=torch.long)
    for u, prefix in enumerate(owners):
        start = width - len(prefix)
        pre_ids[u, start:] = torch.tensor(prefix, dtype=torch.long)
        pre_mask[u, start:] = 1
        pre_pos[u, start:] = torch.arange(len(prefix))
    pre_mask = pre_mask.to(device)
    out = model(
        input_ids=pre_ids.to(device),
        attention_mask=pre_mask,
        position_ids=pre_pos.to(device),
        use_cache=True,
        logits_to_keep=1,  # the prefix's logits score nothing
    )
    cache = out.past_key_values
    if cache is None:
        raise RuntimeError("the model returned no KV cache for the shared prompts (use_cache is off)")
    rows = torch.tensor(owner, dtype=torch.long, device=device)
    cache.batch_select_indices(rows)

    T = input_ids.shape[1]
    first = prompt_lengths.to(device) - 1  # the prompt's last token: input of completion slot 0
    completion = attention_mask.to(device).sum(1) - first - 1
    C = max(int(completion.max()), 1)
    cols = first[:, None] + torch.arange(C, device=device)
    valid = torch.arange(C, device=device)[None, :] < completion[:, None]
    # Beyond a row's end the inputs are masked out: any in-range index will do.
    ids = input_ids.gather(1, cols.clamp(max=T - 1))
    targets = input_ids.gather(1, (cols + 1).clamp(max=T - 1))
    out = model(
        input_ids=ids,
        attention_mask=torch.cat([pre_mask[rows], valid.long()], dim=1),
        position_ids=cols.clamp(max=T - 1),
        past_key_values=cache,
        use_cache=True,
    )
    return CompletionView(out.logits, targets, valid, cols)
