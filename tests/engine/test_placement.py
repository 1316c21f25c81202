"""A run's placement in Ray (workers/run/placement.py): the bundles and each actor's seat,
worked out from the config without Ray; then real runs on the shared cluster, whose 4
GPUs are declared (this host has none, so the actors still compute on the CPU): each
actor sees the GPUs Ray gave it, disjoint per pool or shared when colocated, a reward
worker holds its own bundle, and the run's placement group is gone once its actors stop.
A whole run costs most of its time in start-up, so two of these runs check more than
placement: the disaggregated run syncs by a packed collective (test_sync_in_runs.py's
other syncs), the reward worker's run reports its pool's figures (test_reward_stage.py)."""

from __future__ import annotations

import itertools
import os

import pydantic
import pytest
import ray

from tests.engine.helpers import GONE_WAIT_S, TOKEN, policy_bytes, tiny_config, wait_for, warm_started
from workers.config.run_config import RunConfig
from workers.core.run_actors import NAMESPACE, actor_name, placement_group_name, run_actor_names
from workers.rollout.reward_stage import POOL_SERIES
from workers.run import placement
from workers.run.driver import RunDriver
from workers.run.failures import ChildFailed
from workers.run.lifecycle import cancel, launch
from workers.run.placement import Seat


def cfg(**sections) -> RunConfig:
    return RunConfig.model_validate(sections)


def gpus(workers: int = 1, ranks: int = 1, mode: str = "disaggregated", **placement_fields) -> RunConfig:
    return cfg(
        inference={"num_workers": workers},
        trainer={"num_ranks": ranks, "backend": "ddp" if ranks > 1 else "single"},
        placement={"devices": "gpu", "mode": mode, **placement_fields},
    )


# --- the plan, without Ray ------------------------------------------------------------


def test_by_default_each_actor_has_a_cpu_bundle_of_its_own_and_asks_no_gpu():
    p = placement.plan(RunConfig())
    assert p.bundles == [{"CPU": 0.25}, {"CPU": 0.25}]
    assert p.inference == [Seat(bundle=0, num_cpus=0.25, num_gpus=0.0)]
    assert p.trainer == [Seat(bundle=1, num_cpus=0.25, num_gpus=0.0)]
    assert p.rewards == []
    assert (p.strategy, p.selectors) == ("PACK", [{}, {}])
    assert placement.totals(RunConfig()).gpus == 0


def test_taking_turns_on_cpus_each_phase_gets_every_thread_the_runs_actors_have():
    # Always a count on CPUs, whatever OMP_NUM_THREADS the environment exports.
    def turns(**fields):
        return placement.phase_threads(RunConfig.model_validate(fields))

    assert turns(mode="sync") == (2, 2)  # a thread each by default (0.25 CPU): both in each phase
    # Two workers of 1 CPU and one rank of 2: 4 threads, shared by the phase's actors.
    sized = {"inference": {"num_workers": 2, "cpus_per_worker": 1}, "trainer": {"cpus_per_rank": 2}}
    assert turns(mode="sync", **sized) == (2, 4)
    assert turns(mode="async") == (1, 1)  # side by side: each its own (at least 1)
    assert turns(mode="async", **sized) == (1, 2)
    gpu = {"devices": "gpu", "mode": "colocated"}
    assert turns(mode="sync", placement=gpu) == (1, 1)  # computing on GPUs: each its own
    assert turns(mode="sync", placement={"cpu_threads": 1}) == (1, 1)  # pinned, in either mode
    assert turns(mode="async", placement={"cpu_threads": 3}) == (3, 3)


