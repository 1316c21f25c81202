"""Where a command's CPU goes, by kind of process: what `make test` spends its cores on.

bench/suite_time.py says which tests took long, but on a host whose cores are all busy a
test's wall time says little about its cost: the kernel shares the cores between
processes, so a test whose work is one process waits behind another worker's run of five.
This runs a command (by default `make test`) and, every --interval seconds, reads from
/proc the CPU time of every process below it and of the host's PostgreSQL and Redis; at
the end it prints each kind of process's CPU seconds and share (a process counted under
the kind it ended as, bench/run_cost.py's roles, as a run's Ray worker starts `ray::IDLE`
and ends a trainer), how busy the host's cores were over the command's wall time, and
the processes that spent the most (a named actor's title says its run). A process that
lives less than one interval is missed.

And it says which tests spent the most: the command's processes may write, to the file
that ROLLWAY_TEST_SPANS names, a JSON line per test (`{"pid", "test", "start", "end"}`,
wall-clock seconds; tests/conftest.py writes one for each test it runs, setup and
teardown included). Each read's CPU, per process, is charged to the test then running in
the nearest of the process's ancestors that wrote spans (itself included): a run's
actors, its Ray cluster, Chromium and the services a test started are that test's. And,
apart, what each test spent in the process that ran it (a pytest worker's own work:
Django's views, an in-process engine, a warm start built there).
And per process that ran tests (each pytest-xdist worker): when its first test started,
when its last ended and how long it spent inside tests, which shows a worker left alone
at the end; --spans keeps the lines. And which tests the cores idled under: each read's
idle core-seconds (the host's, from /proc/stat), shared among the tests running then, one
per worker; a test that waits (a timeout, a health check, a sleep) shows at the top
however little CPU it spends.

Linux only (/proc).

    .venv/bin/python bench/suite_cpu.py                       # make test, about 23 min
    .venv/bin/python bench/suite_cpu.py --json cpu.json -- make test-fast
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_cost import ROOT, Sampler, read_processes, role  # noqa: E402  (the bench beside this one)

# Kinds of process that are not a run's, by what their command line says, in order.
# pytest itself by how it is started, not by "pytest" anywhere in the line: a bench script,
# a web process or a Celery worker a test starts often names a file under pytest's
# temporary root (/tmp/pytest-of-<user>/...), and was counted as pytest.
KINDS = (
    ("xdist", "pytest worker (tests in its own process)"),
    ("-m pytest", "pytest"),
    ("bin/pytest", "pytest"),
    ("chrom", "Chromium"),
    ("EngineCore", "vLLM engine"),
    ("asgi", "web (daphne)"),
    ("daphne", "web (daphne)"),
    ("rollway worker", "Celery worker"),
    ("rollway beat", "Celery beat"),
    ("celery", "Celery worker"),
    ("manage.py", "manage.py"),
    ("bench/", "bench scripts"),
)
# The host's services the suite talks to: counted though they are not its children.
SERVICES = (("postgres", "PostgreSQL"), ("redis-server", "Redis"))


def kind(cmdline: str) -> str:
    """The kind of a process by its command line: a run's role where it has one."""
    ray_role = role(cmdline)
    if ray_role is not None:
        return ray_role
    for marker, name in KINDS:
        if marker in cmdline:
            return name
    for marker, name in SERVICES:
        if marker in cmdline:
            return name
    return "other"


def is_service(cmdline: str) -> bool:
    return any(marker in cmdline for marker, _ in SERVICES)


