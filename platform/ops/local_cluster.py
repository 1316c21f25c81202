"""A Ray cluster of several nodes on one machine, as `ray start` makes one on several hosts.

The multi-node tests and `bench/scale_out.py` run on it; `manage.py up` starts a single
head (ray_head.py). The head and each further node are `ray start --block` children of a
Supervisor, each with its own raylet, object store, temp dir, process group and node
labels, every port chosen free; a node other than the head can be killed whole
(SIGKILL to its process group), as a host is lost.

Token auth is off: the tests and benches join the cluster from a process that imported
Ray long before (Ray reads its auth mode once, on import). Not for a shared machine.
"""

from __future__ import annotations

import io
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from ops.ray_head import GCS_HISTORY, free_port, free_ports, ray_executable
from ops.supervisor import Child, Supervisor
from workers.core.run_actors import ray_start_lock

HOST = "127.0.0.1"


@dataclass(frozen=True)
class Node:
    """One node's resources and labels (e.g. {"pool": "train"})."""

    cpus: float = 2
    gpus: int = 0
    labels: dict[str, str] = field(default_factory=dict)


# Every port a node would otherwise take at a fixed default, each chosen free.
PORT_FLAGS = (
    "node-manager-port",
    "object-manager-port",
    "metrics-export-port",
    "dashboard-agent-listen-port",
    "dashboard-agent-grpc-port",
    "runtime-env-agent-port",
)


class LocalCluster:
    """`nodes[0]` is the head. `home` must be short: Ray's socket paths under each
    node's temp dir (`home/n<k>`) may not exceed 107 bytes."""

    def __init__(self, home: Path, nodes: list[Node], out: io.TextIOBase | None = None) -> None:
        self.home, self.nodes = home, nodes
        self.port = free_port()
        self.taken = {self.port}  # every port handed to this cluster's nodes: none twice
        self.log = out or io.StringIO()
        self.supervisor = Supervisor(self.log)
        self.children: list[Child] = []

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    def env(self) -> dict[str, str]:
        """What a process joining this cluster needs."""
        return {"RAY_ADDRESS": self.address, "RAY_AUTH_MODE": "disabled"}

    def _argv(self, k: int, node: Node) -> list[str]:
        argv = [ray_executable(), "start", "--block", f"--node-ip-address={HOST}", "--disable-usage-stats"]
        flags = PORT_FLAGS + (("ray-client-server-port",) if k == 0 else ())
        ports = free_ports(len(flags), besides=self.taken)
        self.taken.update(ports)
        if k == 0:
            argv += ["--head", f"--port={self.port}", "--include-dashboard=false"]
        else:
            argv.append(f"--address={self.address}")
        argv += [f"--num-cpus={node.cpus:g}", f"--num-gpus={node.gpus}", f"--temp-dir={self.home / f'n{k}'}"]
        if node.labels:
            argv.append("--labels=" + ",".join(f"{key}={value}" for key, value in node.labels.items()))
        argv += [f"--{flag}={port}" for flag, port in zip(flags, ports, strict=True)]
        # 0 and 0: each worker takes a port the OS gives it.
        return argv + ["--min-worker-port=0", "--max-worker-port=0"]

    def start(self, timeout_s: float = 120.0, attempts: int = 3) -> LocalCluster:
        """The head, then each further node, under the host's Ray start lock (where
        RAY_START_LOCK_ENV names one). A node whose `ray start` exits before it is up is
        started again, `attempts` times at most: Ray gives a new raylet 30 s to register
        with the GCS (a constant of ray._private.node, no setting), and on a loaded 2-core
        host running a test suite's other workers a second node once missed it ("The
        current node timed out during startup")."""
        env = {**os.environ, **self.env(), **GCS_HISTORY}
        with ray_start_lock():
            for k, node in enumerate(self.nodes):
                self.children.append(self._start_node(k, node, env, timeout_s, attempts))
        return self

    def _start_node(self, k: int, node: Node, env: dict[str, str], timeout_s: float, attempts: int) -> Child:
        name = "head" if k == 0 else f"node{k}"
        for attempt in range(1, attempts + 1):
            child = self.supervisor.start(name, self._argv(k, node), env=env, cwd=str(self.home), ready_when=_ready)
            deadline = time.monotonic() + timeout_s
            while not child.ready.wait(0.2):
                if not child.alive():
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"Ray {name} did not start in {timeout_s:g}s{self._tail()}")
            else:
                return child
            code = child.stop(timeout_s=5)  # its group too: a raylet it had started
            self.supervisor.children.remove(child)
            self.supervisor.write(name, f"exited (code {code}) before it was up, attempt {attempt} of {attempts}")
        raise RuntimeError(f"Ray {name} exited before it was up, {attempts} times{self._tail()}")

    def _tail(self) -> str:
        tail = self.log.getvalue()[-3000:] if isinstance(self.log, io.StringIO) else ""
        return f":\n{tail}" if tail else ""

    def kill(self, k: int) -> float:
        """Kill node `k` (≥ 1) whole, as a lost host; returns when (time.time())."""
        if k == 0:
            raise ValueError("the head is the cluster: kill another node")
        self.children[k].signal(signal.SIGKILL)
        return time.time()

    def stop(self) -> None:
        self.supervisor.stop_all(timeout_s=20)


def _ready(line: str) -> bool:
    return "Ray runtime started" in line