def test_each_reward_worker_has_a_bundle_of_its_own_after_the_pools_with_its_node_label():
    c = cfg(
        inference={"num_workers": 2},
        rewards={"workers": 2, "cpus_per_worker": 1, "gpus_per_worker": 1},
        placement={"devices": "gpu", "rewards_node": "pool=reward"},
    )
    p = placement.plan(c)
    assert p.bundles[3:] == [{"CPU": 1, "GPU": 1}] * 2
    assert p.rewards == [Seat(3, 1, 1), Seat(4, 1, 1)]
    assert p.selectors == [{}, {}, {}, {"pool": "reward"}, {"pool": "reward"}]
    assert "2 reward worker(s) × {CPU: 1, GPU: 1} on nodes pool=reward" in p.summary
    t = placement.totals(c)
    assert (t.gpus, t.rewards_gpus, t.cpus) == (5, 2, 2 * 0.25 + 0.25 + 2 * 1)
    # A share of one GPU each; colocated pools keep sharing their GPUs, the reward
    # workers' bundles stay their own.
    shared = cfg(
        inference={"num_workers": 2},
        rewards={"workers": 2, "gpus_per_worker": 0.5},
        placement={"devices": "gpu", "mode": "colocated"},
    )
    p = placement.plan(shared)
    assert p.bundles == [{"CPU": 0.5, "GPU": 1}, {"CPU": 0.25, "GPU": 1}] + [{"CPU": 0.25, "GPU": 0.5}] * 2
    assert [s.bundle for s in p.rewards] == [2, 3]
    assert placement.totals(shared).gpus == 2 + 1
    # On the CPU a reward worker reserves its CPUs only.
    assert placement.plan(cfg(rewards={"workers": 1})).bundles[-1] == {"CPU": 0.25}


def test_disaggregated_pools_ask_for_gpus_of_their_own():
    c = cfg(
        inference={"num_workers": 3, "tensor_parallel_size": 2, "cpus_per_worker": 1},
        trainer={"num_ranks": 2, "cpus_per_rank": 2, "backend": "fsdp2"},
        placement={"devices": "gpu", "strategy": "STRICT_PACK"},
    )
    p = placement.plan(c)
    assert p.bundles == [{"CPU": 1, "GPU": 2}] * 3 + [{"CPU": 2, "GPU": 1}] * 2
    assert p.inference == [Seat(k, 1, 2) for k in range(3)]
    assert p.trainer == [Seat(3, 2, 1), Seat(4, 2, 1)]
    assert p.strategy == "STRICT_PACK"
    assert "3 inference worker(s) × {CPU: 1, GPU: 2}" in p.summary
    assert "2 trainer rank(s) × {CPU: 2, GPU: 1}" in p.summary


def test_colocated_worker_k_and_rank_k_share_gpu_k():
    p = placement.plan(gpus(workers=2, ranks=1, mode="colocated"))
    assert p.bundles == [{"CPU": 0.5, "GPU": 1}, {"CPU": 0.25, "GPU": 1}]
    assert p.inference == [Seat(0, 0.25, 0.5), Seat(1, 0.25, 1.0)]  # worker 1 has its GPU to itself
    assert p.trainer == [Seat(0, 0.25, 0.5)]
    p = placement.plan(gpus(workers=1, ranks=2, mode="colocated"))
    assert [s.bundle for s in p.trainer] == [0, 1]
    assert [s.num_gpus for s in p.trainer] == [0.5, 1.0]


def test_each_pool_bundles_carry_its_node_label_selector():
    p = placement.plan(gpus(workers=2, inference_node="pool=rollout", trainer_node="pool=in(train,big)"))
    assert p.selectors == [{"pool": "rollout"}, {"pool": "rollout"}, {"pool": "in(train,big)"}]
    assert "on nodes pool=rollout" in p.summary
    # Colocated bundles hold both pools: both selectors apply.
    p = placement.plan(gpus(workers=2, mode="colocated", inference_node="zone=a", trainer_node="pool=train"))
    assert p.selectors == [{"zone": "a", "pool": "train"}, {"zone": "a"}]


@pytest.mark.parametrize(
    ("workers", "tp", "ranks", "scorers", "devices", "mode"),
    [
        (w, tp, r, k, d, m)
        for w, tp, r, k, d, m in itertools.product(
            [1, 2, 5], [1, 3], [1, 2], [0, 3], ["cpu", "gpu"], ["disaggregated", "colocated"]
        )
        if not (m == "colocated" and (d == "cpu" or tp > 1))
    ],
)
def test_the_totals_admission_counts_are_the_plans_own(workers, tp, ranks, scorers, devices, mode):
    c = cfg(
        inference={"num_workers": workers, "tensor_parallel_size": tp},
        trainer={"num_ranks": ranks, "backend": "ddp" if ranks > 1 else "single"},
        rewards={"workers": scorers, "gpus_per_worker": 0.5 if scorers and devices == "gpu" else 0},
        placement={"devices": devices, "mode": mode},
    )
    p, t = placement.plan(c), placement.totals(c)
    assert t.gpus == sum(b.get("GPU", 0) for b in p.bundles)
    assert t.rewards_gpus == sum(p.bundles[s.bundle].get("GPU", 0) for s in p.rewards)
    assert t.cpus == pytest.approx(sum(b["CPU"] for b in p.bundles))
    assert len(p.rewards) == scorers
    seats = [*p.inference, *p.trainer, *p.rewards]
    for k, bundle in enumerate(p.bundles):  # a bundle holds what its actors ask for, and they ask
        here = [s for s in seats if s.bundle == k]
        assert bundle["CPU"] == pytest.approx(sum(s.num_cpus for s in here))
        if devices == "gpu":
            assert 0 < sum(s.num_gpus for s in here) <= bundle["GPU"]
    assert len(p.selectors) == len(p.bundles)


