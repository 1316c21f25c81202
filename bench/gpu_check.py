"""`make gpu-check`: the GPU path on one CUDA GPU, in one table, within about 10 minutes.

For each model shape (random weights, bf16: Qwen2.5-0.5B's and -1.5B's published shapes
and a small Qwen2-MoE; bench/gpu_scale.py writes them, nothing is downloaded) and each
placement on the one GPU:

- colocated: vLLM (`workers.inference.vllm_backend.VLLMBackend`, inference.sleep_level
  1) sleeps through the trainer's step and wakes for the weight sync, as
  workers/run/colocation.py has them take turns, and the trainer keeps its AdamW
  moments in host memory between steps, as a colocated trainer does;
- disaggregated: vLLM holds its share of the GPU (inference.gpu_memory_utilization)
  while the trainer trains beside it, a case for each share asked for (two by default);

it measures, through the engine's own classes: vLLM's generation tokens/s, the
trainer's tokens/s and MFU (bench/gpu_scale.py's step), the weight sync's latency into
vLLM through each weight-transfer engine asked for (`load_weights`; and, colocated,
vLLM's own `ipc` pair between two processes on the GPU, as a colocated `cuda_ipc` run's
trainer and vLLM are: bench/gpu_scale.py's `ipc_sync`, loading into a transformers
model where vLLM's model runner would load), vLLM's sleep and
wake times, each pool's peak memory, and `mismatch/kl` at staleness 0 (the trainer's
logprobs of vLLM's samples under the very weights that sampled them: the kernels' gap
alone). Prints one table; `--json` also writes the figures.

    python bench/gpu_check.py                      # make gpu-check
    python bench/gpu_check.py --inference torch    # a CUDA host without vLLM
    python bench/gpu_check.py --device cpu --sizes tiny --placements disaggregated

`--inference torch` puts the engine's torch backend (`TransformersBackend`) where vLLM
would be: the same generation, trainer, mismatch and routing figures on a GPU host
without vLLM, one resident case per model (no sleep mode, no weight-transfer engines: the
sync is its own `load_weights`). `--device cpu` is a dry run of the script itself
(vLLM-CPU, no sleep mode, no peak).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gpu_scale  # noqa: E402

PLACEMENTS = ("colocated", "disaggregated")
ENGINES = ("rollway_memory", "rollway_files")
# vLLM's IPC engine pair: a colocated case's, measured on CUDA beside ENGINES.
IPC = "ipc"
SIZES = ("0.5b", "1.5b", "moe", "tiny")
# A small Qwen2-MoE: 8 experts, 2 routed per token, a shared expert (Qwen1.5-MoE's
# layout at a fraction of its width and depth).
MOE = {
    "hidden_size": 1024,
    "num_hidden_layers": 12,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "moe_intermediate_size": 1024,
    "shared_expert_intermediate_size": 2048,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "tie_word_embeddings": False,
}
# A dry run's model (`--device cpu`): head_dim 32, which vLLM-CPU's attention takes.
TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "tie_word_embeddings": True,
}
# The table's columns: (heading, key, format). "—" where a case has no figure.
COLUMNS = (
    ("model", "model", "{}"),
    ("inference", "inference", "{}"),
    ("placement", "placement", "{}"),
    ("vLLM share", "gpu_share", "{:.0%}"),
    ("generation tok/s", "generation_tokens_per_s", "{:,.0f}"),
    ("trainer tok/s", "train_tokens_per_s", "{:,.0f}"),
    ("MFU", "mfu", "{:.1%}"),
    ("sync ms", "sync_ms", None),  # per engine: "rollway_memory 12.3"
    ("sleep s", "sleep_s", "{:.2f}"),
    ("wake s", "wake_s", "{:.2f}"),
    ("inference peak GiB", "inference_peak_gib", "{:.1f}"),
    ("trainer peak GiB", "trainer_peak_gib", "{:.1f}"),
    ("mismatch KL (staleness 0)", "mismatch_kl", "{:.2e}"),
    # MoE: the share of token × layer selections the trainer's router makes as the
    # inference backend's did, and the mismatch with its routing replayed
    # (correction.keep_routing); vLLM returns its routing on CUDA only.
    ("routing agreement", "routing_agreement", "{:.1%}"),
    ("KL, routing replayed", "mismatch_kl_replayed", "{:.2e}"),
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["0.5b", "1.5b", "moe"], choices=SIZES)
    parser.add_argument(
        "--inference",
        default="vllm",
        choices=("vllm", "torch"),
        help="torch: the engine's torch backend in vLLM's place, for a GPU host without vLLM (no sleep mode, "
        "no weight-transfer engines: its own load_weights)",
    )
    parser.add_argument("--placements", nargs="+", default=None, choices=PLACEMENTS)
    parser.add_argument("--engines", nargs="+", default=None, choices=ENGINES)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a dry run of the script")
    gpu_scale.add_workload(parser, b=4, completion=256)
    parser.add_argument("--steps", type=int, default=1, help="timed trainer steps (after one warm-up)")
    parser.add_argument(
        "--gpu-share",
        type=float,
        nargs="+",
        default=[0.3, 0.5],
        help="vLLM's gpu_memory_utilization: a disaggregated case for each; colocated takes the first",
    )
    parser.add_argument("--syncs", type=int, default=2, help="timed syncs through vLLM's ipc pair (after one)")
    parser.add_argument("--root", default=None, help="scratch directory for the models (default: a temp dir)")
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    gpu_scale.require_positive(parser, args, (*gpu_scale.WORKLOAD, "steps", "syncs"))
    for share in args.gpu_share:
        if not 0 < share < 1:
            parser.error(f"--gpu-share must be in (0, 1) (got {share}): vLLM shares the GPU with the trainer")
    if args.inference == "torch":
        # Colocated turns are vLLM's sleep mode, and the engines are vLLM's: the torch
        # backend stays resident beside the trainer and takes weights by load_weights.
        if args.placements and "colocated" in args.placements:
            parser.error("--placements colocated needs vLLM's sleep mode: use --inference vllm")
        if args.engines:
            parser.error("--engines names vLLM's weight-transfer engines: use --inference vllm")
        args.placements, args.engines = ["disaggregated"], ["load_weights"]
    else:
        args.placements = args.placements or list(PLACEMENTS)
        args.engines = args.engines or list(ENGINES)
    return args


def cases(args: argparse.Namespace, device_type: str) -> list[dict]:
    """The cases of one model: its placement, vLLM's share of the GPU, and the engines its
    sync goes through. Colocated vLLM sleeps through the trainer's turn, so one share; on
    CUDA its sync is also timed through vLLM's `ipc` pair, the engine of a colocated
    `cuda_ipc` run. Disaggregated: a case per share, the engines timed in the first (a
    sync's latency does not depend on the share); the torch backend has no share."""
    if args.inference == "torch":
        return [{"placement": "disaggregated", "gpu_share": None, "engines": list(args.engines)}]
    out = []
    for placement in args.placements:
        if placement == "colocated":
            ipc = [IPC] if device_type == "cuda" else []
            out.append({"placement": placement, "gpu_share": args.gpu_share[0], "engines": [*args.engines, *ipc]})
            continue
        for k, share in enumerate(args.gpu_share):
            out.append({"placement": placement, "gpu_share": share, "engines": list(args.engines[: 1 if k else None])})
    return out


def refusal(device: str, cuda_available: bool, cuda_count: int) -> str | None:
    """Why this host cannot run the check as asked (None: it can)."""
    if device == "cpu":
        return None
    if not cuda_available or cuda_count < 1:
        return (
            "bench/gpu_check.py needs a CUDA GPU and the gpu flavor (make setup FLAVOR=gpu); torch sees none here. "
            "--device cpu --sizes tiny is a dry run of the script on the CPU."
        )
    return None


def _cell(value, fmt: str | None) -> str:
    if value is None or (isinstance(value, float) and value != value):  # None or NaN
        return "—"
    if fmt is None:  # {engine: ms}
        return ", ".join(f"{engine} {ms:.1f}" for engine, ms in value.items()) or "—"
    return fmt.format(value)


def table(rows: list[dict]) -> str:
    """The rows as one Markdown table, a row per case, "—" for a figure a case lacks."""
    lines = [
        "| " + " | ".join(heading for heading, _, _ in COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(key), fmt) for _, key, fmt in COLUMNS) + " |")
    return "\n".join(lines)


