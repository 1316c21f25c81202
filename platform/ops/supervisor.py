"""Child processes started together and stopped together, leaving no orphans.

Every child runs in its own session (so its process group holds everything it spawns and
a terminal's Ctrl-C reaches only the supervisor, which then stops the children in order),
and asks the kernel for SIGTERM if the supervisor itself dies (PR_SET_PDEATHSIG), so even
a `kill -9` of the supervisor does not leave a web server or a Ray head behind.
Output of each child is forwarded line by line with its name in front, as foreman does.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO

_PR_SET_PDEATHSIG = 1


def _own_session_and_die_with_parent() -> None:  # runs in the child, before exec
    os.setsid()
    # Not Linux: no prctl, but the process group still gets stopped.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def group_alive(pgid: int) -> bool:
    """Whether any process is left in process group `pgid`."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class Child:
    """One supervised process. `stop_leader_only`: send SIGTERM to the leader alone and
    let it shut its own helpers down (`ray start --block` drains and stops the raylet and
    GCS itself); whatever is left in the group afterwards is killed."""

    name: str
    argv: list[str]
    popen: subprocess.Popen
    stop_leader_only: bool = False
    ready: threading.Event = field(default_factory=threading.Event)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        try:
            if self.stop_leader_only:
                self.popen.send_signal(sig)
            else:
                os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, timeout_s: float) -> int | None:
        """SIGTERM, wait up to `timeout_s` for the leader and its group, then SIGKILL the
        group. Returns the leader's exit code."""
        if self.alive():
            self.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and (self.alive() or group_alive(self.pid)):
            time.sleep(0.1)
        if group_alive(self.pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            # SIGKILL is asynchronous: give the kernel a moment to take the group down, so
            # callers that check for leftovers right after stop() see the final state.
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline and group_alive(self.pid):
                time.sleep(0.02)
        try:
            return self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return None


class Supervisor:
    """Starts children, forwards their output, notices one dying, stops all in reverse."""

    def __init__(self, out: IO[str] | None = None):
        self.out = out or sys.stdout
        self.children: list[Child] = []
        self._write_lock = threading.Lock()

    def write(self, name: str, line: str) -> None:
        with self._write_lock:
            self.out.write(f"{name:<7}| {line.rstrip()}\n")
            self.out.flush()

    def start(
        self,
        name: str,
        argv: list[str],
        *,
        env: dict[str, str],
        cwd: str,
        ready_when: Callable[[str], bool] | None = None,
        stop_leader_only: bool = False,
    ) -> Child:
        """Start `argv`; `ready_when(line)` marks the child ready on a matching output line."""
        popen = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            preexec_fn=_own_session_and_die_with_parent,
        )
        child = Child(name, argv, popen, stop_leader_only=stop_leader_only)
        self.children.append(child)
        threading.Thread(target=self._forward, args=(child, ready_when), name=f"out-{name}", daemon=True).start()
        return child

    def _forward(self, child: Child, ready_when: Callable[[str], bool] | None) -> None:
        assert child.popen.stdout is not None
        for raw in iter(child.popen.stdout.readline, b""):
            line = raw.decode("utf-8", errors="replace")
            self.write(child.name, line)
            if ready_when is not None and not child.ready.is_set() and ready_when(line):
                child.ready.set()

    def first_dead(self) -> Child | None:
        return next((c for c in self.children if not c.alive()), None)

    def stop_all(self, timeout_s: float = 20.0) -> None:
        """Stop children in reverse start order: web before the worker, Ray last."""
        for child in reversed(self.children):
            if child.alive() or group_alive(child.pid):
                self.write("up", f"stopping {child.name} (pid {child.pid})")
                code = child.stop(timeout_s)
                self.write("up", f"{child.name} stopped (exit {code})")
