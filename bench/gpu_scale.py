"""The engine's pieces on one GPU at real model shapes: trainer step, torch inference, CUDA-IPC sync.

Random-weight models with the shapes of Qwen2.5-0.5B, 1.5B and 7B (their published
config values; no weights are downloaded) are written as Hugging Face directories under
a scratch directory and driven through the engine's own classes:

- the trainer (`workers.train.trainer.Trainer`): one GRPO step on B × G synthetic rollouts of
  `--prompt` + `--completion` tokens, bf16 mixed precision (float32 masters), with
  micro-batches and gradient checkpointing; full fine-tuning where AdamW's float32
  state fits the GPU (16 bytes a parameter), LoRA otherwise; its model FLOPs and MFU
  counted as the trainer's `trainer/mfu` series counts them (workers/train/mfu.py: the
  device's dense bf16 peak from its name, or ROLLWAY_PEAK_TFLOPS; "—" for a device
  with no known peak);
- with `--parts turns`, the same step by a trainer taking turns with a sleeping vLLM
  (`inference.sleep_level` 1, workers/train/offload.py): its AdamW moments in pinned host
  memory between steps, each way timed, and what the process holds on the GPU between
  steps (allocated and reserved) beside the resident trainer's;
- the torch inference backend (`workers.inference.transformers_backend`): batched
  sampling of `--gen-rows` rows × `--gen-tokens` tokens in bf16, tokens/s;
- the "cuda_ipc" weight sync (`workers.sync.cuda_ipc`): the trainer's process packs its
  bf16 weights into one GPU buffer and a second process maps it and loads it into its
  own model on the same GPU; per side and end to end, checked bit for bit;
- with `--parts vllm_ipc` (vLLM installed), the same sync through vLLM's own IPC engine
  pair as a run into vLLM drives it (`workers.sync.engine_ipc`): vLLM's trainer engine
  exports a handle per tensor, vLLM's worker engine maps them and loads them into the
  second process's model (by checkpoint name: vLLM's model runner is not in it).

Prints one table row per model; `--json` also writes the figures. Needs a CUDA GPU:

    python bench/gpu_scale.py --sizes 0.5b 1.5b 7b
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

import torch  # noqa: E402

from workers.core.devices import synchronize  # noqa: E402
from workers.train.mfu import mfu  # noqa: E402

# Qwen2.5's published shapes (config.json of the Qwen/Qwen2.5-*B checkpoints).
SHAPES = {
    "0.5b": {
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,
    },
    "1.5b": {
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,
    },
    # Not a Qwen size: a smoke test of the script itself (runs on the CPU too).
    "tiny": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,
    },
    "7b": {
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "tie_word_embeddings": False,
    },
}
VOCAB = 151_936
EOS = 151_643
# AdamW float32 masters: weights, gradients and two moments, 4 bytes each.
FULL_FT_BYTES_PER_PARAM = 16


def save_random(path: str, config_class, model_class, device: torch.device, **shape) -> int:
    """A random-weight model of `shape` (a transformers config class's fields) saved as a
    bf16 HF directory at `path`, on the project's vocabulary; its parameter count."""
    config = config_class(
        vocab_size=VOCAB,
        max_position_embeddings=32_768,
        eos_token_id=EOS,
        pad_token_id=EOS,
        bos_token_id=EOS,
        dtype="bfloat16",
        **shape,
    )
    torch.manual_seed(0)
    with device:
        model = model_class(config).to(torch.bfloat16)
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(path)
    del model
    _release(device)
    return params


def build(size: str, root: str, device: torch.device) -> tuple[str, int]:
    """A random-weight Qwen2 of `size`'s shape saved as a bf16 HF directory; (dir, params)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    path = os.path.join(root, f"qwen2.5-{size}")
    shape = {"rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6, **SHAPES[size]}
    return path, save_random(path, Qwen2Config, Qwen2ForCausalLM, device, **shape)


WORKLOAD = ("b", "g", "prompt", "completion", "micro")


def add_workload(parser: argparse.ArgumentParser, b: int, completion: int) -> None:
    """The trainer's batch flags the GPU benches share: B groups of G completions of
    `--prompt` + `--completion` tokens, in micro-batches of `--micro` rows."""
    parser.add_argument("--b", type=int, default=b, help="groups per trainer step")
    parser.add_argument("--g", type=int, default=8, help="completions per group")
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--completion", type=int, default=completion)
    parser.add_argument("--micro", type=int, default=8, help="trainer.micro_batch_rows")


def require_positive(parser: argparse.ArgumentParser, args: argparse.Namespace, names) -> None:
    """A parser error naming the first of `names` below 1."""
    for name in names:
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be ≥ 1 (got {getattr(args, name)})")


def _release(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def rollouts(b: int, g: int, prompt: int, completion: int, seed: int = 0):
    from workers.core.records import Group, Rollout

    rng = random.Random(seed)
    groups = []
    for k in range(b):
        p = [rng.randrange(VOCAB - 1000) for _ in range(prompt)]
        group = Group(group_id=f"g{k}", prompt="", answer="")
        for _ in range(g):
            c = [rng.randrange(VOCAB - 1000) for _ in range(completion)]
            group.rollouts.append(
                Rollout(
                    prompt_ids=p,
                    completion_ids=c,
                    behaviour_logprobs=[-12.0 + rng.random() for _ in c],
                    token_versions=[0] * len(c),
                    finish_reason="length",
                    reward=rng.random(),
                    group_id=f"g{k}",
                )
            )
        groups.append(group)
    return groups


def trainer_config(model_dir: str, params: int, args, device: torch.device, sleep_level: int = 0):
    """The benches' trainer: bf16 mixed precision, micro-batches, checkpointed; full
    fine-tuning where AdamW's float32 state fits the GPU, LoRA r=32 otherwise."""
    from workers.config.run_config import RunConfig

    total = torch.cuda.mem_get_info(device)[1] if device.type == "cuda" else float("inf")
    lora = params * FULL_FT_BYTES_PER_PARAM > 0.7 * total
    return RunConfig.model_validate(
        {
            "model": {"source": "path", "path": model_dir},
            "warm_start": {"steps": 0, "noisy_steps": 0},
            "trainer": {
                "batch_groups": args.b,
                "group_size": args.g,
                "dtype": "bfloat16",
                "micro_batch_rows": args.micro,
                "gradient_checkpointing": True,
                "lr": 1e-6,
            },
            "lora": {"enabled": lora, "rank": 32},
            "inference": {"max_new_tokens": args.completion, "sleep_level": sleep_level},
        }
    )


def trainer_step(model_dir: str, params: int, args, device: torch.device, turns: bool = False) -> dict:
    """The trainer's step; with `turns`, as a trainer taking turns with a sleeping vLLM
    (inference.sleep_level 1): its AdamW moments in host memory between steps."""
    from workers.train.trainer import Trainer

    cfg = trainer_config(model_dir, params, args, device, sleep_level=1 if turns else 0)
    lora = cfg.lora.enabled
    t0 = time.perf_counter()
    trainer = Trainer(cfg, model_dir, device=device)
    load_s = time.perf_counter() - t0
    groups = rollouts(args.b, args.g, args.prompt, args.completion)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(1 + args.steps):  # the first step warms the kernels up
        synchronize(device)
        t0 = time.perf_counter()
        metrics = trainer.train_step(groups)
        synchronize(device)
        times.append(time.perf_counter() - t0)
    tokens = args.b * args.g * (args.prompt + args.completion)
    step = sum(times[1:]) / len(times[1:])
    # The trainer's own count and peak, as its trainer/mfu series has them.
    flops = trainer.flops.of_sequences([args.prompt + args.completion] * (args.b * args.g))
    out = {
        "mode": "lora r32" if lora else "full",
        "load_s": load_s,
        "step_s": step,
        "train_tokens_per_s": tokens / step,
        "model_tflops": flops / step / 1e12,
        "mfu": mfu(flops, step, trainer.peak_flops) if trainer.peak_flops else None,
        "samples_per_s": args.b * args.g / step,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan"),
        "loss_finite": bool(torch.isfinite(torch.tensor(metrics["loss"]))),
    }
    if device.type == "cuda":
        # What the trainer's process holds between steps, while vLLM would generate: its
        # live tensors, and what the caching allocator keeps from the driver.
        out["between_allocated_gib"] = torch.cuda.memory_allocated() / 2**30
        out["between_reserved_gib"] = torch.cuda.memory_reserved() / 2**30
    if turns:
        out = {f"turns_{k}": v for k, v in out.items()}
        assert trainer.offload is not None, "a CUDA trainer at sleep_level 1 offloads"
        out["turns_load_s"] = trainer.offload.load_s
        out["turns_offload_s"] = trainer.offload.offload_s
    del trainer
    _release(device)
    return out


def generation(model_dir: str, args, device: torch.device) -> dict:
    from workers.inference.transformers_backend import TransformersBackend

    backend = TransformersBackend(model_dir, dtype="bfloat16", device=device)
    rng = random.Random(1)
    prompts = [[rng.randrange(VOCAB - 1000) for _ in range(args.prompt)] for _ in range(args.gen_rows // 8)]
    backend.generate(prompts[:1], 1, 4, 1.0, 0)  # warm-up
    synchronize(device)
    t0 = time.perf_counter()
    out = backend.generate(prompts, 8, args.gen_tokens, 1.0, 0)
    synchronize(device)
    wall = time.perf_counter() - t0
    tokens = sum(len(c.token_ids) for group in out for c in group)
    backend.close()
    _release(device)
    return {"gen_tokens_per_s": tokens / wall, "gen_s": wall, "gen_tokens": tokens}


def _fingerprint(model: torch.nn.Module) -> list[float]:
    """Per-tensor float64 sums (computed on the GPU): equal lists ⇔ the same weights
    here, where every version differs from the last in every tensor."""
    return [float(t.double().sum()) for _, t in sorted(model.state_dict().items())]


class VllmIpcTarget:
    """A vLLM backend's four weight-transfer calls, answered by vLLM's own worker-side
    IPC engine (`IPCWeightTransferEngine`), which loads into `model` by checkpoint name:
    vLLM's IPC pair on the GPU without vLLM's model runner (whose loader would fuse
    q/k/v and gate/up, and whose layerwise reload wraps the update)."""

    transfer_engine = "ipc"

    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        from types import SimpleNamespace

        from vllm.config import WeightTransferConfig
        from vllm.distributed.weight_transfer.ipc_engine import IPCWeightTransferEngine

        self.model = model
        self.labels: list[str | None] = []  # the version each finished update was labelled with
        no_runner = SimpleNamespace(parallel_config=None, model_config=None)
        self.engine = IPCWeightTransferEngine(WeightTransferConfig(backend="ipc"), no_runner, device, self)

    def load_weights(self, weights) -> None:  # what vLLM's engine calls on its model
        state = self.model.state_dict()
        with torch.no_grad():
            for name, tensor in weights:
                state[name].copy_(tensor)

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self.engine.init_transfer_engine(self.engine.parse_init_info(init_info))

    def start_weight_update(self) -> None:
        pass

    def update_weights(self, update_info: dict) -> None:
        self.engine.update_weights(update_info)

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.labels.append(weight_version)


def _receiver(model_dir: str, notices, replies, via_vllm: bool) -> None:
    from workers.inference.transformers_backend import TransformersBackend

    backend = TransformersBackend(model_dir, dtype="bfloat16", device="cuda")
    if via_vllm:
        from workers.sync.engine_ipc import EngineIpcReceiver

        target = VllmIpcTarget(backend.model, torch.device("cuda", torch.cuda.current_device()))
        receiver = EngineIpcReceiver(target)
    else:
        from workers.sync.cuda_ipc import CudaIpcReceiver

        target, receiver = backend, CudaIpcReceiver()
    receiver.connect(notices.get(), 1)
    replies.put("connected")
    while (notice := notices.get()) is not None:
        report = receiver.apply(target, receiver.receive(notice))
        replies.put((report, _fingerprint(backend.model)))


def ipc_sync(model_dir: str, args, via_vllm: bool = False) -> dict:
    """The "cuda_ipc" sync between two processes on one GPU: the project's own protocol,
    or (`via_vllm`) vLLM's IPC engine pair driven by the trainer (workers/sync/engine_ipc.py).
    Keys "sync_…", or "vllm_ipc_…" for vLLM's pair."""
    import torch.multiprocessing as mp

    from workers.config.run_config import SyncConfig
    from workers.model.loading import load_model

    ctx = mp.get_context("spawn")
    notices, replies = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_receiver, args=(model_dir, notices, replies, via_vllm), daemon=True)
    proc.start()
    model = load_model(model_dir, "bfloat16").cuda()
    if via_vllm:
        from workers.sync.engine_ipc import EngineIpcSender

        sender = EngineIpcSender(SyncConfig(protocol="cuda_ipc", timeout_s=600), num_receivers=1)
    else:
        from workers.sync.cuda_ipc import CudaIpcSender

        sender = CudaIpcSender()
    sender.attach(model)
    notices.put(sender.endpoint())
    assert replies.get(timeout=600) == "connected"
    sender.connect()
    rows = []
    for version in range(1, args.syncs + 2):
        with torch.no_grad():  # a "step": every tensor changes
            for p in model.parameters():
                p.add_(1e-3 * version)
        sent = sender.send(version, notices.put)
        got, fingerprint = replies.get(timeout=600)
        if fingerprint != _fingerprint(model):
            raise AssertionError(f"version {version}: the worker's weights differ from the trainer's")
        rows.append((sent, got))
    notices.put(None)
    proc.join(60)
    sender.close()
    timed = rows[1:]  # the first maps the allocator's handles for the first time

    def mean(xs):
        return sum(xs) / len(xs)

    key = "vllm_ipc" if via_vllm else "sync"
    return {
        f"{key}_bytes": rows[-1][0].bytes,
        f"{key}_tensors": rows[-1][0].tensors,
        f"{key}_trainer_ms": mean([s.trainer_ms for s, _ in timed]),
        f"{key}_receive_ms": mean([g.receive_ms for _, g in timed]),
        f"{key}_inference_ms": mean([g.inference_ms for _, g in timed]),
        f"{key}_end_to_end_ms": mean([g.end_to_end_ms for _, g in timed]),
        f"{key}_identical": True,
    }


def _held(row: dict, prefix: str) -> str:
    """What the trainer's process held on the GPU between steps: allocated / reserved GiB."""
    if f"{prefix}between_reserved_gib" not in row:
        return "—"
    return f"{row[prefix + 'between_allocated_gib']:.1f} / {row[prefix + 'between_reserved_gib']:.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["0.5b", "1.5b", "7b"], choices=list(SHAPES))
    parser.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke test (no sync part)")
    add_workload(parser, b=8, completion=512)
    parser.add_argument("--steps", type=int, default=2, help="timed trainer steps (after one warm-up)")
    parser.add_argument("--gen-rows", type=int, default=64)
    parser.add_argument("--gen-tokens", type=int, default=256)
    parser.add_argument("--syncs", type=int, default=4, help="timed syncs (after one warm-up)")
    parser.add_argument(
        "--parts",
        nargs="+",
        default=["train", "generate", "sync"],
        choices=["train", "turns", "generate", "sync", "vllm_ipc"],
        help="turns: the trainer step again, taking turns with a sleeping vLLM (its moments offloaded between "
        "steps); vllm_ipc: the sync through vLLM's IPC engine pair (vLLM installed)",
    )
    parser.add_argument("--root", default=None, help="scratch directory for the models (default: a temp dir)")
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args()
    require_positive(parser, args, (*WORKLOAD, "steps", "gen_rows", "gen_tokens", "syncs"))
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench/gpu_scale.py: no CUDA GPU here (--device cpu runs a smoke test)", file=sys.stderr)
        return 2
    for part in ("sync", "turns", "vllm_ipc"):
        if device.type != "cuda" and part in args.parts:
            print(f"bench/gpu_scale.py: '{part}' needs a GPU; leave it out of --parts", file=sys.stderr)
            return 2
    root = args.root or tempfile.mkdtemp(prefix="rollway-gpu-")
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    print(f"# {name} · torch {torch.__version__} · "
          f"B×G={args.b}×{args.g} · {args.prompt}+{args.completion} tokens · micro {args.micro}")  # fmt: skip
    results = {}
    for size in args.sizes:
        t0 = time.perf_counter()
        model_dir, params = build(size, root, device)
        row = {"params": params, "build_s": time.perf_counter() - t0}
        if "train" in args.parts:
            row.update(trainer_step(model_dir, params, args, device))
        if "turns" in args.parts:
            row.update(trainer_step(model_dir, params, args, device, turns=True))
        if "generate" in args.parts:
            row.update(generation(model_dir, args, device))
        if "sync" in args.parts:
            row.update(ipc_sync(model_dir, args))
        if "vllm_ipc" in args.parts:
            row.update(ipc_sync(model_dir, args, via_vllm=True))
        results[size] = row
        print(json.dumps({size: row}), flush=True)
    print()
    print("| model | params | trainer | step s | train tok/s | model TFLOP/s | MFU | samples/s | peak GiB | "
          "gen tok/s | sync MB | IPC trainer ms | IPC worker ms | end to end ms |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for size, r in results.items():
        shown_mfu = "—" if r.get("mfu") is None else f"{r['mfu']:.1%}"  # no peak known for this device
        print(
            f"| Qwen2.5-{size} shape | {r['params'] / 1e9:.2f}B | {r.get('mode', '—')} | {r.get('step_s', 0):.2f} | "
            f"{r.get('train_tokens_per_s', 0):,.0f} | {r.get('model_tflops', 0):.1f} | {shown_mfu} | "
            f"{r.get('samples_per_s', 0):.1f} | {r.get('peak_gib', 0):.1f} | "
            f"{r.get('gen_tokens_per_s', 0):,.0f} | {r.get('sync_bytes', 0) / 1e6:,.0f} | "
            f"{r.get('sync_trainer_ms', 0):.1f} | {r.get('sync_inference_ms', 0):.1f} | "
            f"{r.get('sync_end_to_end_ms', 0):.1f} |"
        )
    if "turns" in args.parts or "train" in args.parts:
        print()
        print("| model | trainer | step s, resident | step s, taking turns | load s | offload s | "
              "held between steps GiB, resident (allocated / reserved) | taking turns |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|")
        nan = float("nan")
        for size, r in results.items():
            print(
                f"| Qwen2.5-{size} shape | {r.get('mode', r.get('turns_mode', '—'))} | {r.get('step_s', nan):.2f} | "
                f"{r.get('turns_step_s', nan):.2f} | {r.get('turns_load_s', nan):.2f} | "
                f"{r.get('turns_offload_s', nan):.2f} | {_held(r, '')} | {_held(r, 'turns_')} |"
            )
    if "vllm_ipc" in args.parts:
        print()
        print("| model | sync | MB | tensors | trainer ms | worker ms | end to end ms |")
        print("|---|---|---|---|---|---|---|")
        for size, r in results.items():
            for key, what in (("sync", "cuda_ipc (one flat buffer)"), ("vllm_ipc", "vLLM's ipc engine pair")):
                if f"{key}_bytes" in r:
                    print(
                        f"| Qwen2.5-{size} shape | {what} | {r[key + '_bytes'] / 1e6:,.0f} | "
                        f"{r.get(key + '_tensors', 0)} | {r[key + '_trainer_ms']:.1f} | "
                        f"{r[key + '_inference_ms']:.1f} | {r[key + '_end_to_end_ms']:.1f} |"
                    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