def build(size: str, root: str, device) -> tuple[str, int, str]:
    """The model directory of `size`, its parameter count and its name in the table."""
    if size in gpu_scale.SHAPES and size != "tiny":
        path, params = gpu_scale.build(size, root, device)
        return path, params, f"Qwen2.5-{size} shape"
    import transformers

    moe = size == "moe"
    config_class = transformers.Qwen2MoeConfig if moe else transformers.Qwen2Config
    model_class = transformers.Qwen2MoeForCausalLM if moe else transformers.Qwen2ForCausalLM
    path = os.path.join(root, "qwen2-moe-small" if moe else "qwen2-tiny")
    params = gpu_scale.save_random(path, config_class, model_class, device, **(MOE if moe else TINY))
    return path, params, "Qwen2-MoE small" if moe else "tiny (dry run)"


def _used_gib(device) -> float:
    """The GPU's memory in use, every process's (vLLM's allocator is not torch's)."""
    import torch

    free, total = torch.cuda.mem_get_info(device)
    return (total - free) / 2**30


def _sleeps(args, device, placement: str) -> bool:
    """Whether the case's inference backend sleeps through the trainer's step: vLLM,
    colocated, on CUDA (vLLM-CPU and the torch backend have no sleep mode)."""
    return args.inference == "vllm" and placement == "colocated" and device.type == "cuda"


