"""Rollout-buffer cost: what put + get cost per sample, in process and through Ray.

A sample is one rollout; a group is G rollouts of one prompt (the buffer's unit); a
batch is B groups (one trainer step). Rollouts are realistic `workers.core.records.Rollout`s
shaped by the default run config (prompt BOS + string + "=", completion of
`inference.max_new_tokens` tokens with logprobs and token versions).

Two paths, for each buffer mode's capacity (workers.run.buffer.plan):

- in process: `RolloutBuffer.put` per group, `get(B)` per batch, the buffer kept one
  batch short of its capacity (unbounded: `--unbounded-depth` batches deep) so every
  get also scans a realistic backlog for stale groups;
- Ray: the run's `BufferActor` (workers/run/actors.py) in this process's Ray, called the way
  the actors call it: one `put` per worker chunk of groups (a run with one worker puts
  a whole batch per call) and one `get(B)` per trainer step, each awaited.

The issue's target is ≤ 50 µs per sample for the in-process path.

    .venv/bin/python bench/buffer_cost.py
    .venv/bin/python bench/buffer_cost.py --batches 500 --ray-batches 100 --json out.json
    .venv/bin/python bench/buffer_cost.py --no-ray
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import time

from workers.config.run_config import BufferConfig, RunConfig
from workers.core.records import Group, Rollout
from workers.run.buffer import RolloutBuffer, plan

TARGET_US_PER_SAMPLE = 50.0
MODES = ("none", "double", "bounded", "unbounded")


def make_groups(n_groups: int, cfg: RunConfig, seed: int = 0) -> list[Group]:
    """`n_groups` groups of `trainer.group_size` rollouts, shaped like a run's."""
    rng = random.Random(seed)
    task, g = cfg.task, cfg.trainer.group_size
    groups = []
    for i in range(n_groups):
        prompt = "".join(rng.choice(task.alphabet) for _ in range(rng.randint(task.min_len, task.max_len)))
        prompt_ids = [1] + [rng.randrange(3, 40) for _ in prompt] + [2]
        rollouts = []
        for _ in range(g):
            n = rng.randint(len(prompt) + 1, cfg.inference.max_new_tokens)
            rollouts.append(
                Rollout(
                    prompt_ids=list(prompt_ids),
                    completion_ids=[rng.randrange(3, 40) for _ in range(n)],
                    behaviour_logprobs=[-rng.random() * 3 for _ in range(n)],
                    token_versions=[0] * n,
                    finish_reason="stop" if n < cfg.inference.max_new_tokens else "length",
                    reward=rng.random(),
                    group_id=f"g{i}",
                )
            )
        groups.append(Group(group_id=f"g{i}", prompt=prompt, answer=prompt[::-1], rollouts=rollouts))
    return groups


def capacity_batches(mode: str) -> int | None:
    """The mode's capacity in batches with the default buffer settings (None: unbounded)."""
    p = plan(BufferConfig(mode=mode), "async", batch_groups=1)
    return p.capacity_groups


def backlog_batches(mode: str, unbounded_depth: int) -> int:
    cap = capacity_batches(mode)
    return unbounded_depth if cap is None else cap - 1


def in_process(mode: str, groups: list[Group], b: int, batches: int, unbounded_depth: int) -> dict:
    """Seconds for `batches` rounds of B puts then one get(B), and the call count."""
    cap = capacity_batches(mode)
    buf = RolloutBuffer(None if cap is None else cap * b, max_staleness=1)
    backlog = backlog_batches(mode, unbounded_depth)
    for g in groups[: backlog * b]:
        buf.put(g)
    batch = groups[:b]
    start = time.perf_counter()
    for _ in range(batches):
        for g in batch:
            buf.put(g, timeout=1.0)
        buf.get(b, current_version=0, timeout=1.0)
    elapsed = time.perf_counter() - start
    if buf.depth != backlog * b or buf.dropped_stale:
        raise RuntimeError(f"{mode}: buffer ended at depth {buf.depth}, expected {backlog * b}")
    return {"seconds": elapsed, "calls": batches * (b + 1), "puts_per_batch": b}


