"""Where processes of one run meet to form a torch.distributed group: a TCPStore that one
process opens on its node and the others join by address.

Two groups use it: the weight sync's (trainer + inference workers, workers/sync/
collective.py) and the trainer pool's (its ranks, workers/train/trainer_pool.py). Each opens
a store of its own on a port in PORT_RANGE, so a run's groups never share one.
"""

from __future__ import annotations

import datetime
import random
import socket

import torch.distributed as dist

# Ports a rendezvous may bind (deploy/ opens this range between Ray pods); a random start
# spreads concurrent runs.
PORT_RANGE = range(29600, 29700)


def _ports() -> list[int]:
    """PORT_RANGE from a random start (wrapping), so concurrent runs spread over it."""
    ports = list(PORT_RANGE)
    start = random.randrange(len(ports))
    return ports[start:] + ports[:start]


def default_host() -> str:
    """This node's address as other Ray nodes see it; 127.0.0.1 outside Ray."""
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except ImportError:
        pass
    return "127.0.0.1"


def open_store(host: str, world_size: int, timeout_s: float, what: str) -> tuple[dist.TCPStore, int]:
    """A master TCPStore for `world_size` processes on the first free port of PORT_RANGE
    (from a random start); returns it and its port. `what` names the group in the error."""
    for port in _ports():
        try:
            store = dist.TCPStore(
                host,
                port,
                world_size,
                is_master=True,
                timeout=datetime.timedelta(seconds=timeout_s),
                wait_for_workers=False,
            )
            return store, port
        except RuntimeError:  # port taken (DistNetworkError): try the next
            continue
    raise RuntimeError(f"no free port in {PORT_RANGE.start}-{PORT_RANGE.stop - 1} for the {what} rendezvous")


def join_store(host: str, port: int, world_size: int, timeout_s: float) -> dist.TCPStore:
    """A client of the store another process opened at host:port."""
    return dist.TCPStore(host, port, world_size, is_master=False, timeout=datetime.timedelta(seconds=timeout_s))


def free_port(host: str) -> int:
    """A port of PORT_RANGE free on `host` now (from a random start), for a rendezvous
    whose store another library opens (vLLM's weight-transfer engines take a port). It
    may be taken between this check and the bind; the bind then fails, naming it."""
    for port in _ports():
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {PORT_RANGE.start}-{PORT_RANGE.stop - 1} for a weight-transfer rendezvous")