def _backend(model_dir: str, args, device, placement: str, engine: str, share: float | None):
    from workers.core.routing import router_shape
    from workers.model.loading import meta_model

    if args.inference == "torch":
        from workers.inference.transformers_backend import TransformersBackend

        moe = router_shape(meta_model(model_dir)) is not None
        return TransformersBackend(model_dir, dtype="bfloat16", device=device, record_routing=moe)
    from workers.config.run_config import InferenceConfig
    from workers.inference.vllm_backend import VLLMBackend

    sleep_level = 1 if _sleeps(args, device, placement) else 0
    cfg = InferenceConfig(backend="vllm", gpu_memory_utilization=share, sleep_level=sleep_level)
    return VLLMBackend(
        model_dir,
        cfg,
        dtype="bfloat16",
        max_model_len=args.prompt + args.completion,
        transfer_engine=engine,
        # vLLM returns routed experts from its V2 model runner only, which vLLM-CPU lacks.
        record_routing=device.type == "cuda" and router_shape(meta_model(model_dir)) is not None,
    )


def run_case(model_dir: str, params: int, args, device, case: dict) -> dict:
    """One model's case (`cases`): generate, train (vLLM asleep when colocated), measure
    the mismatch at staleness 0, and sync the trained weights through each engine."""
    import torch

    from workers.core.devices import autocast, synchronize
    from workers.train.loss import mismatch_kl
    from workers.train.trainer import pack, spread, token_logprobs

    placement, share = case["placement"], case["gpu_share"]
    row: dict = {"inference": args.inference, "placement": placement, "gpu_share": share, "sync_ms": {}}
    rng = random.Random(1)
    prompts = [[rng.randrange(gpu_scale.VOCAB - 1000) for _ in range(args.prompt)] for _ in range(args.b)]
    engines = [e for e in case["engines"] if e != IPC]
    for k, engine in enumerate(engines):
        before = _used_gib(device) if device.type == "cuda" else 0.0
        backend = _backend(model_dir, args, device, placement, engine, share)
        if device.type == "cuda":  # its weights and KV cache, allocated up front
            row["inference_peak_gib"] = _used_gib(device) - before
        if k == 0:
            backend.generate(prompts[:1], 1, 4, 1.0, 0)  # warm-up
            synchronize(device)
            t0 = time.perf_counter()
            groups = backend.generate(prompts, args.g, args.completion, 1.0, 0)
            synchronize(device)
            completions = [c for group in groups for c in group]
            row["generation_tokens_per_s"] = sum(len(c.token_ids) for c in completions) / (time.perf_counter() - t0)
        asleep = _sleeps(args, device, placement)
        if asleep:
            t0 = time.perf_counter()
            backend.sleep()
            row["sleep_s"] = time.perf_counter() - t0
        if k == 0:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            resident = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
            row.update(_trainer_figures(model_dir, params, args, device, turns=asleep))
            if device.type == "cuda":
                row["trainer_peak_gib"] = (torch.cuda.max_memory_allocated(device) - resident) / 2**30
            # Staleness 0: the trainer's logprobs of vLLM's samples under the weights
            # that sampled them (the trainer's initial weights, read from the directory).
            from workers.config.run_config import RunConfig
            from workers.train.trainer import Trainer

            cfg = RunConfig.model_validate(
                {"model": {"source": "path", "path": model_dir}, "warm_start": {"steps": 0, "noisy_steps": 0}}
            )
            trainer = Trainer(cfg, model_dir, device=device)
            rows = [(p, c) for p, group in zip(prompts, groups, strict=True) for c in group]
            batch = pack([p for p, _ in rows], [c.token_ids for _, c in rows], gpu_scale.EOS)
            behaviour = spread([c.logprobs for _, c in rows], batch).to(device)
            with torch.no_grad(), autocast(device, "bfloat16"):
                logp = token_logprobs(trainer.model, batch, 1.0)
            row["mismatch_kl"] = mismatch_kl(logp, behaviour, batch.mask.to(device)).item()
            if all(c.routing is not None for _, c in rows):
                row.update(_replayed(trainer, batch, rows, behaviour, device))
            weights = trainer.state_dict()
            del trainer
            gpu_scale._release(device)
        if asleep:
            t0 = time.perf_counter()
            backend.wake_up(("weights",))
            wake = time.perf_counter() - t0
        synchronize(device)
        t0 = time.perf_counter()
        backend.load_weights(weights)
        synchronize(device)
        row["sync_ms"][engine] = (time.perf_counter() - t0) * 1e3
        if asleep:
            t0 = time.perf_counter()
            backend.wake_up(("kv_cache",))
            row["wake_s"] = wake + time.perf_counter() - t0
        backend.close()
        gpu_scale._release(device)
    if IPC in case["engines"]:
        # Two processes on the GPU, as a colocated run's trainer and vLLM are: CUDA IPC
        # maps another process's memory, not the mapping process's own.
        row["sync_ms"][IPC] = gpu_scale.ipc_sync(model_dir, args, via_vllm=True)["vllm_ipc_end_to_end_ms"]
    return row