@dataclass
class Tree(Sampler):
    """The processes below `root`, read every `interval_s` (run_cost's Sampler, started and
    stopped as it is). A process is known by its pid and start time (a long command
    outlives many pids), and stays in the tree once seen there: `ray start` hands its
    raylet to init when it exits, and the raylet's workers are the suite's all the same."""

    root: int = field(default_factory=os.getpid)
    members: set[tuple[int, int]] = field(default_factory=set)
    # A named actor's title while it runs a method (`ray::run-101:RunDriver.run`): idle, it
    # is `ray::RunDriver`, which no longer says whose it is.
    named: dict[tuple[int, int], str] = field(default_factory=dict)
    # Each process's ancestors' pids as first seen (nearest first): whose test it is.
    ancestors: dict[tuple[int, int], tuple[int, ...]] = field(default_factory=dict)
    # (wall time of the read, member process, CPU seconds it spent since the read before).
    spent: list[tuple[float, tuple[int, int], float]] = field(default_factory=list)
    # (wall time of the read, the host's idle core-seconds since the read before).
    idle: list[tuple[float, float]] = field(default_factory=list)
    _idle_total: float | None = None

    def sample(self) -> None:
        now = time.time()
        idle_total = host_idle_s()
        if self._idle_total is not None and idle_total is not None:
            self.idle.append((now, max(0.0, idle_total - self._idle_total)))
        self._idle_total = idle_total
        processes = read_processes()
        keys = {p.pid: (p.pid, p.started) for p in processes}
        parent = {p.pid: p.parent for p in processes}
        grown: dict[tuple[int, int], float] = {}
        for p in processes:
            key = keys[p.pid]
            before = self.cpu.get(key, 0.0)
            self.cpu[key] = p.cpu_s - self._base.get(key, 0.0)
            if self.cpu[key] > before and self._base:  # the first read (start's) is the base
                grown[key] = self.cpu[key] - before
            if p.cmdline:
                self.cmd[key] = p.cmdline
                if p.cmdline.startswith("ray::") and ":" in p.cmdline.split(" ", 1)[0].removeprefix("ray::"):
                    self.named.setdefault(key, p.cmdline)
        if self.root in keys:
            self.members.add(keys[self.root])
        grew = True
        while grew:  # a child read before its parent joins on the next pass
            grew = False
            for p in processes:
                if keys[p.pid] not in self.members and keys.get(p.parent) in self.members:
                    self.members.add(keys[p.pid])
                    grew = True
        for key, seconds in grown.items():
            if key in self.members:
                self.spent.append((now, key, seconds))
                self.ancestors.setdefault(key, _chain(key[0], parent))

    def by_kind(self) -> dict[str, dict[str, float]]:
        """{kind: {"processes": n, "cpu_s": total}} over the tree and the host's services."""
        out: dict[str, dict[str, float]] = defaultdict(lambda: {"processes": 0, "cpu_s": 0.0})
        for key, seconds in self.cpu.items():
            cmdline = self.cmd.get(key, "")
            if key in self.members or is_service(cmdline):
                name = "this bench (reading /proc)" if key[0] == self.root else kind(cmdline)
                out[name]["processes"] += 1
                out[name]["cpu_s"] += seconds
        return dict(out)

    def top(self, n: int) -> list[tuple[float, str]]:
        """The `n` processes of the tree that spent the most CPU: (seconds, command line),
        a named actor's by its title while it worked, which holds its run's id (which test's
        run it was)."""
        spent = [
            (seconds, self.named.get(key) or self.cmd.get(key, ""))
            for key, seconds in self.cpu.items()
            if key in self.members
        ]
        return sorted(spent, key=lambda x: -x[0])[:n]