@pytest.mark.parametrize(
    ("sections", "says"),
    [
        ({"placement": {"mode": "colocated"}}, "set placement.devices to 'gpu'"),
        (
            {"placement": {"mode": "colocated", "devices": "gpu"}, "inference": {"tensor_parallel_size": 2}},
            "set inference.tensor_parallel_size to 1",
        ),
        ({"placement": {"inference_node": "pool"}}, "placement.inference_node 'pool' is not a Ray node label"),
        ({"placement": {"trainer_node": "pool=a b"}}, "placement.trainer_node"),
        (
            {"placement": {"mode": "colocated", "devices": "gpu", "inference_node": "p=a", "trainer_node": "p=b"}},
            "must not ask different values of one label",
        ),
        ({"placement": {"strategy": "BALANCED"}}, "'PACK', 'SPREAD', 'STRICT_PACK' or 'STRICT_SPREAD'"),
        ({"inference": {"cpus_per_worker": 0}}, "greater than or equal to 0.0001"),
        ({"placement": {"rewards_node": "reward"}}, "placement.rewards_node 'reward' is not a Ray node label"),
        (
            {"rewards": {"workers": 1, "gpus_per_worker": 1}},
            "rewards.gpus_per_worker 1 asks Ray for GPUs, but placement.devices is 'cpu'",
        ),
        (
            {"rewards": {"workers": 1, "gpus_per_worker": 1.5}, "placement": {"devices": "gpu"}},
            "set it below 1 (a share of one GPU) or to a whole number",
        ),
        (
            {"rewards": {"gpus_per_worker": 1}, "placement": {"devices": "gpu"}},
            "but rewards.workers is 0: set rewards.workers ≥ 1, or rewards.gpus_per_worker to 0",
        ),
        ({"rewards": {"workers": 1, "cpus_per_worker": 0}}, "greater than or equal to 0.0001"),
    ],
)
def test_a_placement_that_cannot_work_is_refused_naming_the_fields(sections, says):
    with pytest.raises(pydantic.ValidationError, match=says.replace("(", r"\(").replace(")", r"\)")):
        cfg(**sections)


# --- real runs on the shared cluster (4 GPUs declared) -----------------------------------


