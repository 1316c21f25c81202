"""Delta weight sync against full sync, per RL step, at a real model shape (`sync.delta`).

A random-weight model of Qwen2.5-0.5B's published shape (float32 masters, as the trainer
keeps them) takes AdamW steps at each learning rate asked for, on random tokens (the
update's size is what matters here: Adam's first steps move every weight by about lr).
After each step its weights go through the project's object-store sync into a receiver
in this process, over a local Ray object store: once as a run sends them today (the whole
float32 state), once with `sync.delta` (each version also as its bf16 changes since the
previous one, which a caught-up receiver pulls). Per step it prints the share of bf16
elements that changed, the bytes a caught-up receiver pulls, and each side's time. The
receiver's backend is a stand-in that loads nothing: loading is the same whole-state copy
either way, so it is left out of both.

    .venv/bin/python bench/delta_sync.py                   # lr 1e-6 and 1e-5, 4 steps each
    .venv/bin/python bench/delta_sync.py --size tiny --steps 2   # a smoke test
    python bench/delta_sync.py --changed-only --device cuda --size 1.5b --rows 8 --tokens 512
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gpu_scale  # noqa: E402
import torch  # noqa: E402

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2}


class NoLoad:
    """A backend that takes the weights and loads nothing (see the module's docstring)."""

    def load_weights(self, state) -> None:
        pass


def model_of(size: str) -> torch.nn.Module:
    import transformers

    shape = gpu_scale.SHAPES.get(size, {**TINY, "num_key_value_heads": 1})
    config = transformers.Qwen2Config(vocab_size=gpu_scale.VOCAB, **shape)
    torch.manual_seed(0)
    return transformers.Qwen2ForCausalLM(config).float().train()


def changed_shares(size: str, lr: float, steps: int, rows: int, tokens: int, device: torch.device) -> list[float]:
    """The share of bf16 elements each AdamW step changes (no sync: `--changed-only`),
    float32 masters with bf16 autocast on a GPU, `rows` × `tokens` random tokens a step."""
    model = model_of(size).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(1)
    total = sum(p.numel() for p in model.parameters())
    shares = []
    for _ in range(steps):
        before = {n: p.detach().to(torch.bfloat16) for n, p in model.named_parameters()}
        ids = torch.randint(0, gpu_scale.VOCAB, (rows, tokens), generator=g).to(device)
        with torch.autocast(device.type, torch.bfloat16, enabled=device.type == "cuda"):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        changed = sum(
            int((p.detach().to(torch.bfloat16).view(torch.int16) != before[n].view(torch.int16)).sum())
            for n, p in model.named_parameters()
        )
        shares.append(changed / total)
    return shares


def run(size: str, lr: float, steps: int, tokens: int) -> list[dict]:
    from workers.config.run_config import SyncConfig
    from workers.sync import make_receiver, make_sender

    model = model_of(size)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    cases = {}
    for name, delta in (("full", False), ("delta", True)):
        cfg = SyncConfig(protocol="object_store", delta=delta)
        sender = make_sender(cfg, wire_dtype="bfloat16" if delta else None)
        sender.attach(model)
        cases[name] = (sender, make_receiver(cfg))
    g = torch.Generator().manual_seed(1)
    rows = []
    for step in range(steps + 1):  # version 0: the first sync, whole either way
        row: dict = {"lr": lr, "step": step}
        if step:
            before = {n: p.detach().to(torch.bfloat16) for n, p in model.named_parameters()}
            ids = torch.randint(0, gpu_scale.VOCAB, (2, tokens), generator=g)
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            changed = sum(
                int((p.detach().to(torch.bfloat16).view(torch.int16) != before[n].view(torch.int16)).sum())
                for n, p in model.named_parameters()
            )
            row["changed_frac"] = changed / sum(p.numel() for p in model.parameters())
            del before
        for name, (sender, receiver) in cases.items():
            notices: list = []
            sent = sender.send(step, notices.append)
            t0 = time.perf_counter()
            got = receiver.apply(NoLoad(), receiver.receive(notices[0]))
            assert got is not None
            row[f"{name}_bytes"] = got.bytes
            row[f"{name}_trainer_ms"] = sent.trainer_ms
            row[f"{name}_receiver_ms"] = (time.perf_counter() - t0) * 1e3
            if name == "delta":
                row["whole_bf16_bytes"] = notices[0].payload.get("whole_bytes", got.bytes)
        rows.append(row)
        print(row, flush=True)
    for sender, _ in cases.values():
        sender.close()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=["0.5b", "1.5b", "tiny"], default="0.5b")
    parser.add_argument("--lrs", default="1e-6,1e-5")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=32, help="tokens per row of the 2-row batch")
    parser.add_argument(
        "--changed-only",
        action="store_true",
        help="only the share of bf16 elements each step changes (no sync, no Ray: any device)",
    )
    parser.add_argument("--device", default="cpu", help="with --changed-only: cpu or cuda")
    parser.add_argument("--rows", type=int, default=8, help="with --changed-only: rows of each step's batch")
    args = parser.parse_args()
    if args.changed_only:
        print("| shape | lr | bf16 elements changed, steps 1.. |")
        print("|---|---|---|")
        for lr in (float(x) for x in args.lrs.split(",")):
            shares = changed_shares(args.size, lr, args.steps, args.rows, args.tokens, torch.device(args.device))
            print(f"| {args.size} | {lr:g} | {', '.join(f'{100 * x:.2f} %' for x in shares)} |", flush=True)
        return 0
    import ray

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    torch.set_num_threads(os.cpu_count() or 1)
    table = []
    for lr in (float(x) for x in args.lrs.split(",")):
        rows = run(args.size, lr, args.steps, args.tokens)[1:]  # after the first, whole, sync
        table.append((lr, rows))
    print()
    print("| lr | bf16 elements changed per step | bytes pulled, full sync (float32) | bytes pulled, delta | "
          "trainer ms, full / delta | receiver ms, full / delta |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for lr, rows in table:
        frac = [r["delta_bytes"] for r in rows]
        changed = [100 * r["changed_frac"] for r in rows]
        med = statistics.median
        print(
            f"| {lr:g} | {min(changed):.2f}–{max(changed):.2f} % | "
            f"{med(r['full_bytes'] for r in rows) / 1e6:,.0f} MB | "
            f"{min(frac) / 1e6:,.1f}–{max(frac) / 1e6:,.1f} MB | {med(r['full_trainer_ms'] for r in rows):,.0f} / "
            f"{med(r['delta_trainer_ms'] for r in rows):,.0f} | {med(r['full_receiver_ms'] for r in rows):,.0f} / "
            f"{med(r['delta_receiver_ms'] for r in rows):,.0f} |"
        )
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
