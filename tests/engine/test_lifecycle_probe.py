"""`lifecycle.connect` probes the head it is given before any Ray call: a head that does
not answer is an error at once, not a call that blocks until Ray ends the process (the
whole fault, head crashed and back, is in tests/integration/test_faults.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from workers.run import lifecycle


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


# In a process of its own: this one may have joined the suite's shared Ray cluster,
# which a probe that fails leaves (ray.shutdown).
CHILD = """
import os, sys, time
import ray
from workers.run import lifecycle
address = sys.argv[1]
t = time.monotonic()
try:
    lifecycle.is_alive(1, ray_address=address)
except lifecycle.RayUnreachable as exc:
    print("refused", round(time.monotonic() - t, 2), ray.is_initialized(), exc)
os.environ["RAY_ADDRESS"] = address  # the environment's address is probed too
try:
    lifecycle.cluster_capacity()
except lifecycle.RayUnreachable:
    print("refused from RAY_ADDRESS")
"""


def test_a_head_that_does_not_answer_is_refused_at_once_without_joining_ray():
    address = f"127.0.0.1:{closed_port()}"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, address], env=env, capture_output=True, text=True, timeout=120
    ).stdout.splitlines()
    assert len(out) == 2, out
    word, seconds, joined, *message = out[0].split()
    assert word == "refused" and float(seconds) < lifecycle.PROBE_TIMEOUT_S + 1
    assert joined == "False" and address in " ".join(message)
    assert out[1] == "refused from RAY_ADDRESS"


def test_the_probe_tells_a_listening_port_from_a_closed_one():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert lifecycle._answers(f"127.0.0.1:{server.getsockname()[1]}")
    assert not lifecycle._answers(f"127.0.0.1:{closed_port()}")
    # Addresses it cannot probe are left to Ray.
    assert lifecycle._answers("auto") and lifecycle._answers("ray://head:10001")
