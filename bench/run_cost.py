"""What a short run costs in CPU, and where: each of its processes, and the imports in them.

A run is a driver, a buffer, a trainer and inference workers, each a Ray actor in a
process of its own; on a small model most of their CPU goes to starting those processes
(Python, Ray, torch, transformers) rather than to generating and training. This bench runs
`--runs` tiny runs (the engine tests' 4-step async run) one after another on a Ray cluster
of its own, after one run it does not count (the warm start it builds), while a sampler
reads every process's CPU time from /proc. Each process is counted under the role it
ended in (a worker Ray started as `ray::IDLE` and that became the trainer is the
trainer's), so the table says what each kind of actor costs per run, and what Ray's own
processes (raylet, GCS, dashboard agent, log monitor) and its idle workers cost beside
them. Then it times the imports a run's processes make, each in a fresh interpreter.

Linux only (/proc). What the suite's whole runs cost is this per-run figure times their
number; the imports show how much of it no test can make cheaper but by starting fewer
processes.

    .venv/bin/python bench/run_cost.py
    .venv/bin/python bench/run_cost.py --runs 5 --json cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

from workers.core.run_actors import ACTOR_CLASSES

# The roles a process of a run's Ray cluster ends in, by what its command line or title
# says (Ray titles an actor's process `ray::<Class>` or `ray::<Class>.<method>`).
# Each of workers.core.run_actors.ACTOR_CLASSES needs a role here (a new actor class
# fails at import until it has one).
ROLE_OF_CLASS = {
    "RunDriver": "driver",
    "TrainerActor": "trainer",
    "TrainerRank": "trainer rank",
    "InferenceWorker": "inference worker",
    "BufferActor": "buffer",
    "RewardWorker": "reward worker",
}
ROLES = (
    *((f"ray::{name}", ROLE_OF_CLASS[name]) for name in ACTOR_CLASSES),
    ("ray::IDLE", "idle worker (never an actor)"),
    ("default_worker.py", "idle worker (never an actor)"),
)
RAY_OWN = ("raylet", "gcs_server", "dashboard", "log_monitor", "monitor.py", "runtime_env", "client.server")
# What the processes import, each timed alone in a fresh interpreter (as an actor's
# process starts): Ray, torch, the actor modules, and transformers' causal-LM class as
# the trainer and a torch-backend worker load it. scikit-learn and SciPy hidden as a
# run's worker processes hide them (workers/core/worker_process.py).
IMPORTS = {
    "python (nothing)": "pass",
    "ray": "import ray",
    "torch": "import torch",
    "workers.run.driver (ray, the engine; no torch)": "import workers.run.driver",
    "workers.run.trainer_host (ray, torch, the engine)": "import workers.run.trainer_host",
    "torch + transformers' AutoModelForCausalLM": "import torch; from transformers import AutoModelForCausalLM",
}
HIDE = "import sys; sys.modules.update(sklearn=None, scipy=None); "
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def role(cmdline: str) -> str | None:
    """The role of a process by its command line, None for one outside the cluster."""
    for marker, name in ROLES:
        # A named actor's process is titled `ray::<name>:<Class>.<method>` while it runs one.
        if marker in cmdline or (cmdline.startswith("ray::") and ":" + marker.removeprefix("ray::") in cmdline):
            return name
    if "ray" in cmdline and any(p in cmdline for p in RAY_OWN):
        return "Ray's own processes"
    return None


@dataclass
class Sampler:
    """Reads /proc every `interval_s`: each process's CPU seconds since the sampler began
    (all of them for a process started since), its last command line and its parent.
    Only this process's descendants count (its Ray cluster's raylet, GCS and workers):
    another cluster on the host, such as a test suite's, is not this bench's."""

    interval_s: float = 0.25
    cpu: dict[int, float] = field(default_factory=dict)
    cmd: dict[int, str] = field(default_factory=dict)
    parent: dict[int, int] = field(default_factory=dict)
    _base: dict[int, float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        self.sample()
        self._base, self.cpu = dict(self.cpu), {}
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        """Reads every process once."""
        for proc in read_processes():
            self.cpu[proc.pid] = proc.cpu_s - self._base.get(proc.pid, 0.0)
            self.parent[proc.pid] = proc.parent
            if proc.cmdline:
                self.cmd[proc.pid] = proc.cmdline

    def by_role(self) -> dict[str, dict[str, float]]:
        """{role: {"processes": n, "cpu_s": total}} over the processes seen."""
        out: dict[str, dict[str, float]] = defaultdict(lambda: {"processes": 0, "cpu_s": 0.0})
        for pid, seconds in self.cpu.items():
            if not self.descends(pid, os.getpid()):
                continue
            name = role(self.cmd.get(pid, ""))
            if name is not None:
                out[name]["processes"] += 1
                out[name]["cpu_s"] += seconds
        return dict(out)

    def descends(self, pid: int, root: int) -> bool:
        """Whether `pid` was seen below `root` (through parents seen alive)."""
        for _ in range(64):
            if pid == root:
                return True
            if pid not in self.parent:
                return False
            pid = self.parent[pid]
        return False


ACTOR_ROLES = {name for _, name in ROLES if not name.startswith("idle")}


def wait_for_actors_to_exit(timeout_s: float = 120.0) -> None:
    """Until no process below this one holds a run's actor (a killed driver's process
    can outlive its kill by seconds on a loaded host)."""
    deadline = time.monotonic() + timeout_s
    while True:
        sampler = Sampler()
        sampler.sample()
        if not any(
            role(sampler.cmd.get(pid, "")) in ACTOR_ROLES for pid in sampler.cpu if sampler.descends(pid, os.getpid())
        ):
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"a run's actor processes were still there after {timeout_s:g} s")
        time.sleep(0.2)


@dataclass
class Process:
    """One process as /proc shows it now."""

    pid: int
    parent: int
    started: int  # clock ticks after boot: with the pid, names one process however long
    cpu_s: float  # user + system since it started
    cmdline: str


def read_processes() -> list[Process]:
    """Every process on the host, read once (those gone between the listing and the read
    left out)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = []
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline") as f:
                cmdline = f.read().replace("\0", " ").strip()
        except OSError:
            continue
        cpu_s = (int(fields[11]) + int(fields[12])) / tick  # utime + stime
        out.append(Process(pid, int(fields[1]), int(fields[19]), cpu_s, cmdline))
    return out