def _replayed(trainer, batch, rows, behaviour, device) -> dict:
    """The trainer's logprobs of vLLM's samples with vLLM's routing replayed: how often its
    own router agrees, and the mismatch KL left."""
    import torch

    from workers.core.devices import autocast
    from workers.core.routing import Replay, batch_routing
    from workers.train.loss import mismatch_kl
    from workers.train.trainer import token_logprobs

    first = rows[0][1].routing
    lengths = [len(p) + len(c.token_ids) for p, c in rows]
    forced = batch_routing([c.routing for _, c in rows], lengths, batch.input_ids.shape[1], first.layers, first.top_k)
    with torch.no_grad(), autocast(device, "bfloat16"), Replay(trainer.model) as replay, replay.use(forced.to(device)):
        logp = token_logprobs(trainer.model, batch, 1.0)
    return {
        "routing_agreement": replay.agreement.share,
        "mismatch_kl_replayed": mismatch_kl(logp, behaviour, batch.mask.to(device)).item(),
    }


def _trainer_figures(model_dir: str, params: int, args, device, turns: bool = False) -> dict:
    figures = gpu_scale.trainer_step(model_dir, params, args, device, turns=turns)
    return {"train_tokens_per_s": figures["train_tokens_per_s"], "mfu": figures["mfu"], "mode": figures["mode"]}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    refused = refusal(args.device, torch.cuda.is_available(), torch.cuda.device_count())
    if refused:
        print(refused, file=sys.stderr)
        return 2
    device = torch.device(args.device)
    root = args.root or tempfile.mkdtemp(prefix="rollway-gpu-check-")
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU (dry run)"
    print(
        f"# {name} · torch {torch.__version__} · inference {args.inference} · B×G={args.b}×{args.g} · "
        f"{args.prompt}+{args.completion} tokens"
    )
    rows = []
    for size in args.sizes:
        model_dir, params, label = build(size, root, device)
        for case in cases(args, device.type):
            t0 = time.perf_counter()
            row = {"model": label, "params": params, **run_case(model_dir, params, args, device, case)}
            row["case_s"] = time.perf_counter() - t0
            rows.append(row)
            print(json.dumps(row), flush=True)
    print()
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
