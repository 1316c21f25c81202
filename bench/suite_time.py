"""Where the test suite's time goes, read from the junit file pytest writes (`--junitxml`).

Prints pytest's wall time, then test time (each test's setup, call and teardown, summed
over the xdist workers) by part of the suite (tests/engine, tests/platform,
tests/integration and the top-level tests), by file, and the slowest tests. With
`--compare`, each file's test time in an earlier junit file beside this one's: how a
change to the suite moved it. On a host whose cores the suite keeps busy, test time
divided by the workers is about the wall time, so a file's share of test time is its
share of the wait.

    make test PYTEST_ARGS="--junitxml=/tmp/junit.xml"
    .venv/bin/python bench/suite_time.py /tmp/junit.xml
    .venv/bin/python bench/suite_time.py /tmp/junit.xml --files 20 --tests 30 --compare /tmp/before.xml
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET  # the stdlib reads pytest's junit file; nothing more is needed
from collections import Counter
from dataclasses import dataclass


@dataclass
class Suite:
    wall_s: float
    file_s: Counter  # test time per test file (tests/engine/test_driver.py)
    file_n: Counter  # tests per file
    tests: list[tuple[float, str]]  # (seconds, file::name) of every test

    def part_s(self) -> Counter:
        """Test time per part of the suite: the folder under tests/, or "top-level"."""
        parts: Counter = Counter()
        for path, seconds in self.file_s.items():
            parts[part(path)] += seconds
        return parts


def part(path: str) -> str:
    folders = path.split("/")[1:-1]
    return f"tests/{folders[0]}" if folders else "top-level"


def test_file(classname: str) -> str:
    """tests/engine/test_driver.py from `tests.engine.test_driver` (or `...test_x.TestClass`)."""
    parts = classname.split(".")
    while len(parts) > 1 and parts[-1][:1].isupper():  # a test class, not a module
        parts.pop()
    return "/".join(parts) + ".py"


def read(path: str) -> Suite:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    file_s: Counter = Counter()
    file_n: Counter = Counter()
    tests = []
    for case in root.iter("testcase"):
        name = test_file(case.get("classname", ""))
        seconds = float(case.get("time", 0))
        file_s[name] += seconds
        file_n[name] += 1
        tests.append((seconds, f"{name}::{case.get('name', '').split('@')[0]}"))
    return Suite(sum(float(s.get("time", 0)) for s in suites), file_s, file_n, tests)


def report(suite: Suite, files: int, slowest: int, before: Suite | None = None) -> list[str]:
    total = sum(suite.file_s.values())
    lines = [
        f"pytest wall time {suite.wall_s:.0f} s ({suite.wall_s / 60:.1f} min); test time {total:.0f} s "
        f"over {len(suite.tests)} tests",
        "",
        "test time by part of the suite:",
    ]
    for name, seconds in suite.part_s().most_common():
        lines.append(f"  {seconds:8.0f} s  {seconds / total:4.0%}  {name}")
    lines += ["", f"the {files} files with the most test time:"]
    header = "  test s  share  tests  file" if before is None else "  test s  before  change  tests  file"
    lines.append(header)
    for name, seconds in suite.file_s.most_common(files):
        if before is None:
            lines.append(f"  {seconds:6.0f}  {seconds / total:5.0%}  {suite.file_n[name]:5d}  {name}")
        else:
            was = before.file_s.get(name, 0.0)
            lines.append(f"  {seconds:6.0f}  {was:6.0f}  {seconds - was:+6.0f}  {suite.file_n[name]:5d}  {name}")
    if before is not None:
        was_total = sum(before.file_s.values())
        lines.append(f"  {total:6.0f}  {was_total:6.0f}  {total - was_total:+6.0f}  {len(suite.tests):5d}  all")
    if slowest:
        lines += ["", f"the {slowest} slowest tests:"]
        lines += [f"  {seconds:6.1f} s  {name}" for seconds, name in sorted(suite.tests, reverse=True)[:slowest]]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("junit", help="the junit file of a pytest run (--junitxml=PATH)")
    ap.add_argument("--files", type=int, default=25, help="how many files to list (default 25)")
    ap.add_argument("--tests", type=int, default=25, help="how many of the slowest tests to list (default 25)")
    ap.add_argument("--compare", metavar="JUNIT", help="an earlier run's junit file to set beside this one")
    args = ap.parse_args(argv)
    for flag in ("files", "tests"):
        if getattr(args, flag) < 0:
            ap.error(f"--{flag} must be 0 or more (got {getattr(args, flag)})")
    suites = []
    for flag, path in (("junit", args.junit), ("--compare", args.compare)):
        if path is None:
            continue
        try:
            suites.append(read(path))
        except (OSError, ET.ParseError) as e:
            ap.error(f"{flag}: cannot read {path} as pytest's junit file ({e})")
    print("\n".join(report(suites[0], args.files, args.tests, suites[1] if len(suites) > 1 else None)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