def through_ray(mode: str, groups: list[Group], b: int, batches: int, unbounded_depth: int, warmup: int) -> dict:
    """The same rounds through a BufferActor: one put(B groups) and one get(B) per batch."""
    import ray

    from workers.run.actors import BufferActor

    cap = capacity_batches(mode)
    p = plan(BufferConfig(mode=mode), "async", batch_groups=b)
    actor = BufferActor.remote(dataclasses.replace(p, capacity_groups=None if cap is None else cap * b), b)
    try:
        backlog = backlog_batches(mode, unbounded_depth)
        for k in range(backlog):
            ray.get(actor.put.remote(groups[k * b : (k + 1) * b], 1.0))
        batch = groups[:b]
        put_s = get_s = 0.0
        for i in range(warmup + batches):
            t0 = time.perf_counter()
            accepted, _ = ray.get(actor.put.remote(batch, 1.0))
            t1 = time.perf_counter()
            got, _stats = ray.get(actor.get.remote(b, 0, 1.0))
            t2 = time.perf_counter()
            if accepted != b or got is None or len(got) != b:
                raise RuntimeError(f"{mode}: put accepted {accepted}, get returned {got and len(got)}")
            if i >= warmup:
                put_s += t1 - t0
                get_s += t2 - t1
    finally:
        ray.kill(actor)
    return {"seconds": put_s + get_s, "put_s": put_s, "get_s": get_s, "calls": 2 * batches, "puts_per_batch": 1}


def figures(r: dict, batches: int, b: int, g: int) -> dict:
    us = r["seconds"] * 1e6
    out = {
        "us_per_sample": us / (batches * b * g),
        "us_per_group": us / (batches * b),
        "us_per_call": us / r["calls"],
        "calls": r["calls"],
    }
    if "put_s" in r:
        out["us_per_put_call"] = r["put_s"] * 1e6 / batches
        out["us_per_get_call"] = r["get_s"] * 1e6 / batches
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=300, help="timed batches per in-process mode")
    ap.add_argument("--ray-batches", type=int, default=40, help="timed batches per Ray mode")
    ap.add_argument("--ray-warmup", type=int, default=10, help="untimed batches first through Ray")
    ap.add_argument(
        "--unbounded-depth",
        type=int,
        default=4,
        help="batches kept waiting in an unbounded buffer (it has no capacity to fill)",
    )
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma list of {MODES}")
    ap.add_argument("--no-ray", action="store_true", help="only the in-process path")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise SystemExit(f"--modes: unknown {bad}; choose from {list(MODES)}")
    for name in ("batches", "ray_batches"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be ≥ 1 (got {getattr(args, name)})")

    cfg = RunConfig()
    b, g = cfg.trainer.batch_groups, cfg.trainer.group_size
    deepest = max(backlog_batches(m, args.unbounded_depth) for m in modes) + 1
    groups = make_groups(deepest * b, cfg)
    tokens = sum(len(r.prompt_ids) + len(r.completion_ids) for r in groups[0].rollouts) / g
    print(
        f"B={b} groups per batch, G={g} rollouts per group, ~{tokens:.0f} tokens per rollout; "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )

    results: dict[str, dict] = {}
    for mode in modes:
        cap = capacity_batches(mode)
        label = f"in-process {mode} (cap {'∞' if cap is None else cap})"
        results[label] = {
            "path": "in_process",
            "mode": mode,
            **figures(in_process(mode, groups, b, args.batches, args.unbounded_depth), args.batches, b, g),
        }
    if not args.no_ray:
        import ray

        ray.init(
            address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="rollway-bench-buffer"
        )
        try:
            for mode in modes:
                cap = capacity_batches(mode)
                label = f"Ray BufferActor {mode} (cap {'∞' if cap is None else cap})"
                r = through_ray(mode, groups, b, args.ray_batches, args.unbounded_depth, args.ray_warmup)
                results[label] = {"path": "ray", "mode": mode, **figures(r, args.ray_batches, b, g)}
        finally:
            ray.shutdown()

    head = f"{'path':34} {'µs/sample':>10} {'µs/group':>10} {'µs/call':>10} {'calls':>7}"
    print("\n" + head + "\n" + "-" * len(head))
    for label, r in results.items():
        print(
            f"{label:34} {r['us_per_sample']:>10.2f} {r['us_per_group']:>10.2f} "
            f"{r['us_per_call']:>10.1f} {r['calls']:>7}"
        )
        if "us_per_put_call" in r:
            print(
                f"{'':34}   put {r['us_per_put_call']:.0f} µs/call ({b} groups), "
                f"get {r['us_per_get_call']:.0f} µs/call ({b} groups)"
            )
    worst = max((r["us_per_sample"] for r in results.values() if r["path"] == "in_process"), default=None)
    verdict = None
    if worst is not None:
        verdict = "PASS" if worst <= TARGET_US_PER_SAMPLE else "FAIL"
        print(
            f"\n{verdict}: in-process put+get, worst mode {worst:.2f} µs per sample "
            f"(target ≤ {TARGET_US_PER_SAMPLE:.0f} µs)"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "batch_groups": b,
                    "group_size": g,
                    "target_us_per_sample": TARGET_US_PER_SAMPLE,
                    "verdict": verdict,
                    "results": results,
                },
                f,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
