"""Scale-out on this machine: a trainer pool of 1 or 2 ranks, on one Ray node or two.

Each configuration is one run of the same preset, task and seed through the real run
driver, on a Ray cluster of `ray start` nodes on this machine (ops/local_cluster.py): a
head alone, or a head and a second node with the inference worker on the head
(pool=rollout) and the trainer pool on the second node (pool=train), weights crossing
by the sync protocol.

Per configuration, over steps 2..N: the trainer's step time, samples/s, the trainer's
busy fraction, each rank's share of its step with a collective in flight (all-reduce,
all-gather, reduce-scatter) and the bytes it moved, the weight-sync latency, and the
1-minute load average at the end. On a 2-core host a second rank or node adds no
compute: the figures say where the time goes (communication, the ranks sharing two
cores), not a speed-up; on a GPU cluster each rank has a device of its own.

    .venv/bin/python bench/scale_out.py                       # the five configurations, 20 steps
    .venv/bin/python bench/scale_out.py --configs 1r-1n,2r-ddp-1n --steps 10 --json out.json
    .venv/bin/python bench/scale_out.py --set sync.protocol=collective
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# name → (trainer section, nodes)
CONFIGS: dict[str, tuple[dict, int]] = {
    "1r-1n": ({"backend": "single", "num_ranks": 1}, 1),
    "2r-ddp-1n": ({"backend": "ddp", "num_ranks": 2}, 1),
    "2r-fsdp2-1n": ({"backend": "fsdp2", "num_ranks": 2}, 1),
    "1r-2n": ({"backend": "single", "num_ranks": 1}, 2),
    "2r-ddp-2n": ({"backend": "ddp", "num_ranks": 2}, 2),
}
TWO_NODES = {"placement": {"inference_node": "pool=rollout", "trainer_node": "pool=train"}}


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of {', '.join(CONFIGS)}")
    p.add_argument("--steps", type=int, default=20, help="trainer steps per run (≥ 3)")
    p.add_argument("--preset", default="async")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override, dotted")
    p.add_argument("--json", help="write the figures here too")
    args = p.parse_args(argv)
    unknown = [c for c in args.configs.split(",") if c not in CONFIGS]
    if unknown:
        p.error(f"--configs: unknown {unknown}; choose from {', '.join(CONFIGS)}")
    if args.steps < 3:
        p.error(f"--steps must be ≥ 3 (got {args.steps}): step 1 is left out of every figure")
    return args


def figures(out: dict, ranks: int) -> dict:
    """Steps 2..N of one run's series."""
    s = {name: dict(points) for name, points in out["series"].items()}
    steps = sorted(s["trainer/step_s"])[1:]

    def mean(name: str) -> float:
        values = [s[name][k] for k in steps if k in s.get(name, {})]
        return statistics.mean(values) if values else float("nan")

    row = {
        "step_s": mean("trainer/step_s"),
        "samples_per_s": mean("samples/per_s"),
        "trainer_busy": 1 - mean("trainer/idle_frac"),
        "sync_ms": mean("sync/latency_ms"),
        "reward_last": s["reward/mean"][max(s["reward/mean"])],
    }
    if "trainer/rank_comm_s/0" in s:
        comm = [mean(f"trainer/rank_comm_s/{r}") for r in range(ranks)]
        compute = [mean(f"trainer/rank_compute_s/{r}") for r in range(ranks)]
        row["comm_share"] = [c / (c + k) for c, k in zip(comm, compute, strict=True)]
        row["comm_mb"] = [mean(f"trainer/rank_comm_bytes/{r}") / 2**20 for r in range(ranks)]
        row["rank_busy"] = [mean(f"trainer/rank_busy_frac/{r}") for r in range(ranks)]
    return row


def run_one(name: str, args: argparse.Namespace, cache_dir: str, run_id: int) -> dict:
    import ray

    from workers.config.presets import build, deep_merge
    from workers.core.merge import parse_sets
    from workers.core.run_actors import NAMESPACE
    from workers.run.driver import RunDriver
    from workers.run.lifecycle import on_the_head

    trainer, nodes = CONFIGS[name]
    overrides = deep_merge(
        {"trainer": trainer, "stop": {"max_steps": args.steps, "max_minutes": 20}},
        TWO_NODES if nodes == 2 else {},
    )
    cfg = build(args.preset, deep_merge(overrides, parse_sets(args.set)))
    driver = RunDriver.options(name=f"run-{run_id}", namespace=NAMESPACE, **on_the_head()).remote(
        run_id, cfg.model_dump(mode="json"), None, "", cache_dir, exit_when_done=False
    )
    try:
        out = ray.get(driver.run.remote())
    finally:
        ray.kill(driver)
    if out["state"] != "succeeded":
        raise SystemExit(f"{name}: the run {out['state']}: {out['error']}")
    row = figures(out, trainer["num_ranks"])
    row["load"] = os.getloadavg()[0]
    row["placement"] = [(p["actor"], p["labels"].get("pool", "-"), p["node_id"][:8]) for p in out["placement"]]
    return row


def connect(nodes: int, home: Path):
    """A cluster of `nodes` `ray start` nodes for one configuration (ops/local_cluster.py:
    one node is a head alone), joined from this process."""
    import ray

    from ops.local_cluster import LocalCluster, Node
    from workers.core.run_actors import NAMESPACE

    layout = [Node(labels={"pool": "rollout"}), Node(labels={"pool": "train"})][:nodes]
    cluster = LocalCluster(home, layout).start()
    os.environ.update(cluster.env())
    ray.init(address=cluster.address, namespace=NAMESPACE, log_to_driver=False)
    return cluster


def table(rows: dict[str, dict]) -> str:
    head = (
        f"{'config':<13} {'step s':>7} {'samples/s':>9} {'trainer busy':>12} {'comm share':>12} "
        f"{'MB/rank/step':>12} {'sync ms':>8} {'load':>5}"
    )
    lines = [head, "-" * len(head)]
    for name, r in rows.items():
        share = "/".join(f"{x:.0%}" for x in r.get("comm_share", [])) or "-"
        mb = "/".join(f"{x:.1f}" for x in r.get("comm_mb", [])) or "-"
        lines.append(
            f"{name:<13} {r['step_s']:>7.3f} {r['samples_per_s']:>9.1f} {r['trainer_busy']:>12.0%} {share:>12} "
            f"{mb:>12} {r['sync_ms']:>8.1f} {r['load']:>5.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    args = parse(argv)
    import ray

    cache_dir = os.path.join(tempfile.gettempdir(), "rollway-bench-cache")  # warm starts, built once per machine
    rows: dict[str, dict] = {}
    for k, name in enumerate(args.configs.split(",")):
        home = Path(tempfile.mkdtemp(prefix="rwso-"))  # short: Ray's socket paths
        cluster = connect(CONFIGS[name][1], home)
        try:
            rows[name] = run_one(name, args, cache_dir, 9600 + k)
        finally:
            ray.shutdown()
            cluster.stop()
            for key in cluster.env():
                os.environ.pop(key, None)
            shutil.rmtree(home, ignore_errors=True)
        print(f"{name}: done, step {rows[name]['step_s']:.3f} s", flush=True)
    print()
    print(table(rows))
    print(f"\n{os.cpu_count()} CPUs; load average (1 min) after each run in the last column.")
    for name, r in rows.items():
        where = ", ".join(f"{a} → {pool} ({node})" for a, pool, node in r["placement"])
        print(f"{name}: {where}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    # platform/ is a source root (ops.local_cluster), not an installed package.
    sys.path.insert(0, str(REPO / "platform"))
    raise SystemExit(main(sys.argv[1:]))