def actor_devices(name: str) -> tuple[list, str | None]:
    """The GPU ids Ray gave the named actor and the CUDA_VISIBLE_DEVICES it runs under."""
    actor = ray.get_actor(name, namespace=NAMESPACE)
    return ray.get(
        actor.__ray_call__.remote(lambda _: (ray.get_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES"))), timeout=120
    )


def group_state(run_id: int) -> str | None:
    """The state of run `run_id`'s placement group (None: never created)."""
    name = placement_group_name(run_id)
    states = [g["state"] for g in ray.util.placement_group_table().values() if g["name"] == name]
    # Ray keeps removed groups in its table: a second group of the name is another test's
    # run of the same id, whose state would stand in for this one's.
    assert len(states) <= 1, f"{len(states)} placement groups named {name}: give this test a run id of its own"
    return states[0] if states else None


@pytest.mark.slow
def test_disaggregated_pools_run_on_disjoint_gpus_sync_by_a_packed_collective_and_give_them_back(
    cluster, stub, cache_dir
):
    """2 inference workers + 2 trainer ranks on the 4 declared GPUs: one each. The run is
    also the packed collective's (a whole run costs most of its time in start-up): rank 0
    broadcasts the policy in 0.25 MB buckets to both workers, every parameter each step."""
    config = tiny_config(
        inference={"num_workers": 2},
        trainer={"batch_groups": 4, "group_size": 4, "num_ranks": 2, "backend": "ddp"},
        sync={"protocol": "collective", "packed": True, "bucket_mb": 0.25},
        placement={"devices": "gpu"},
        stop={"max_steps": 10_000},
    )
    warm_started(config, cache_dir)
    launch(9141, config, ingest_url=stub.url, token=TOKEN, cache_dir=cache_dir)
    try:
        names = ["run-9141-inference-0", "run-9141-inference-1", "run-9141-trainer", "run-9141-trainer-1"]
        wait_for(lambda: set(names) <= set(run_actor_names(9141)), 120, "the run's actors")
        seen = {name: actor_devices(name) for name in names}
        print({name: visible for name, (_, visible) in seen.items()})
        ids = [tuple(gpu_ids) for gpu_ids, _ in seen.values()]
        assert all(len(i) == 1 for i in ids) and len(set(ids)) == 4, seen
        for gpu_ids, visible in seen.values():
            assert visible == ",".join(str(i) for i in gpu_ids)
        assert group_state(9141) == "CREATED"

        # It trains, on the CPU, and its versions reach the workers.
        def three_steps_synced():
            series = stub.series(9141)
            steps = {1, 2, 3} <= set(series.get("reward/mean", {}))
            return steps and series.get("sync/latency_ms") and series.get("sync/inference_ms")

        wait_for(three_steps_synced, 240, "three steps and a version loaded")
        series = stub.series(9141)
        full = policy_bytes(cache_dir, config=config)
        assert set(series["sync/bytes"].values()) == {float(full)}  # every parameter, every step
        assert all(v > 0 for v in series["sync/trainer_ms"].values())
        assert series["sync/inference_ms"] and all(v > 0 for v in series["sync/latency_ms"].values())
    finally:
        # A failed check must not leave the run holding 3 of the cluster's 4 GPUs.
        assert cancel(9141, timeout_s=10)
    wait_for(lambda: group_state(9141) == "REMOVED", GONE_WAIT_S, "the placement group to be removed")
    assert ray.available_resources().get("GPU") == 4


@pytest.mark.slow
def test_colocated_worker_and_trainer_share_a_gpu_and_the_driver_removes_the_group(cluster, cache_dir):
    """2 inference workers + 2 trainer ranks colocated: worker k and rank k share GPU k."""
    config = tiny_config(
        inference={"num_workers": 2},
        trainer={"batch_groups": 4, "group_size": 4, "num_ranks": 2, "backend": "ddp"},
        placement={"devices": "gpu", "mode": "colocated"},
        stop={"max_steps": 10_000},
    )
    warm_started(config, cache_dir)
    driver = RunDriver.options(name=actor_name(9142), namespace=NAMESPACE).remote(
        9142, config, None, "", cache_dir, exit_when_done=False
    )
    try:
        done = driver.run.remote()
        names = ["run-9142-inference-0", "run-9142-inference-1", "run-9142-trainer", "run-9142-trainer-1"]
        wait_for(lambda: set(names) <= set(run_actor_names(9142)), 120, "the run's actors")
        seen = {name: actor_devices(name) for name in names}
        print({name: visible for name, (_, visible) in seen.items()})
        assert seen["run-9142-trainer"] == seen["run-9142-inference-0"]
        assert seen["run-9142-trainer-1"] == seen["run-9142-inference-1"]
        assert len(seen["run-9142-trainer"][0]) == 1
        assert set(seen["run-9142-inference-1"][0]).isdisjoint(seen["run-9142-trainer"][0])

        ray.get(driver.stop.remote())
        assert ray.get(done, timeout=120)["state"] == "cancelled"
        # The driver is still alive: it removed the group itself.
        assert group_state(9142) == "REMOVED"
    finally:
        ray.kill(driver)


def actor_resources(name: str) -> tuple[dict, str | None]:
    """What Ray assigned the named actor and the id of the placement group it runs in."""

    def inside(_actor) -> tuple[dict, str | None]:
        ctx = ray.get_runtime_context()
        return ctx.get_assigned_resources(), ctx.get_placement_group_id()

    actor = ray.get_actor(name, namespace=NAMESPACE)
    return ray.get(actor.__ray_call__.remote(inside), timeout=120)


@pytest.mark.slow
def test_a_reward_worker_on_gpus_gets_its_own_bundles_gpu_and_the_run_trains_reporting_the_pools_figures(
    cluster, stub, cache_dir
):
    """1 inference worker, 1 trainer and 1 reward worker asking 1 GPU and 0.5 CPU: 3 of
    the 4 declared GPUs, one each; the reward worker's in its bundle of the run's group.
    The run is also the `after` reward pool's (test_reward_stage.py runs the pipelined
    one): each step reports how busy the pool was and how long a completion waited for
    its score."""
    config = tiny_config(
        rewards={"workers": 1, "mode": "after", "cpus_per_worker": 0.5, "gpus_per_worker": 1},
        placement={"devices": "gpu"},
        stop={"max_steps": 10_000},
    )
    warm_started(config, cache_dir)
    launch(9144, config, ingest_url=stub.url, token=TOKEN, cache_dir=cache_dir)
    try:
        names = ["run-9144-inference-0", "run-9144-trainer", "run-9144-reward-0"]
        wait_for(lambda: set(names) <= set(run_actor_names(9144)), 120, "the run's actors")
        seen = {name: actor_devices(name) for name in names}
        ids = [tuple(gpu_ids) for gpu_ids, _ in seen.values()]
        assert all(len(i) == 1 for i in ids) and len(set(ids)) == 3, seen
        assigned, group_id = actor_resources("run-9144-reward-0")
        assert assigned == {"CPU": 0.5, "GPU": 1.0}
        (group,) = [g for g in ray.util.placement_group_table().values() if g["name"] == placement_group_name(9144)]
        assert group_id == group["placement_group_id"]
        assert group["bundles"][2] == {"CPU": 0.5, "GPU": 1.0}  # after the inference worker's and the trainer's
        # It trains, its rewards scored by the pool (on the CPU: this host has no GPU).
        scored = ("loss", *sorted(POOL_SERIES))
        wait_for(
            lambda: all(len(stub.series(9144).get(s, {})) >= 3 for s in scored), 240, "three scored, trained steps"
        )
        series = stub.series(9144)
        # A collection in which the worker scored nothing (a loaded host can bring one) is a
        # true 0; the pool must have worked in some. A lag is reported only where it scored.
        busy = list(series["reward/pool_busy_frac"].values())
        assert all(0 <= v <= 1 for v in busy) and any(v > 0 for v in busy), busy
        assert all(v > 0 for v in series["reward/scoring_lag_ms"].values())
        # The run's own report of where its actors ran: the reward worker on a GPU of its own.
        gpus = {row["actor"]: row["gpu_ids"] for row in stub.placement[9144]}
        others = {g for actor, ids in gpus.items() if actor != "reward worker 0" for g in ids}
        assert len(gpus["reward worker 0"]) == 1 and not others & set(gpus["reward worker 0"]), gpus
    finally:
        assert cancel(9144, timeout_s=10)
    wait_for(lambda: group_state(9144) == "REMOVED", GONE_WAIT_S, "the placement group to be removed")
    assert ray.available_resources().get("GPU") == 4


def test_a_group_the_cluster_cannot_place_fails_the_spawn_naming_the_request(cluster, tmp_path, monkeypatch):
    driver_class = RunDriver.__ray_actor_class__  # outside Ray: the driver runs in this process
    monkeypatch.setattr("workers.run.spawn.SPAWN_TIMEOUT_S", 1.0)
    config = {"placement": {"devices": "gpu", "inference_node": "pool=nowhere"}}
    driver = driver_class(9143, config, None, "", str(tmp_path))
    try:
        with pytest.raises(ChildFailed) as failed:
            driver._spawn(str(tmp_path))
    finally:
        driver._kill_children()
    message = str(failed.value)
    assert "could not place the run's actors" in message
    assert "1 inference worker(s) × {CPU: 0.25, GPU: 1} on nodes pool=nowhere" in message
    assert group_state(9143) == "REMOVED"
    assert run_actor_names(9143) == []


def test_a_driver_refuses_a_pool_size_the_engine_cannot_run_before_its_warm_start(tmp_path):
    driver = RunDriver.__ray_actor_class__(144, {"inference": {"tensor_parallel_size": 2}}, None, "", str(tmp_path))
    out = driver.run()
    assert out["state"] == "failed"
    assert "read only by vLLM (inference.backend 'vllm')" in out["error"]
    assert "warm_start" not in out["timings"]


def test_a_trainer_pool_needs_a_data_parallel_backend():
    with pytest.raises(pydantic.ValidationError, match="set trainer.backend to 'ddp'"):
        cfg(trainer={"num_ranks": 2})
    with pytest.raises(pydantic.ValidationError, match="trainer.backend 'fsdp2' shards them"):
        cfg(
            trainer={"num_ranks": 2, "backend": "fsdp2"},
            placement={"devices": "gpu", "mode": "colocated"},
            sync={"protocol": "cuda_ipc"},
        )
