"""Runs on a Ray cluster of two nodes (ops/local_cluster.py: a head labelled
pool=rollout and a second node labelled pool=train, each a `ray start` of its own on
this machine).

- Weights cross the nodes by each protocol that can: the object store, a collective over
  TCP (packed), files in a shared directory. Each run puts the inference pool on one node
  and a trainer pool of 2 fsdp2 ranks on the other, as `placement.inference_node` /
  `placement.trainer_node` say, on the GPUs they ask for, and says where each actor ran; in
  a sync run the workers then hold exactly the trainer's weights (`mismatch/kl` at
  rounding level) and each rank reports its part of each step. (That GRPO learns is
  tests/engine/test_learning.py's to show; a 2-rank pool trains as one rank does,
  tests/engine/test_trainer_pool.py.)
- The second node killed mid-run: the run fails within a minute with a sentence naming
  the node, and nothing of it is left behind; its last checkpoint accounts for every
  row it had drawn, and resumed on the head alone the run closes its prompt ledger
  (last: the node stays dead).

What happens in Ray happens in a process of its own (tests/engine/multinode_runner.py),
joined to this cluster as the platform's worker would be: this pytest process has run
in-process clusters before and keeps per-process Ray state that another cluster refuses.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from ops.local_cluster import LocalCluster, Node
from tests.engine.helpers import TOKEN, assert_exact_sync, wait_for
from tests.engine.ingest_stub import IngestStub
from workers.config.presets import build, deep_merge
from workers.run.checkpoints import BUFFER, INFERENCE, Checkpoint, list_checkpoints
from workers.run.ledger import LedgerTotals

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SPLIT = {
    "placement": {"inference_node": "pool=rollout", "trainer_node": "pool=train"},
    "trainer": {"num_ranks": 2, "backend": "ddp"},
    # Where the actors run and what crosses the nodes does not depend on what the policy
    # knows: a token warm start, not the preset's 400 supervised steps.
    "warm_start": {"steps": 2, "noisy_steps": 1, "batch_size": 8},
}


@pytest.fixture(scope="module")
def nodes():
    home = Path(tempfile.mkdtemp(prefix="rw2n-"))  # short: Ray's socket paths must stay under 108 bytes
    # Each node declares 2 GPUs this host does not have: runs on "gpu" get Ray's GPU ids
    # and CUDA_VISIBLE_DEVICES, and compute on the CPU.
    two = LocalCluster(home, [Node(gpus=2, labels={"pool": "rollout"}), Node(gpus=2, labels={"pool": "train"})])
    try:
        with pytest.MonkeyPatch.context() as env:
            # Ray's GCS finds a lost node by health checks: at its defaults (one every 3 s,
            # dead after 5 failed) the killed node's run waited some 15 s, idle, to fail;
            # here it fails about 3 s after the kill.
            # A killed raylet refuses each check at once; a slow one still has the
            # default 10 s to answer each, so a loaded host is not taken for a lost one.
            env.setenv("RAY_health_check_period_ms", "1000")
            env.setenv("RAY_health_check_failure_threshold", "3")
            two.start()
        yield two
    finally:
        two.stop()
        shutil.rmtree(home, ignore_errors=True)


def in_cluster(nodes: LocalCluster, verb: str, spec: dict, timeout_s: float = 660) -> dict:
    """`verb` (tests/engine/multinode_runner.py) run in a process joined to `nodes`."""
    env = {**os.environ, **nodes.env(), "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "platform")])}
    done = subprocess.run(
        [sys.executable, "-m", "tests.engine.multinode_runner", verb, json.dumps(spec)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, f"{verb} failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return json.loads(lines[-1].removeprefix("RESULT "))


def run(nodes: LocalCluster, run_id: int, cache_dir: str, preset: str, overrides: dict) -> dict:
    spec = {"run_id": run_id, "preset": preset, "config": deep_merge(SPLIT, overrides), "cache_dir": cache_dir}
    out = in_cluster(nodes, "run", spec)
    assert out["state"] == "succeeded", out["error_detail"] or out["error"]
    out["series"] = {name: dict(points) for name, points in out["series"].items()}
    return out


@pytest.mark.parametrize(
    ("run_id", "sync"),
    [
        (9411, {"protocol": "object_store", "bucket_mb": 0.25}),
        (9412, {"protocol": "collective", "packed": True, "bucket_mb": 0.25}),
        (9413, {"protocol": "filesystem", "bucket_mb": 0.25}),
    ],
    ids=["object_store", "collective", "filesystem"],
)
def test_weights_cross_the_nodes_exactly_by_every_protocol_that_can(nodes, cache_dir, run_id, sync):
    overrides = {
        # The token warm start earns little reward, so a batch's groups can all score alike
        # and give no advantage: the entropy bonus gives every step a gradient to sync.
        "trainer": {"backend": "fsdp2", "batch_groups": 4, "group_size": 4, "entropy_coef": 0.1},
        "inference": {"backend": "torch"},
        "placement": {"devices": "gpu"},
        "sync": sync,
        "stop": {"max_steps": 3, "max_minutes": 3},
    }
    out = run(nodes, run_id, cache_dir, "sync", overrides)
    print("\nactor → node → devices:")
    for row in out["placement"]:
        print(
            f"  {row['actor']:<20} {row['node_ip']} pool={row['labels'].get('pool')} node {row['node_id'][:12]} "
            f"GPUs {row['gpu_ids']} CUDA_VISIBLE_DEVICES={row['cuda_visible_devices']!r}"
        )
    rows = {row["actor"]: row for row in out["placement"]}
    pools = {actor: row["labels"].get("pool") for actor, row in rows.items()}
    assert pools["inference worker 0"] == "rollout"
    assert pools["trainer rank 0"] == pools["trainer rank 1"] == "train"
    assert pools["driver"] == pools["buffer"] == "rollout"  # the head: they outlive a lost worker node
    ranks = [rows[f"trainer rank {r}"] for r in (0, 1)]
    assert sorted(r["cuda_visible_devices"] for r in ranks) == ["0", "1"]  # a GPU each on the second node
    assert [len(r["gpu_ids"]) for r in ranks] == [1, 1] and len(rows["inference worker 0"]["gpu_ids"]) == 1
    assert rows["driver"]["gpu_ids"] == rows["buffer"]["gpu_ids"] == []
    s = out["series"]
    assert_exact_sync(s, [1, 2, 3], None)
    assert len(set(s["sync/bytes"].values())) == 1  # the whole policy, every step
    assert all(v > 0 for v in s["sync/latency_ms"].values())  # the weights crossed to the other node


def test_the_second_node_lost_mid_run_fails_the_run_naming_it_and_resumes_accounting_for_every_row(
    nodes, cache_dir, tmp_path
):
    root = str(tmp_path / "checkpoints")
    checkpointed = {"every_steps": 1, "keep_last": 2}
    config = deep_merge(SPLIT, {"stop": {"max_steps": 100_000, "max_minutes": 10}, "checkpoint": checkpointed})
    with IngestStub(token=TOKEN) as stub:
        spec = {"run_id": 9421, "preset": "async", "config": config, "cache_dir": cache_dir, "checkpoint_root": root}
        in_cluster(nodes, "launch", {**spec, "ingest_url": stub.url, "token": TOKEN})
        wait_for(lambda: len(stub.series(9421).get("reward/mean", {})) >= 2, 240, "two trained steps")
        pools = {row["actor"]: row["labels"].get("pool") for row in stub.placement[9421]}  # told to the site
        assert pools["trainer rank 0"] == pools["trainer rank 1"] == "train" and pools["driver"] == "rollout"
        killed_at = nodes.kill(1)
        wait_for(lambda: stub.status.get(9421) == "failed", 90, "the run to fail")
        failed_in = time.time() - killed_at
        error = stub.errors[9421]
        kinds = [body.get("error_kind") for kind, run, body in stub.requests if kind == "status" and run == 9421]
        assert kinds[-1] == "node_lost"  # what the site resumes from a checkpoint while restarts are left
        print(f"\nfailed {failed_in:.1f} s after the node was killed: {error}")
        assert failed_in < 60
        assert error.startswith("The run lost a node: ") and "pool=train" in error and "left the cluster" in error
        assert "trainer rank 0, trainer rank 1" in error and "inference worker" not in error, error
        wait_for(lambda: not in_cluster(nodes, "left", {"run_id": 9421})["actors"], 30, "the run's actors to be gone")
        assert in_cluster(nodes, "left", {"run_id": 9421})["groups"] == ["REMOVED"]

        # The prompt ledger across the node's loss: the last checkpoint the run completed
        # accounts for every row it had drawn, and the run resumed from it on the head
        # alone (one rank: the pool's node is gone) trains on and closes its ledger.
        batch = build("async", config).trainer.batch_groups
        last = list_checkpoints(root, 9421)[-1]
        ckpt = Checkpoint(last["location"])
        at_checkpoint = LedgerTotals.of(ckpt.load_json(INFERENCE), ckpt.load_json(BUFFER))
        assert at_checkpoint.unaccounted == 0 and at_checkpoint.trained == batch * last["step"], at_checkpoint
        steps = last["step"] + 1
        alone = deep_merge(
            config,
            {
                "placement": {"trainer_node": None},
                "trainer": {"num_ranks": 1, "backend": "single"},
                "stop": {"max_steps": steps},
            },
        )
        resumed = {**spec, "run_id": 9422, "config": alone, "resume_from": last["location"]}
        in_cluster(nodes, "launch", {**resumed, "ingest_url": stub.url, "token": TOKEN})
        wait_for(lambda: stub.status.get(9422) in ("succeeded", "failed"), 240, "the resumed run to end")
        assert stub.status[9422] == "succeeded", stub.errors.get(9422)
        wait_for(lambda: not in_cluster(nodes, "left", {"run_id": 9422})["actors"], 60, "the resumed run to go")
        ledger = {name: max(p.items())[1] for name, p in stub.series(9422).items() if name.startswith("ledger/")}
    assert ledger.get("ledger/unaccounted") == 0, ledger
    assert ledger["ledger/trained"] == batch * steps and ledger["ledger/drawn"] >= at_checkpoint.drawn
