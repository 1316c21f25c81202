"""vLLM's sleep mode around the trainer's step, on one GPU: a colocated run's turns.

A colocated run at `inference.sleep_level` 1 or 2 takes turns on each GPU
(workers/run/colocation.py): vLLM sleeps, the trainer steps, vLLM wakes its weights,
takes the new version, then wakes its KV cache. This bench runs that cycle with the
allocator `LLM.sleep` / `LLM.wake_up` drive in every vLLM worker,
`vllm.device_allocator.cumem.CuMemAllocator`, in a second process holding an inference
worker's weights (tag "weights") and a KV cache of the size vLLM would take at
`--gpu-share` (tag "kv_cache"), and the engine's own trainer
(`workers.train.trainer.Trainer` at sleep_level 1: its AdamW moments in host memory
between steps, its cache returned to the driver) and `cuda_ipc` sync
(`workers.sync.cuda_ipc`) in this one. The worker's model is a transformers model
allocated in vLLM's pool, not vLLM's model runner, so it needs vLLM's allocator module
and its C extension only; at level 2 the worker saves and restores the model's buffers
around the sleep as vLLM's GPU worker does (`Worker.sleep` / `Worker.wake_up`).

Per size and level it prints, as means over `--cycles` timed cycles after one warm-up:
the GPU memory in use (every process's, from cudaMemGetInfo) with both awake, with the
worker asleep, and at the trainer's peak; sleep s, wake s per tag; the sync's ms; and
checks every cycle that level 1 gave the weights back bit for bit and that after either
level the worker holds the trainer's new version bit for bit (per-tensor float64 sums).

    python bench/gpu_sleep.py --sizes 0.5b 1.5b --levels 1 2

Needs a CUDA GPU and vLLM's allocator importable (`vllm.device_allocator.cumem` with its
`vllm.cumem_allocator` extension): the gpu flavor has both.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gpu_scale  # noqa: E402

LEVELS = (1, 2)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["0.5b", "1.5b"], choices=list(gpu_scale.SHAPES))
    parser.add_argument("--levels", nargs="+", type=int, default=list(LEVELS), choices=LEVELS)
    gpu_scale.add_workload(parser, b=8, completion=512)
    parser.add_argument("--cycles", type=int, default=2, help="timed cycles (after one warm-up)")
    parser.add_argument("--gpu-share", type=float, default=0.5, help="vLLM's gpu_memory_utilization")
    parser.add_argument("--root", default=None, help="scratch directory for the models (default: a temp dir)")
    parser.add_argument("--json", default=None, help="also write the figures here, after each case")
    args = parser.parse_args(argv)
    gpu_scale.require_positive(parser, args, (*gpu_scale.WORKLOAD, "cycles"))
    if not 0 < args.gpu_share < 1:
        parser.error(f"--gpu-share must be in (0, 1) (got {args.gpu_share})")
    return args


def refusal(cuda_available: bool, allocator_importable: bool) -> str | None:
    """Why this host cannot run the bench (None: it can)."""
    if not cuda_available:
        return "bench/gpu_sleep.py needs a CUDA GPU; torch sees none here."
    if not allocator_importable:
        return (
            "bench/gpu_sleep.py needs vLLM's sleep-mode allocator (vllm.device_allocator.cumem and its "
            "vllm.cumem_allocator extension): install the gpu flavor (make setup FLAVOR=gpu)."
        )
    return None


def _sums(state) -> dict[str, float]:
    """Per-tensor float64 sums of bf16 weights (computed on the GPU): equal ⇔ the same
    weights here, where every version differs from the last in every tensor."""
    import torch

    return {name: float(t.to(torch.bfloat16).double().sum()) for name, t in state.items()}


def _used_gib() -> float:
    import torch

    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**30


def _worker(model_dir: str, share: float, commands, replies) -> None:
    """The inference worker's half: the model and a KV cache in vLLM's sleep-mode pool."""
    import torch
    from vllm.device_allocator.cumem import CuMemAllocator

    from workers.inference.transformers_backend import TransformersBackend
    from workers.sync.cuda_ipc import CudaIpcReceiver

    allocator = CuMemAllocator.get_instance()
    with allocator.use_memory_pool(tag="weights"):
        backend = TransformersBackend(model_dir, dtype="bfloat16", device="cuda")
    model = backend.model
    weight_bytes = allocator.get_current_usage()
    total = torch.cuda.mem_get_info()[1]
    # vLLM gives its KV cache what gpu_memory_utilization leaves beside the weights
    # (activations' headroom aside, which this stand-in does not need).
    kv_bytes = max(int(share * total) - weight_bytes, 0)
    with allocator.use_memory_pool(tag="kv_cache"):
        kv_cache = torch.ones(kv_bytes, dtype=torch.uint8, device="cuda")
    receiver = CudaIpcReceiver()
    saved_buffers: dict[str, torch.Tensor] = {}
    replies.put({"weight_gib": weight_bytes / 2**30, "kv_gib": kv_bytes / 2**30})
    while (command := commands.get()) is not None:
        op, arg = command
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out: dict = {}
        if op == "connect":
            receiver.connect(arg, 1)
        elif op == "sleep":
            if arg == 2:  # as vLLM's Worker.sleep: buffers (rotary tables) survive level 2
                saved_buffers = {name: b.cpu().clone() for name, b in model.named_buffers()}
            allocator.sleep(offload_tags=("weights",) if arg == 1 else ())
        elif op == "wake":
            allocator.wake_up(tags=[arg])
            if arg == "weights" and saved_buffers:
                for name, b in model.named_buffers():
                    b.data.copy_(saved_buffers[name].data)
                saved_buffers = {}
        elif op == "sync":
            receiver.apply(backend, receiver.receive(arg))
        torch.cuda.synchronize()
        out["s"] = time.perf_counter() - t0
        if op in ("sync", "sums") or (op, arg) == ("wake", "weights"):
            out["sums"] = _sums(model.state_dict())
        replies.put(out)
    del kv_cache
    backend.close()


def _reply(replies, proc, timeout_s: float = 300.0):
    """The worker's next reply; an error as soon as the worker has died, not at the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return replies.get(timeout=5)
        except queue.Empty:
            if not proc.is_alive():
                raise RuntimeError(f"the worker process exited with code {proc.exitcode}") from None
            if time.monotonic() > deadline:
                raise TimeoutError(f"no reply from the worker process within {timeout_s:.0f} s") from None