def import_cpu(code: str, repeats: int) -> float:
    """Median CPU seconds of a fresh interpreter running `code` (its start included)."""
    times = []
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-c", HIDE + code], check=True, cwd=ROOT)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        times.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return sorted(times)[len(times) // 2]


def tiny_run_config(steps: int = 4) -> dict:
    """The engine tests' short async run (tests/engine/helpers.py `tiny_config`), `steps` long."""
    return {
        "mode": "async",
        "warm_start": {"steps": 20, "noisy_steps": 20},
        "trainer": {"batch_groups": 4, "group_size": 4},
        "stop": {"max_steps": steps},
    }


def measure_runs(runs: int, cache_dir: str, warm_up: bool = True, steps: int = 4) -> tuple[dict, list[float]]:
    """CPU by role over `runs` runs of `steps` steps (after one uncounted run unless not
    `warm_up`), and each run's wall seconds."""
    import ray

    from workers.core.run_actors import NAMESPACE, actor_name, init_local_ray
    from workers.run.driver import RunDriver

    def one(run_id: int) -> float:
        start = time.monotonic()
        driver = RunDriver.options(name=actor_name(run_id), namespace=NAMESPACE).remote(
            run_id, tiny_run_config(steps), None, "", cache_dir, exit_when_done=False
        )
        try:
            out = ray.get(driver.run.remote(), timeout=600)
        finally:
            ray.kill(driver)
        if out["state"] != "succeeded":
            raise SystemExit(f"run {run_id} {out['state']}: {out['error']}")
        return time.monotonic() - start

    init_local_ray(NAMESPACE)
    try:
        if warm_up:
            one(1)  # builds the warm start and warms the caches: not counted
            wait_for_actors_to_exit()  # none of its processes is counted
        sampler = Sampler()
        sampler.start()
        walls = [one(2 + i) for i in range(runs)]
        wait_for_actors_to_exit()  # the last run's processes, read until they are gone
        sampler.stop()
    finally:
        ray.shutdown()
    return sampler.by_role(), walls


def table(roles: dict, runs: int, imports: dict[str, float], steps: int = 4) -> list[str]:
    total = sum(r["cpu_s"] for r in roles.values())
    counted = f"{runs} run{'s' if runs != 1 else ''}"
    lines = [
        f"CPU seconds per run, over {counted} of {steps} steps (async, tiny model, torch backend):",
        f"  {'process':<32} {'processes/run':>13} {'CPU s/run':>10} {'share':>6}",
    ]
    for name, r in sorted(roles.items(), key=lambda kv: -kv[1]["cpu_s"]):
        lines.append(
            f"  {name:<32} {r['processes'] / runs:>13.1f} {r['cpu_s'] / runs:>10.2f} {r['cpu_s'] / total:>6.0%}"
        )
    lines.append(f"  {'all':<32} {'':>13} {total / runs:>10.2f}")
    if imports:
        lines += ["", "CPU seconds of a fresh interpreter importing (median):"]
        lines += [f"  {name:<54} {seconds:>6.2f}" for name, seconds in imports.items()]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs counted (after one that is not; default 3)")
    parser.add_argument("--import-repeats", type=int, default=3, help="fresh interpreters per import (default 3)")
    parser.add_argument("--no-imports", action="store_true", help="skip timing the imports")
    parser.add_argument(
        "--no-warm-up",
        action="store_true",
        help="count from the first run (its warm-start build lands in the driver's CPU): a smoke test",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=4,
        help="steps per run (default 4): a longer run shows how little of a run's CPU its steps are",
    )
    parser.add_argument("--cache-dir", default=None, help="the runs' warm-start cache (default: a fresh one)")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be ≥ 1")
    if args.import_repeats < 1:
        parser.error("--import-repeats must be ≥ 1")
    if args.steps < 1:
        parser.error("--steps must be ≥ 1")
    if not os.path.isdir("/proc/self"):
        parser.error("this bench reads /proc: Linux only")
    with tempfile.TemporaryDirectory(prefix="rollway-run-cost-") as tmp:
        roles, walls = measure_runs(args.runs, args.cache_dir or tmp, warm_up=not args.no_warm_up, steps=args.steps)
    imports = {} if args.no_imports else {n: import_cpu(c, args.import_repeats) for n, c in IMPORTS.items()}
    print("\n".join(table(roles, args.runs, imports, args.steps)))
    print(f"\nwall seconds per run: {', '.join(f'{w:.1f}' for w in walls)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"runs": args.runs, "steps": args.steps, "roles": roles, "wall_s": walls, "imports": imports},
                f,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
