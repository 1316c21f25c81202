"""ops.supervisor and ops.ray_head: what `manage.py up` relies on to leave no orphans."""

from __future__ import annotations

import io
import itertools
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from ops.ray_head import RayHead, make_head
from ops.supervisor import Supervisor, group_alive

REPO = Path(__file__).resolve().parents[1]


def gone(pid: int, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_stop_all_ends_every_process_of_each_child_group():
    sup = Supervisor(io.StringIO())
    child = sup.start(
        "shell",
        ["bash", "-c", "sleep 300 & sleep 300 & echo started; wait"],
        env=dict(os.environ),
        cwd=str(REPO),
        ready_when=lambda line: "started" in line,
    )
    assert child.ready.wait(60), "the shell never started its two sleeps"
    grandchildren = psutil.Process(child.pid).children(recursive=True)
    assert len(grandchildren) == 2
    sup.stop_all(timeout_s=5)
    assert not group_alive(child.pid)
    assert all(gone(p.pid) for p in grandchildren)


def test_a_child_ignoring_sigterm_is_killed_after_the_timeout():
    sup = Supervisor(io.StringIO())
    child = sup.start(
        "stubborn",
        ["bash", "-c", "trap '' TERM; echo trapped; while :; do sleep 0.1; done"],
        env=dict(os.environ),
        cwd=str(REPO),
        ready_when=lambda line: "trapped" in line,
    )
    assert child.ready.wait(60), "the shell never set its trap"
    started = time.monotonic()
    sup.stop_all(timeout_s=1)
    # SIGTERM was ignored, so only the SIGKILL after the timeout can have ended it.
    assert time.monotonic() - started >= 1
    assert not child.alive() and not group_alive(child.pid)


def test_children_get_sigterm_when_the_supervisor_is_killed():
    script = (
        "import io, os, sys, time\n"
        "from ops.supervisor import Supervisor\n"
        "child = Supervisor(io.StringIO()).start('sleeper', ['sleep', '300'],"
        " env=dict(os.environ), cwd='.')\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(300)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "platform"), str(REPO)]))
    supervisor = subprocess.Popen([sys.executable, "-c", script], env=env, cwd=REPO, stdout=subprocess.PIPE, text=True)
    child_pid = int(supervisor.stdout.readline())
    supervisor.send_signal(signal.SIGKILL)  # no chance to clean up
    supervisor.wait()
    assert gone(child_pid), "the child outlived its killed supervisor (PR_SET_PDEATHSIG)"


def test_output_is_prefixed_and_marks_a_child_ready():
    out = io.StringIO()
    sup = Supervisor(out)
    child = sup.start(
        "ray",
        ["bash", "-c", "echo starting; echo 'Ray runtime started.'; sleep 300"],
        env=dict(os.environ),
        cwd=str(REPO),
        ready_when=RayHead.is_ready_line,
    )
    assert child.ready.wait(10)
    sup.stop_all(timeout_s=5)
    assert "ray    | starting\n" in out.getvalue()


def test_a_ray_head_never_takes_redis_port_and_keeps_socket_paths_short(tmp_path):
    head = make_head(tmp_path / ("long-" * 10))
    assert head.port != 6379
    assert len(str(head.temp_dir)) <= 40  # a long ROLLWAY_HOME falls back to /tmp
    assert head.token_path.read_text() and oct(head.token_path.stat().st_mode)[-3:] == "600"
    command = head.command()
    assert command[1:4] == ["start", "--head", "--block"]
    assert not any(arg.endswith("=6379") for arg in command)
    assert head.env() == {
        "RAY_ADDRESS": head.address,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(head.token_path),
    }
    shutil.rmtree(head.temp_dir)


class _Reused:
    """A socket whose OS hands back the port it gave a moment before, as Linux may once
    the first socket is closed: 50001, 50001, 50002, 50002, …"""

    given = itertools.chain.from_iterable((port, port) for port in itertools.count(50001))

    def __init__(self, *_):
        self.port = 0

    def bind(self, _address):
        self.port = next(_Reused.given)

    def getsockname(self):
        return ("127.0.0.1", self.port)

    def close(self):
        pass


def test_free_ports_are_drawn_below_the_ephemeral_range_and_above_rays_worker_ports():
    """Outgoing connections take their local ports from the ephemeral range: a port
    drawn there could be gone before the process it was chosen for binds it."""
    from ops import ray_head

    low, high = ray_head._choosable_ports()
    assert low == 20000 and high > low
    ports = ray_head.free_ports(8)
    assert len(set(ports)) == 8 and all(low <= p < high for p in ports), ports


def test_the_ports_a_ray_node_gets_are_never_the_same_twice(monkeypatch, tmp_path):
    from ops import ray_head
    from ops.local_cluster import LocalCluster, Node

    monkeypatch.setattr(ray_head.socket, "socket", _Reused)
    assert ray_head.free_ports(3, besides={50002}) == [50001, 50003, 50004]
    # Across a cluster's nodes too: the head's GCS port, then each node's own.
    cluster = LocalCluster(tmp_path, [Node(), Node()])
    ports = [int(arg.rsplit("=", 1)[1]) for k in (0, 1) for arg in cluster._argv(k, Node()) if "-port=" in arg]
    ports = [p for p in ports if p]  # the worker ports are 0: the OS's choice per worker
    assert cluster.port in ports  # the head's --port
    assert len(ports) == len(set(ports)) == 1 + 7 + 6, ports


def test_a_port_held_on_another_address_of_the_host_is_not_drawn(monkeypatch):
    """Ray's GCS listens on every address, so a port some process listens on at one
    address (here 127.0.0.2, loopback too) is taken for it, though free on 127.0.0.1."""
    import socket

    from ops import ray_head

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.2", 0))
        held.listen()
        port = held.getsockname()[1]
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("127.0.0.1", port))  # free there: a loopback-only check would draw it
        monkeypatch.setattr(ray_head, "_choosable_ports", lambda: (port, port + 1))
        drawn = ray_head.free_ports(3)
    assert port not in drawn and len(set(drawn)) == 3, drawn


def flaky_cluster(home: Path, fails: dict[int, int]):
    """A LocalCluster of two nodes that are shell commands: the first `fails[k]` starts of
    node k exit before they print Ray's ready line, as a `ray start` whose raylet missed
    Ray's 30 s to register does; every other start prints it and stays up. `starts`
    counts each node's starts."""
    from ops.local_cluster import LocalCluster, Node

    class Flaky(LocalCluster):
        starts: dict[int, int]

        def _argv(self, k, node):
            self.starts[k] = self.starts.get(k, 0) + 1
            if self.starts[k] <= fails.get(k, 0):
                return ["sh", "-c", "echo 'The current node timed out during startup.'; exit 1"]
            return ["sh", "-c", "echo 'Ray runtime started.'; exec sleep 60"]

    cluster = Flaky(home, [Node(), Node()])
    cluster.starts = {}
    return cluster


def test_a_node_that_exits_before_it_is_up_is_started_again(tmp_path):
    cluster = flaky_cluster(tmp_path, fails={1: 2})
    try:
        cluster.start(timeout_s=30)
        assert cluster.starts == {0: 1, 1: 3}
        assert [c.name for c in cluster.children] == ["head", "node1"]
        assert all(c.alive() for c in cluster.children)
        assert cluster.supervisor.children == cluster.children  # the exited starts are not kept
        assert cluster.log.getvalue().count("before it was up, attempt") == 2
    finally:
        cluster.stop()


def test_a_node_that_never_comes_up_fails_the_start_naming_it(tmp_path):
    cluster = flaky_cluster(tmp_path, fails={1: 5})
    try:
        refused = r"Ray node1 exited before it was up, 3 times:[\s\S]*timed out during startup"
        with pytest.raises(RuntimeError, match=refused):
            cluster.start(timeout_s=30)
        assert cluster.starts == {0: 1, 1: 3}
    finally:
        cluster.stop()


def test_the_nodes_start_under_the_hosts_ray_start_lock(tmp_path, monkeypatch):
    """As each node starts, the lock RAY_START_LOCK_ENV names is held: another open of
    the file (as another process's would be) cannot take it; once started, it can."""
    import fcntl

    from workers.core.run_actors import RAY_START_LOCK_ENV

    lock = tmp_path / "ray-start.lock"
    monkeypatch.setenv(RAY_START_LOCK_ENV, str(lock))

    def taken_by_another() -> bool:
        with open(lock, "a") as other:
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(other, fcntl.LOCK_UN)
            return False

    cluster = flaky_cluster(tmp_path, fails={})
    held, argv = [], cluster._argv
    monkeypatch.setattr(cluster, "_argv", lambda k, node: held.append(taken_by_another()) or argv(k, node))
    try:
        cluster.start(timeout_s=30)
        assert held == [True, True] and cluster.starts == {0: 1, 1: 1}
        assert not taken_by_another()
    finally:
        cluster.stop()