def cycle_case(model_dir: str, params: int, args, level: int) -> dict:
    """One size at one sleep level: warm-up cycle, then `--cycles` timed ones."""
    import torch
    import torch.multiprocessing as mp

    from workers.model.lora import effective_state_dict
    from workers.sync.cuda_ipc import CudaIpcSender
    from workers.train.trainer import Trainer

    ctx = mp.get_context("spawn")
    commands, replies = ctx.Queue(), ctx.Queue()

    proc = ctx.Process(target=_worker, args=(model_dir, args.gpu_share, commands, replies), daemon=True)
    proc.start()

    def ask(op, arg=None) -> dict:
        commands.put((op, arg))
        return _reply(replies, proc)

    pool = _reply(replies, proc)
    cfg = gpu_scale.trainer_config(model_dir, params, args, torch.device("cuda"), sleep_level=level)
    lora = cfg.lora.enabled
    trainer = Trainer(cfg, model_dir, device=torch.device("cuda"))
    assert trainer.offload is not None, "a CUDA trainer at sleep_level ≥ 1 offloads its moments"
    sender = CudaIpcSender(wire_dtype=torch.bfloat16)
    sender.attach(trainer.model)
    ask("connect", sender.endpoint())
    sender.connect()
    groups = gpu_scale.rollouts(args.b, args.g, args.prompt, args.completion)
    held = ask("sums")["sums"]
    cycles = []
    for version in range(1, args.cycles + 2):
        row: dict = {"used_awake_gib": _used_gib()}
        row["sleep_s"] = ask("sleep", level)["s"]
        row["used_asleep_gib"] = _used_gib()
        torch.cuda.reset_peak_memory_stats()
        resident = torch.cuda.memory_allocated()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        trainer.train_step(groups)
        torch.cuda.synchronize()
        row["step_s"] = time.perf_counter() - t0
        row["used_trainer_peak_gib"] = row["used_asleep_gib"] + (torch.cuda.max_memory_allocated() - resident) / 2**30
        row["used_after_step_gib"] = _used_gib()
        woke = ask("wake", "weights")
        row["wake_weights_s"] = woke["s"]
        if level == 1 and woke["sums"] != held:
            raise AssertionError(f"version {version - 1}: level 1 did not give the weights back bit for bit")
        sent = sender.send(version, lambda notice: commands.put(("sync", notice)))
        synced = _reply(replies, proc)
        row["sync_ms"] = synced["s"] * 1e3 + sent.trainer_ms
        expected = _sums(effective_state_dict(trainer.model))
        got = {name: synced["sums"][name] for name in expected}
        if got != expected:
            raise AssertionError(f"version {version}: the worker's weights differ from the trainer's")
        held = synced["sums"]
        # The version's buffer goes once the worker has loaded it, as vLLM's ipc engine
        # releases what it exported when update_weights returns: the KV cache wakes into
        # that memory (the project's own cuda_ipc sender keeps the newest version until
        # the next send, which a GPU shared with a waking KV cache cannot afford).
        sender.close()
        gpu_scale._release(torch.device("cuda"))
        row["wake_kv_cache_s"] = ask("wake", "kv_cache")["s"]
        row["used_awake_after_gib"] = _used_gib()
        cycles.append(row)
    commands.put(None)
    proc.join(120)
    sender.close()
    del trainer
    gpu_scale._release(torch.device("cuda"))
    timed = cycles[1:]
    out = {key: sum(r[key] for r in timed) / len(timed) for key in timed[0]}
    out.update(pool)
    out.update(level=level, mode="lora r32" if lora else "full", cycles=len(timed))
    return out