def host_idle_s() -> float | None:
    """The host's idle core-seconds since boot (idle and iowait, /proc/stat's first line);
    None where it cannot be read."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 6:
        return None
    return (int(fields[4]) + int(fields[5])) / os.sysconf("SC_CLK_TCK")


def _chain(pid: int, parent: dict[int, int]) -> tuple[int, ...]:
    out = []
    while pid in parent and parent[pid] > 1 and len(out) < 64:
        pid = parent[pid]
        out.append(pid)
    return tuple(out)


@dataclass
class Span:
    pid: int
    test: str
    start: float
    end: float


def read_spans(path: str) -> dict[int, list[Span]]:
    """{pid: its spans by start} from a ROLLWAY_TEST_SPANS file (none if it is missing)."""
    out: dict[int, list[Span]] = defaultdict(list)
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                if line.strip():
                    d = json.loads(line)
                    out[d["pid"]].append(Span(d["pid"], d["test"], d["start"], d["end"]))
    for spans in out.values():
        spans.sort(key=lambda s: s.start)
    return dict(out)


BETWEEN = "(between tests)"
UNDER_NO_TEST = "(not below a process that ran tests)"


def _running(spans: dict[int, list[Span]], starts: dict[int, list[float]], pid: int, when: float) -> Span | None:
    """The span process `pid` was in at `when` (it runs one test at a time: the last span
    to start by then, if not yet over), or None."""
    k = bisect.bisect_right(starts[pid], when) - 1
    return spans[pid][k] if k >= 0 and when <= spans[pid][k].end else None


def by_test(tree: Tree, spans: dict[int, list[Span]], own: bool = False) -> dict[str, float]:
    """CPU seconds per test: each read's CPU of each process of the tree, charged to the span
    running at that read in its nearest ancestor with spans (BETWEEN outside every span,
    UNDER_NO_TEST where no ancestor has any). `own`: only the CPU of the process that ran
    the test (a pytest worker's in-process work: Django views, an in-process engine, a
    warm start built there), none of the processes it started."""
    out: dict[str, float] = defaultdict(float)
    starts = {pid: [s.start for s in ordered] for pid, ordered in spans.items()}
    for when, key, seconds in tree.spent:
        owner = next((pid for pid in (key[0], *tree.ancestors.get(key, ())) if pid in spans), None)
        if owner is None:
            if not own:
                out[UNDER_NO_TEST] += seconds
            continue
        if own and owner != key[0]:
            continue
        span = _running(spans, starts, owner, when)
        out[span.test if span is not None else BETWEEN] += seconds
    return dict(out)


def idle_by_test(idle: list[tuple[float, float]], spans: dict[int, list[Span]]) -> dict[str, float]:
    """Idle core-seconds per test: each read's, shared equally among the tests running at
    that read (one per worker in a test then); BETWEEN where no worker was in one."""
    out: dict[str, float] = defaultdict(float)
    starts = {pid: [s.start for s in ordered] for pid, ordered in spans.items()}
    for when, seconds in idle:
        running = [span.test for pid in spans if (span := _running(spans, starts, pid, when)) is not None]
        for test in running or [BETWEEN]:
            out[test] += seconds / max(1, len(running))
    return dict(out)


def by_worker(spans: dict[int, list[Span]], start: float) -> list[dict[str, float]]:
    """Per process that ran tests: when its first test started and its last ended (seconds
    after the command started), and how long it spent inside tests. A worker whose last
    test ends long before the other's is where a suite's wall time goes unshared."""
    rows = []
    for pid, own in sorted(spans.items(), key=lambda kv: kv[1][0].start):
        busy = sum(s.end - s.start for s in own)
        rows.append(
            {
                "pid": pid,
                "tests": len(own),
                "first_s": own[0].start - start,
                "last_s": own[-1].end - start,
                "in_tests_s": busy,
            }
        )
    return rows


def by_file(tests: dict[str, float]) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for test, seconds in tests.items():
        out[test.split("::", 1)[0]] += seconds
    return dict(out)


def table(kinds: dict[str, dict[str, float]], wall_s: float, cores: int) -> list[str]:
    total = sum(k["cpu_s"] for k in kinds.values())
    lines = [
        f"wall {wall_s:.0f} s, CPU {total:.0f} s: the {cores} cores "
        f"{total / (wall_s * cores) if wall_s else 0:.0%} busy with it",
        f"  {'kind of process':<44} {'processes':>9} {'CPU s':>8} {'share':>6}",
    ]
    for name, k in sorted(kinds.items(), key=lambda kv: -kv[1]["cpu_s"]):
        share = k["cpu_s"] / total if total else 0.0
        lines.append(f"  {name:<44} {k['processes']:>9.0f} {k['cpu_s']:>8.1f} {share:>6.0%}")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--interval", type=float, default=1.0, help="seconds between two reads of /proc")
    p.add_argument("--top", type=int, default=15, help="list this many of the processes that spent the most")
    p.add_argument("--tests", type=int, default=15, help="list this many of the tests that spent the most")
    p.add_argument("--json", help="also write the figures to this file")
    p.add_argument("--spans", help="keep each test's span (a JSON line: pid, test, start, end) in this file")
    p.add_argument("command", nargs="*", help="the command to run (after --): make test unless given")
    args = p.parse_args()
    if args.interval <= 0:
        p.error(f"--interval must be > 0 (got {args.interval:g})")
    for name in ("top", "tests"):
        if getattr(args, name) < 0:
            p.error(f"--{name} must be ≥ 0 (got {getattr(args, name)})")
    command = args.command or ["make", "test"]
    tree = Tree(interval_s=args.interval)
    tree.start()
    start = time.monotonic()
    started_at = time.time()
    spans_file = args.spans or tempfile.NamedTemporaryFile(prefix="test-spans-", suffix=".jsonl", delete=False).name
    if args.spans and os.path.exists(spans_file):
        os.unlink(spans_file)  # the lines are appended: a file of an earlier suite would mix in
    try:
        done = subprocess.run(command, cwd=ROOT, env={**os.environ, "ROLLWAY_TEST_SPANS": spans_file})
    finally:
        tree.stop()
    wall = time.monotonic() - start
    spans = read_spans(spans_file)
    tests = by_test(tree, spans)
    in_process = by_test(tree, spans, own=True)
    idle = idle_by_test(tree.idle, spans)
    workers = by_worker(spans, started_at)
    if not args.spans:
        os.unlink(spans_file)
    kinds = tree.by_kind()
    cores = os.cpu_count() or 1
    top = tree.top(args.top)
    print("\n".join(table(kinds, wall, cores)))
    if top:
        print(f"the {len(top)} processes that spent the most CPU:")
        print("\n".join(f"  {seconds:8.1f} s  {cmdline[:100]}" for seconds, cmdline in top))
    if workers:
        print("each process that ran tests: tests, first start → last end (s into the command), time in tests")
        for w in workers:
            span = f"{w['first_s']:7.0f} → {w['last_s']:7.0f}"
            print(f"  pid {w['pid']:>8}  {w['tests']:5d}  {span}  {w['in_tests_s']:7.0f} s")
    ranked = sorted(tests.items(), key=lambda kv: -kv[1])
    if args.tests and ranked:
        print(f"the {min(args.tests, len(ranked))} tests that spent the most CPU (with every process they started):")
        print("\n".join(f"  {seconds:8.1f} s  {test}" for test, seconds in ranked[: args.tests]))
    own_ranked = sorted(in_process.items(), key=lambda kv: -kv[1])
    if args.tests and own_ranked:
        print(f"the {min(args.tests, len(own_ranked))} tests whose own process spent the most CPU:")
        print("\n".join(f"  {seconds:8.1f} s  {test}" for test, seconds in own_ranked[: args.tests]))
    idled = sorted(idle.items(), key=lambda kv: -kv[1])
    if args.tests and idled:
        print(f"the {min(args.tests, len(idled))} tests the cores idled under most (idle core-seconds, shared):")
        print("\n".join(f"  {seconds:8.1f} s  {test}" for test, seconds in idled[: args.tests]))
    if args.json:
        with open(args.json, "w") as f:
            figures = {
                "command": command,
                "wall_s": wall,
                "cores": cores,
                "kinds": kinds,
                "top": top,
                "tests": dict(ranked),
                "in_process": dict(own_ranked),
                "idle": dict(idled),
                "workers": workers,
                "files": dict(sorted(by_file(tests).items(), key=lambda kv: -kv[1])),
            }
            json.dump(figures, f, indent=1)
    sys.exit(done.returncode)


if __name__ == "__main__":
    main()
