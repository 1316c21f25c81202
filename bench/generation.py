"""Generation tokens/s of the torch backend's two paths against `transformers`' `generate`.

The workload is bench/peer_trl.py's: the tiny Qwen2 it trains (hidden 128, two layers, a
261-token vocabulary; random weights here, which leave every completion running to its
budget), B=8 prompts × G=8 samples, prompts of 88 tokens, 72 new tokens each, sampled at
temperature 1. Each side runs in this process on the same torch threads (`--threads`):

- `hand-written`: `TorchBackend` (workers/inference/torch_backend.py), the static-KV-cache
  loop a run's inference worker gets for Llama and Qwen2 in float32 on the CPU;
- `transformers forward`: `TransformersBackend`, the model's own forward stepped with a
  `DynamicCache` (every other architecture, dtype or device);
- `transformers generate`: `model.generate(do_sample=True, top_k=0)` on the same rows
  (the reference every peer that drives transformers itself pays: TRL without vLLM),
  with no logprobs asked for, which the two backends return for every token.

Printed: each side's completion tokens/s (median of `--repeats` after a warm-up) and its
ratio to `generate`; `--llama` also runs a tiny Llama of the same size.

    .venv/bin/python bench/generation.py --threads 1
    .venv/bin/python bench/generation.py --threads 2
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

B, G, PROMPT, MAX_NEW = 8, 8, 88, 72


def prompts(vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, vocab) for _ in range(PROMPT)] for _ in range(B)]


def timed(fn, repeats: int) -> tuple[float, int]:
    """(median seconds, tokens of the last call) of `fn()` after one warm-up call."""
    fn()
    times, tokens = [], 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        tokens = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), tokens


def backend_tokens(backend, rows: list[list[int]]) -> int:
    out = backend.generate(rows, G, MAX_NEW, 1.0, 0)
    return sum(len(c.token_ids) for group in out for c in group)


def hf_generate_tokens(model, rows: list[list[int]], eos: int, pad: int) -> int:
    ids = torch.tensor([r for r in rows for _ in range(G)])  # equal lengths: no padding
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            top_k=0,
            temperature=1.0,
            max_new_tokens=MAX_NEW,
            eos_token_id=eos,
            pad_token_id=pad,
        )
    completions = out[:, ids.shape[1] :]
    # A finished row is padded after its EOS: count up to and with the EOS, as the backends do.
    done = (completions == eos).int().cumsum(dim=1)
    return int(((done == 0) | ((done == 1) & (completions == eos))).sum())


def measure(model_dir: str, repeats: int) -> dict[str, float]:
    from transformers import AutoModelForCausalLM

    from workers.inference.torch_backend import TorchBackend, eos_ids
    from workers.inference.transformers_backend import TransformersBackend
    from workers.model.loading import model_config

    config = model_config(model_dir)
    rows = prompts(config.vocab_size)
    eos = eos_ids(config.to_dict())[0]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    hand_written, forward = TorchBackend(model_dir), TransformersBackend(model_dir, device="cpu")
    sides = {
        "hand-written": lambda: backend_tokens(hand_written, rows),
        "transformers forward": lambda: backend_tokens(forward, rows),
        "transformers generate": lambda: hf_generate_tokens(model, rows, eos, config.pad_token_id or eos),
    }
    return {name: (lambda s, n: n / s)(*timed(fn, repeats)) for name, fn in sides.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1, help="torch threads (a run's inference worker: 1 by default)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--llama", action="store_true", help="also a tiny Llama of the same size")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from workers.model.tiny_hf import make_tiny_checkpoint

    root = tempfile.mkdtemp(prefix="rollway-generation-")
    archs = ["qwen2", "llama"] if args.llama else ["qwen2"]
    print(f"B×G = {B}×{G}, {PROMPT}-token prompts, {MAX_NEW} new tokens, {args.threads} torch thread(s)")
    print()
    print("| model | side | completion tokens/s | × generate |")
    print("|---|---|---:|---:|")
    for arch in archs:
        model_dir = make_tiny_checkpoint(
            os.path.join(root, arch), arch, vocab_size=261, max_position_embeddings=PROMPT + MAX_NEW
        )
        figures = measure(model_dir, args.repeats)
        base = figures["transformers generate"]
        for side, rate in figures.items():
            print(f"| tiny {arch} | {side} | {rate:,.0f} | {rate / base:.2f}× |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