def table(rows: list[dict]) -> str:
    lines = [
        "| model | level | trainer | vLLM pool GiB (weights + KV) | in use awake GiB | asleep GiB | trainer peak GiB "
        "| sleep s | trainer step s | wake weights s | sync ms | wake KV s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['level']} | {r['mode']} | {r['weight_gib']:.1f} + {r['kv_gib']:.1f} | "
            f"{r['used_awake_gib']:.1f} | {r['used_asleep_gib']:.1f} | {r['used_trainer_peak_gib']:.1f} | "
            f"{r['sleep_s']:.2f} | {r['step_s']:.2f} | {r['wake_weights_s']:.2f} | {r['sync_ms']:.1f} | "
            f"{r['wake_kv_cache_s']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    try:
        import vllm.device_allocator.cumem as cumem

        importable = bool(cumem.cumem_available)
    except ImportError:
        importable = False
    refused = refusal(torch.cuda.is_available(), importable)
    if refused:
        print(refused, file=sys.stderr)
        return 2
    root = args.root or tempfile.mkdtemp(prefix="rollway-gpu-sleep-")
    print(
        f"# {torch.cuda.get_device_name()} · torch {torch.__version__} · B×G={args.b}×{args.g} · "
        f"{args.prompt}+{args.completion} tokens · vLLM share {args.gpu_share}"
    )
    rows = []
    for size in args.sizes:
        model_dir, params = gpu_scale.build(size, root, torch.device("cuda"))
        for level in args.levels:
            row = {"model": f"Qwen2.5-{size} shape", "params": params, **cycle_case(model_dir, params, args, level)}
            rows.append(row)
            print(json.dumps(row), flush=True)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(rows, f, indent=1)
    print()
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
