"""A private local Ray head: ports, token and the `ray start` command line.

Used by `manage.py up` (embedded default) and by the integration tests. The head runs as
a child (`ray start --head --block`) and is stopped by signalling that child, never with
`ray stop`, which would kill every Ray cluster on the machine.

Token auth: the head and every process that joins it (Celery worker, driver, tests) share
`RAY_AUTH_MODE=token` and `RAY_AUTH_TOKEN_PATH`, a random token kept beside the head's
files. A process without the token cannot join (measured: ConnectionError /
AuthenticationError), which matters because the GCS port accepts code to run.
"""

from __future__ import annotations

import os
import random
import secrets
import shutil
import socket
import sys
import tempfile
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

# Redis lives on 6379 here; Ray's own default GCS port is the same number.
_RESERVED_PORTS = {6379}
# Above Ray's default worker ports (--min-worker-port 10002 to --max-worker-port 19999).
_LOWEST_CHOSEN_PORT = 20000
# Ray puts Unix sockets under <temp_dir>/session_<date>_<pid>/sockets/, and a socket
# path may not exceed 107 bytes: the session part takes ~60, so keep temp_dir short.
_MAX_TEMP_DIR_LEN = 40
# Where `free_ports` tries a port: a bind here fails if any address of the host holds it.
ANY_ADDRESS = "0.0.0.0"


def free_ports(count: int, besides: Collection[int] = ()) -> list[int]:
    """`count` distinct TCP ports free now on every address of the host, none reserved
    and none of `besides` (ports already handed to the same Ray node). Each socket stays
    bound until all are chosen: Ray refuses a node whose GCS and object manager got the
    same one.

    Tried on the wildcard address, not the node's: Ray's GCS listens on every address
    (`ss -ltn` shows `*:<port>` for a head started with --node-ip-address=127.0.0.1), and
    a port some process holds on one other address only is free on 127.0.0.1 yet taken
    for it. A suite's private head, its GCS port drawn free on 127.0.0.1, could not start
    its gRPC server there ("Check failed: server_ Failed to start the grpc server").

    Drawn below the kernel's ephemeral range, where no outgoing connection takes a port
    while the process it is meant for starts: a Ray head restarted on a loaded host lost
    its client server's port, drawn from that range (the OS's choice for port 0), to
    another connection in the seconds it took to start ("Address already in use").
    Above Ray's worker ports (10002-19999 by default), which its workers bind one by one."""
    candidates = list(range(*_choosable_ports()))
    random.shuffle(candidates)
    held: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < count:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(s)
            try:
                # Where no port below the range is left, the OS's choice (port 0).
                s.bind((ANY_ADDRESS, candidates.pop() if candidates else 0))
            except OSError:  # taken: the next candidate
                continue
            port = s.getsockname()[1]
            if port not in _RESERVED_PORTS and port not in besides and port not in ports:
                ports.append(port)
    finally:
        for s in held:
            s.close()
    return ports


def _choosable_ports() -> tuple[int, int]:
    """[low, high): the ports above Ray's worker ports and below the ephemeral range."""
    try:
        ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):  # not Linux: its default range
        ephemeral_low = 32768
    return _LOWEST_CHOSEN_PORT, ephemeral_low


def free_port(besides: Collection[int] = ()) -> int:
    """One port as `free_ports` chooses it."""
    return free_ports(1, besides)[0]


def ensure_token(path: Path) -> Path:
    """A random cluster token at `path` (created once, mode 0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return path


def short_temp_dir(preferred: Path) -> Path:
    """`preferred` if it is short enough for Ray's socket paths, else a fresh /tmp dir."""
    if len(str(preferred)) <= _MAX_TEMP_DIR_LEN:
        preferred.mkdir(parents=True, exist_ok=True)
        return preferred
    return Path(tempfile.mkdtemp(prefix="rollway-ray-"))


def ray_executable() -> str:
    """The `ray` CLI of the running interpreter's environment."""
    beside = Path(sys.executable).parent / "ray"
    if beside.exists():
        return str(beside)
    found = shutil.which("ray")
    if not found:
        raise RuntimeError("the `ray` command is missing: install ray[default] (make setup)")
    return found


# How much of the past the head's GCS keeps. By default the events of up to 100,000
# tasks — every actor method call is one, and a run's driver polls its actors twice a
# second — and 100,000 dead actors' records, so a head that lives through many runs grows
# without bound; with these caps it levels off (docs/performance.md). Rollway reads
# neither (no dashboard; its actors are looked up by name while alive). Set in the head's
# environment only (deploy/ sets the same on its head).
GCS_HISTORY = {
    "RAY_task_events_max_num_task_in_gcs": "10000",
    "RAY_maximum_gcs_destroyed_actor_cached_count": "1000",
}


@dataclass
class RayHead:
    """Settings of one local head. `env()` is what joining processes need."""

    temp_dir: Path
    token_path: Path
    num_cpus: int = 2
    host: str = "127.0.0.1"
    port: int = 0

    def __post_init__(self) -> None:
        self.port = self.port or free_port()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def env(self) -> dict[str, str]:
        return {
            "RAY_ADDRESS": self.address,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(self.token_path),
        }

    def head_env(self) -> dict[str, str]:
        """The head process's own environment: `env()` and the GCS's history caps."""
        return {**self.env(), **GCS_HISTORY}

    def command(self) -> list[str]:
        # Every port Ray would otherwise take at a fixed default (client server 10001,
        # dashboard 8265, agent 52365) is chosen free, so two heads can share a machine.
        return [
            ray_executable(),
            "start",
            "--head",
            "--block",
            f"--port={self.port}",
            f"--node-ip-address={self.host}",
            f"--num-cpus={self.num_cpus}",
            "--include-dashboard=false",
            *(
                f"--{flag}={port}"
                for flag, port in zip(
                    ("dashboard-port", "dashboard-agent-listen-port", "ray-client-server-port"),
                    free_ports(3, besides={self.port}),
                    strict=True,
                )
            ),
            "--disable-usage-stats",
            f"--temp-dir={self.temp_dir}",
        ]

    @staticmethod
    def is_ready_line(line: str) -> bool:
        """`ray start` prints this once the GCS and raylet accept connections."""
        return "Ray runtime started" in line


def make_head(home: Path, num_cpus: int = 2, port: int = 0) -> RayHead:
    """A head whose files live under `home` (ROLLWAY_HOME): token and temp dir."""
    ensure_token(home / "ray_auth_token")
    return RayHead(
        temp_dir=short_temp_dir(home / "ray"),
        token_path=home / "ray_auth_token",
        num_cpus=num_cpus,
        port=port,
    )
