"""A Ray cluster of two nodes on this machine, as `ray start` makes one on two hosts.

The head carries the node label pool=rollout and the second node pool=train; each is a
`ray start --block` child of its own (its own raylet, object store and temp dir, its own
process group), the second joined to the head by address. The second node can be killed
whole (SIGKILL to its process group), as a host is lost.

Token auth is off for this cluster: the test process joins it in-process, and Ray reads
its auth mode once, when it is imported (long before a test starts the cluster).
"""

from __future__ import annotations

import io
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from ops.ray_head import GCS_HISTORY, free_port, ray_executable
from ops.supervisor import Child, Supervisor

HOST = "127.0.0.1"


def _ports() -> list[str]:
    """Every port a node would otherwise take at a fixed default, chosen free."""
    return [
        f"--node-manager-port={free_port(HOST)}",
        f"--object-manager-port={free_port(HOST)}",
        f"--metrics-export-port={free_port(HOST)}",
        f"--dashboard-agent-listen-port={free_port(HOST)}",
        f"--dashboard-agent-grpc-port={free_port(HOST)}",
        f"--runtime-env-agent-port={free_port(HOST)}",
        "--min-worker-port=0",  # 0 and 0: each worker takes a port the OS gives it
        "--max-worker-port=0",
    ]


@dataclass
class TwoNodes:
    home: Path
    cpus: tuple[int, int] = (2, 2)
    gpus: tuple[int, int] = (0, 0)
    port: int = field(default_factory=lambda: free_port(HOST))
    log: io.StringIO = field(default_factory=io.StringIO)

    def __post_init__(self) -> None:
        self.supervisor = Supervisor(self.log)
        self.head: Child | None = None
        self.second: Child | None = None

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    def env(self) -> dict[str, str]:
        """What a process joining this cluster needs."""
        return {"RAY_ADDRESS": self.address, "RAY_AUTH_MODE": "disabled"}

    def _node(self, name: str, argv: list[str], timeout_s: float) -> Child:
        env = {**os.environ, **self.env(), **GCS_HISTORY}
        child = self.supervisor.start(name, argv, env=env, cwd=str(self.home), ready_when=_ready)
        if not child.ready.wait(timeout_s):
            raise RuntimeError(f"{name} did not start in {timeout_s}s:\n{self.log.getvalue()[-3000:]}")
        return child

    def start(self, timeout_s: float = 120.0) -> TwoNodes:
        common = ["--block", f"--node-ip-address={HOST}", "--disable-usage-stats"]
        self.head = self._node(
            "head",
            [
                ray_executable(),
                "start",
                "--head",
                f"--port={self.port}",
                f"--num-cpus={self.cpus[0]}",
                f"--num-gpus={self.gpus[0]}",
                "--labels=pool=rollout",
                "--include-dashboard=false",
                f"--ray-client-server-port={free_port(HOST)}",
                f"--temp-dir={self.home / 'h'}",
                *common,
                *_ports(),
            ],
            timeout_s,
        )
        self.second = self._node(
            "second",
            [
                ray_executable(),
                "start",
                f"--address={self.address}",
                f"--num-cpus={self.cpus[1]}",
                f"--num-gpus={self.gpus[1]}",
                "--labels=pool=train",
                f"--temp-dir={self.home / 's'}",
                *common,
                *_ports(),
            ],
            timeout_s,
        )
        return self

    def kill_second(self) -> float:
        """Kill the second node whole, as a lost host; returns when (time.time())."""
        assert self.second is not None
        self.second.signal(signal.SIGKILL)
        return time.time()

    def stop(self) -> None:
        self.supervisor.stop_all(timeout_s=20)


def _ready(line: str) -> bool:
    return "Ray runtime started" in line
