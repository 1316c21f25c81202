"""Checkpoints and resume (workers/run/checkpoints.py).

Unit tests first (no Ray): the files round trip through a local root and an fsspec
`memory://` one, with the trainer's, the buffer's and a worker's state restored exactly;
listing, pruning and the refusals of `check_resume`; the reporter's announcement.

Then whole runs on in-process Ray (torch backend, the tiny model of test_equivalence):
a sync run resumed from a checkpoint of another repeats the uninterrupted run step for
step, to the bit, and to the same final weights; pruning keeps `keep_last` and the site
is told; an async run resumed continues the step count.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import sys

import fsspec
import pytest
import ray
import torch

from tests.engine.helpers import TOKEN, fixed_groups, small_config
from tests.engine.helpers import TRAINED as EQUIVALENT
from tests.engine.ingest_stub import IngestStub
from workers.config.presets import build, deep_merge
from workers.core.run_actors import NAMESPACE, actor_name
from workers.model.loading import tied_weight_names
from workers.model.tiny_hf import ARCH_SPECS, ARCHS, make_tiny_checkpoint
from workers.run.buffer import RolloutBuffer
from workers.run.checkpoints import (
    BUFFER,
    INFERENCE,
    LEGACY_MODEL,
    POLICY,
    Checkpoint,
    CheckpointRefused,
    CheckpointTarget,
    StoreNotInstalled,
    check_resume,
    latest_checkpoint,
    list_checkpoints,
    restore_trainer,
    step_dir,
    store_problem,
    trainer_parts,
    write_checkpoint,
)
from workers.run.driver import RunDriver
from workers.run.ledger import CHECKPOINT_IN_FLIGHT_ENV, LedgerTotals, resume_parts
from workers.run.lifecycle import launch
from workers.run.paths import Confinement
from workers.run.reporter import MetricsReporter
from workers.train.trainer import Trainer

# -- the files -------------------------------------------------------------------------


def trained(tiny_model_dir: str, groups) -> Trainer:
    """A trainer one step in, so the optimizer has moments and the RNGs have moved."""
    trainer = Trainer(small_config(), tiny_model_dir)
    trainer.train_step(groups)
    return trainer


def some_parts(trainer: Trainer) -> dict:
    return {**trainer_parts(trainer, starved_s=1.5), INFERENCE: [{"index": 0}], BUFFER: {"groups": []}}


@pytest.fixture
def memory_root():
    root = f"memory://ckpt-{random.getrandbits(32):08x}"
    yield root
    fs = fsspec.filesystem("memory")
    if fs.exists(root):
        fs.rm(root, recursive=True)


@pytest.mark.parametrize("where", ["local", "memory"])
def test_a_trainer_restored_from_a_checkpoint_trains_on_exactly_as_the_original(
    where, tiny_model_dir, tmp_path, memory_root, one_torch_thread
):
    cfg = small_config()
    first, second = fixed_groups(tiny_model_dir, cfg, seed=1), fixed_groups(tiny_model_dir, cfg, seed=2)
    root = str(tmp_path / "ckpt") if where == "local" else memory_root
    original = trained(tiny_model_dir, first)
    torch_rng = torch.get_rng_state()
    record = write_checkpoint(CheckpointTarget(root, 5), original.version, some_parts(original))
    assert record.location == step_dir(root, 5, 1) and record.step == 1 and record.pruned == []
    assert record.location.startswith("memory://") == (where == "memory")

    restored = Trainer(cfg, tiny_model_dir)
    torch.manual_seed(1234)  # moved elsewhere: the checkpoint's RNG state must win
    assert restore_trainer(restored, Checkpoint(record.location)) == 1.5
    assert restored.version == 1
    assert restored.progress.plan_rng.getstate() == original.progress.plan_rng.getstate()
    assert torch.equal(torch.get_rng_state(), torch_rng)
    for name, t in original.model.state_dict().items():
        assert torch.equal(restored.model.state_dict()[name], t), name
    a, b = original.train_step(second), restored.train_step(second)
    for key in ("loss", "trainer/grad_norm", "policy/entropy"):
        assert a[key] == b[key], key
    assert all(torch.equal(restored.model.state_dict()[n], t) for n, t in original.model.state_dict().items())

    meta = latest_checkpoint(root, 5)
    assert meta["location"] == record.location and meta["sha256"] == record.sha256
    assert meta["bytes"] == record.bytes == sum(f["bytes"] for f in meta["files"])
    model_files = {"config.json", "generation_config.json", "model.safetensors"} | {
        "tokenizer.json",
        "tokenizer_config.json",
    }
    assert set(meta["model_files"]) == model_files
    assert {f["name"] for f in meta["files"]} == model_files | {"optimizer.pt", "trainer.pt", INFERENCE, BUFFER}


def test_a_lora_trainer_comes_back_with_its_adapter_and_base(tiny_model_dir, tmp_path, one_torch_thread):
    cfg = small_config(lora={"enabled": True, "rank": 2})
    first, second = fixed_groups(tiny_model_dir, cfg, seed=1), fixed_groups(tiny_model_dir, cfg, seed=2)
    original = Trainer(cfg, tiny_model_dir)
    original.train_step(first)
    record = write_checkpoint(CheckpointTarget(str(tmp_path), 6), 1, trainer_parts(original, 0.0))
    restored = Trainer(cfg, tiny_model_dir)
    restore_trainer(restored, Checkpoint(record.location))
    assert original.train_step(second)["loss"] == restored.train_step(second)["loss"]
    assert all(torch.equal(restored.state_dict()[n], t) for n, t in original.state_dict().items())


def logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits


def test_a_step_directory_loads_with_from_pretrained_and_computes_the_trainers_logits(
    tiny_model_dir, tmp_path, one_torch_thread
):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = small_config()
    trainer = trained(tiny_model_dir, fixed_groups(tiny_model_dir, cfg, seed=1))
    record = write_checkpoint(CheckpointTarget(str(tmp_path), 7), 1, trainer_parts(trainer, 0.0))
    loaded = AutoModelForCausalLM.from_pretrained(record.location)
    ids = AutoTokenizer.from_pretrained(record.location)("abc=")["input_ids"]
    trainer.model.eval()
    assert torch.equal(logits(loaded, ids), logits(trainer.model, ids))
    # Not the weights the run started from: one step moved them.
    assert not torch.equal(logits(AutoModelForCausalLM.from_pretrained(tiny_model_dir), ids), logits(loaded, ids))


@pytest.mark.parametrize("arch", ARCHS)
def test_every_family_resumes_exactly_and_loads_with_from_pretrained(arch, tmp_path, one_torch_thread):
    """Where transformers renames or fuses weights on load (GPT-NeoX's head, the experts of
    Qwen2-MoE and Mixtral), the files hold the checkpoint's names and the resume gets the
    live ones back; a tied output layer is in the file once and tied again on resume."""
    from peft import PeftModel
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    source = make_tiny_checkpoint(str(tmp_path / arch), arch, hidden_size=64)
    ids = [5, 6, 7, 8, 9]
    for lora in (False, True):
        cfg = small_config(lora={"enabled": True, "rank": 2}) if lora else small_config()
        trainer = Trainer(cfg, source)
        with torch.no_grad():  # a policy of its own, so the files cannot be the source's
            for p in trainer.model.parameters():
                p.add_(torch.randn_like(p) * 0.01)
        record = write_checkpoint(CheckpointTarget(str(tmp_path / f"ckpt-{lora}"), 8), 3, trainer_parts(trainer, 0.0))
        restored = Trainer(cfg, source)
        restore_trainer(restored, Checkpoint(record.location))
        state = restored.model.state_dict()
        assert all(torch.equal(state[n], t) for n, t in trainer.model.state_dict().items()), (arch, lora)

        loaded = AutoModelForCausalLM.from_pretrained(record.location)
        trainer.model.eval()
        if lora:  # the top level is the policy merged; base/ and adapter/ it as peft loads it
            merged = logits(loaded, ids)
            torch.testing.assert_close(merged, logits(trainer.model, ids), rtol=1e-5, atol=1e-5, msg=arch)
            base = AutoModelForCausalLM.from_pretrained(os.path.join(record.location, "base"))
            loaded = PeftModel.from_pretrained(base, os.path.join(record.location, "adapter"))
        assert torch.equal(logits(loaded, ids), logits(trainer.model, ids)), (arch, lora)
    tied = sorted(tied_weight_names(loaded))
    assert bool(tied) == ARCH_SPECS[arch].tied
    with safe_open(os.path.join(record.location, "model.safetensors"), "pt") as f:
        assert not set(tied) & set(f.keys()), f"{tied} saved twice"
    state = restored.model.get_base_model().state_dict()
    for name in tied:  # still one tensor under two names
        assert state[name].data_ptr() == state[loaded.get_base_model().all_tied_weights_keys[name]].data_ptr()


def test_a_lora_step_directory_is_the_trained_policy_with_its_base_and_adapter(
    tiny_model_dir, tmp_path, one_torch_thread
):
    """`from_pretrained(<step>)` loads the policy the trainer computes (adapter merged), not
    the untrained base; base/ and adapter/ are that policy as peft loads it."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    cfg = small_config(lora={"enabled": True, "rank": 2})
    trainer = Trainer(cfg, tiny_model_dir)
    trainer.train_step(fixed_groups(tiny_model_dir, cfg, seed=1))
    record = write_checkpoint(CheckpointTarget(str(tmp_path), 9), 1, trainer_parts(trainer, 0.0))
    assert sorted(os.listdir(os.path.join(record.location, "adapter"))) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    ids = [3, 4, 5, 6]
    trainer.model.eval()
    merged = AutoModelForCausalLM.from_pretrained(record.location)
    torch.testing.assert_close(logits(merged, ids), logits(trainer.model, ids), rtol=1e-5, atol=1e-6)
    with trainer.model.disable_adapter():
        untrained = logits(trainer.model, ids)
    assert not torch.allclose(logits(merged, ids), untrained, atol=1e-4), "the step directory is the base"

    base = AutoModelForCausalLM.from_pretrained(os.path.join(record.location, "base"))
    assert torch.equal(logits(base, ids), untrained)
    adapter_dir = os.path.join(record.location, "adapter")
    with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
        assert json.load(f)["base_model_name_or_path"] == os.path.join(record.location, "base")
    policy = PeftModel.from_pretrained(base, adapter_dir)
    assert torch.equal(logits(policy, ids), logits(trainer.model, ids))

    # The resume reads base/ and adapter/: the trainer's weights exactly.
    restored = Trainer(cfg, tiny_model_dir)
    restore_trainer(restored, Checkpoint(record.location))
    want = trainer.model.state_dict()
    assert all(torch.equal(t, want[n]) for n, t in restored.model.state_dict().items())

    # A checkpoint's adapter is refused by a run without LoRA (it would train the base alone).
    with pytest.raises(CheckpointRefused, match="holds a LoRA adapter: resume it with lora.enabled on"):
        restore_trainer(Trainer(small_config(), tiny_model_dir), Checkpoint(record.location))


def test_a_checkpoint_with_its_weights_in_model_pt_still_resumes(tiny_model_dir, tmp_path, one_torch_thread):
    """Written before step directories were model directories: model.pt holds the model's
    state_dict as torch.save wrote it."""
    original = trained(tiny_model_dir, fixed_groups(tiny_model_dir, small_config(), seed=1))
    parts = trainer_parts(original, 2.5)
    parts.pop(POLICY)
    parts[LEGACY_MODEL] = {k: t.detach().clone() for k, t in original.model.state_dict().items()}
    record = write_checkpoint(CheckpointTarget(str(tmp_path), 11), 1, parts)
    assert not os.path.exists(os.path.join(record.location, "config.json"))
    restored = Trainer(small_config(), tiny_model_dir)
    assert restore_trainer(restored, Checkpoint(record.location)) == 2.5
    assert all(torch.equal(restored.model.state_dict()[n], t) for n, t in original.model.state_dict().items())


def test_the_optimizer_state_matters_to_the_next_step(tiny_model_dir, one_torch_thread):
    """The control for the test above: without the optimizer's moments, the next step differs."""
    cfg = small_config()
    first, second = fixed_groups(tiny_model_dir, cfg, seed=1), fixed_groups(tiny_model_dir, cfg, seed=2)
    original = trained(tiny_model_dir, first)
    fresh_moments = Trainer(cfg, tiny_model_dir)
    fresh_moments.model.load_state_dict(original.model.state_dict())
    fresh_moments.progress.plan_rng.setstate(original.progress.plan_rng.getstate())
    original.train_step(second)
    fresh_moments.train_step(second)
    differ = [
        n for n, t in original.model.state_dict().items() if not torch.equal(fresh_moments.model.state_dict()[n], t)
    ]
    assert differ


def test_the_buffer_comes_back_with_its_groups_counters_and_admission_count(tiny_model_dir, one_torch_thread):
    cfg = small_config()
    groups = fixed_groups(tiny_model_dir, cfg, seed=3)
    buf = RolloutBuffer(capacity_groups=8, max_staleness=0, on_stale="requeue")
    for g in groups:
        buf.put(g)
    buf.get(1, current_version=0)  # one trained
    for r in groups[3].rollouts:
        r.token_versions = [-1] * len(r.token_versions)  # stale at the next get: requeued
    buf.get(1, current_version=0)
    state = buf.state_dict()

    again = RolloutBuffer(capacity_groups=8, max_staleness=0, on_stale="requeue")
    again.load_state_dict(state)
    admitted = again.received
    assert again.group_ids() == buf.group_ids() == [groups[2].group_id]
    assert again.stats() == buf.stats()
    assert admitted == 2 + 1 + 1  # trained, waiting, requeued
    (requeued,) = again.take_requeued(5)
    assert requeued.group_id == groups[3].group_id
    assert requeued.rollouts[0].behaviour_logprobs == groups[3].rollouts[0].behaviour_logprobs
    assert again.get(1, current_version=0)[0].rollouts[1].completion_ids == groups[2].rollouts[1].completion_ids


def test_listing_skips_incomplete_steps_and_pruning_keeps_the_last(tmp_path, tiny_model_dir):
    root = str(tmp_path / "ckpt")
    target = CheckpointTarget(root, 9, every_steps=1, keep_last=2)
    parts = {INFERENCE: [], BUFFER: {}}
    records = [write_checkpoint(target, step, parts) for step in (1, 2, 3)]
    assert [r.pruned for r in records] == [[], [], [step_dir(root, 9, 1)]]
    assert write_checkpoint(target, 3, parts) is None  # there already
    os.makedirs(step_dir(root, 9, 4))  # a crash mid-write: no meta.json
    assert [m["step"] for m in list_checkpoints(root, 9)] == [2, 3]
    assert latest_checkpoint(root, 9)["step"] == 3
    assert list_checkpoints(root, 10) == [] and latest_checkpoint(root, 10) is None
    assert sorted(os.listdir(os.path.join(root, "run-9"))) == ["step-00000002", "step-00000003", "step-00000004"]
    with pytest.raises(CheckpointRefused, match="not a complete checkpoint"):
        check_resume(step_dir(root, 9, 4), root)


def test_check_resume_refuses_a_place_outside_the_root(tmp_path, memory_root):
    root = str(tmp_path / "ckpt")
    record = write_checkpoint(CheckpointTarget(root, 1), 2, {INFERENCE: []})
    assert check_resume(record.location, root) == os.path.realpath(record.location)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "meta.json").write_text("{}")
    for location in (str(elsewhere), os.path.join(root, "..", "elsewhere"), memory_root + "/run-1"):
        with pytest.raises(CheckpointRefused, match="outside the checkpoint root"):
            check_resume(location, root)
    os.symlink(elsewhere, os.path.join(root, "link"))
    with pytest.raises(CheckpointRefused, match="outside"):
        check_resume(os.path.join(root, "link"), root)
    with pytest.raises(CheckpointRefused, match="keeps no checkpoints"):
        check_resume(record.location, "")
    url = write_checkpoint(CheckpointTarget(memory_root, 1), 2, {INFERENCE: []}).location
    assert check_resume(url, memory_root) == url
    with pytest.raises(CheckpointRefused, match="outside"):
        check_resume(memory_root + "/run-1/../../other/run-1/step-00000002", memory_root)
    with pytest.raises(CheckpointRefused, match="outside"):
        check_resume(memory_root + "-sibling/run-1/step-00000002", memory_root)


@pytest.mark.parametrize(
    ("root", "package", "extra"), [("s3://bucket/ckpt", "s3fs", "s3"), ("gs://b/c", "gcsfs", "gcs")]
)
def test_an_object_store_root_without_its_filesystem_names_the_extra(monkeypatch, root, package, extra):
    monkeypatch.setitem(sys.modules, package, None)  # not installed, whether it is here or not
    problem = store_problem(root)
    assert problem == (
        f"checkpoint location {root!r} needs {package}, which is not installed: pip install 'rollway[{extra}]' "
        f"('.[cpu,{extra}]' in a checkout; the image: docker build --build-arg EXTRAS={extra})"
    )
    with pytest.raises(StoreNotInstalled, match=re.escape(problem.partition(" needs ")[2])):
        write_checkpoint(CheckpointTarget(root, 1), 2, {INFERENCE: []})
    with pytest.raises(StoreNotInstalled):
        list_checkpoints(root, 1)
    assert store_problem("/var/ckpt") is None and store_problem("memory://ckpt") is None
    assert "fsspec knows no protocol 'nope'" in store_problem("nope://x")


def test_a_damaged_file_is_refused_when_read(tmp_path):
    root = str(tmp_path / "ckpt")
    record = write_checkpoint(CheckpointTarget(root, 1), 2, {INFERENCE: [{"calls": 3}]})
    ckpt = Checkpoint(record.location)
    assert ckpt.load_json(INFERENCE) == [{"calls": 3}]
    with open(os.path.join(record.location, INFERENCE), "w") as f:
        f.write('[{"calls": 4}]')
    with pytest.raises(CheckpointRefused, match="does not match its sha256"):
        Checkpoint(record.location).load_json(INFERENCE)


def test_the_reporter_announces_a_checkpoint_and_retries_while_the_site_is_down(tmp_path):
    with IngestStub(token=TOKEN) as stub:
        reporter = MetricsReporter(3, stub.url, TOKEN, str(tmp_path))
        stub.fail_with = 503
        assert reporter.post_checkpoint(4, "/c/run-3/step-00000004", 10, "ab" * 32, []) is False
        stub.fail_with = None
        reporter.flush(force=True)
        assert reporter.post_checkpoint(6, "/c/run-3/step-00000006", 12, "cd" * 32, ["/c/run-3/step-00000002"])
        assert reporter.close(timeout_s=5)
        assert stub.checkpoints[3] == [
            {"step": 4, "location": "/c/run-3/step-00000004", "bytes": 10, "sha256": "ab" * 32, "pruned": []},
            {
                "step": 6,
                "location": "/c/run-3/step-00000006",
                "bytes": 12,
                "sha256": "cd" * 32,
                "pruned": ["/c/run-3/step-00000002"],
            },
        ]


def test_launch_refuses_a_checkpoint_outside_the_root_or_incomplete(tmp_path):
    root = tmp_path / "ckpt"
    (root / "run-1" / "step-00000002").mkdir(parents=True)
    confinement = Confinement(scratch_root=str(tmp_path / "scratch"), checkpoint_root=str(root))
    common = {
        "ingest_url": "http://127.0.0.1:9",
        "token": TOKEN,
        "cache_dir": str(tmp_path),
        "confinement": confinement,
    }
    with pytest.raises(CheckpointRefused, match="resume_from: .*outside the checkpoint root"):
        launch(2, {}, resume_from=str(tmp_path), **common)
    with pytest.raises(CheckpointRefused, match="resume_from: .*not a complete checkpoint"):
        launch(2, {}, resume_from=str(root / "run-1" / "step-00000002"), **common)


# -- whole runs ------------------------------------------------------------------------

# The series a step's trained batch and weights decide (the equivalence tests' own), and
# what the buffer dropped: a resumed run must repeat them exactly. Timings and occupancy
# are left out.
TRAINED = (*EQUIVALENT, "rollout/mixed_version_frac", "buffer/dropped_stale")
SMALL = {
    "seed": 7,
    "model": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64},
    "warm_start": {"steps": 150, "noisy_steps": 20, "batch_size": 32},
    "inference": {"backend": "torch", "num_workers": 1},
    "trainer": {"batch_groups": 4, "group_size": 4, "lr": 5e-3},
    "stop": {"max_steps": 6, "max_minutes": 3},
    "checkpoint": {"every_steps": 2, "keep_last": 2},
}


def run(preset, run_id, cache_dir, root, stub=None, resume_from=None, env=None, **overrides) -> dict:
    """`env`: the driver's environment variables, which its actors inherit (a test hook's switch)."""
    cfg = build(preset, deep_merge(SMALL, overrides)).model_dump(mode="json")
    confinement = Confinement(scratch_root=os.path.join(cache_dir, "scratch"), checkpoint_root=root)
    options = {"runtime_env": {"env_vars": env}} if env else {}
    driver = RunDriver.options(name=actor_name(run_id), namespace=NAMESPACE, **options).remote(
        run_id,
        cfg,
        stub.url if stub else None,
        TOKEN,
        cache_dir,
        exit_when_done=False,
        confinement=confinement,
        resume_from=resume_from,
    )
    try:
        out = ray.get(driver.run.remote(), timeout=240)
    finally:
        ray.kill(driver)
    assert out["state"] == "succeeded", out["error_detail"] or out["error"]
    out["series"] = {name: dict(points) for name, points in out["series"].items()}
    return out


@pytest.fixture(scope="module")
def ckpt_root(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("checkpoints"))


@pytest.fixture(scope="module")
def sync_run(cluster, cache_dir, ckpt_root):
    with IngestStub(token=TOKEN) as stub:
        out = run("sync", 301, cache_dir, ckpt_root, stub=stub)
        out["posted"] = stub.checkpoints.get(301, [])
    return out


def test_a_sync_run_checkpoints_every_two_steps_keeps_the_last_two_and_tells_the_site(sync_run, ckpt_root):
    at = [step_dir(ckpt_root, 301, k) for k in (2, 4, 6)]
    posted = [(body["step"], body["location"], body["pruned"]) for body in sync_run["posted"]]
    # Step 6 is both periodic and the end: written once.
    assert posted == [(2, at[0], []), (4, at[1], []), (6, at[2], [at[0]])]
    assert [m["location"] for m in list_checkpoints(ckpt_root, 301)] == at[1:]
    assert sorted(os.listdir(os.path.join(ckpt_root, "run-301"))) == ["step-00000004", "step-00000006"]
    for body, meta in zip(sync_run["posted"][1:], list_checkpoints(ckpt_root, 301), strict=True):
        assert (body["bytes"], body["sha256"]) == (meta["bytes"], meta["sha256"])
    # Something to compare: GRPO had signal at every step.
    assert all(v > 1e-3 for v in sync_run["series"]["trainer/grad_norm"].values())
    # Every row drawn is accounted for: trained, or where it was when the run stopped.
    assert_ledger_closes(sync_run, trained=4 * 6)


def assert_ledger_closes(out: dict, trained: int) -> None:
    """The run's prompt ledger at its end, as its summary and its `ledger/*` points say."""
    ledger = out["ledger"]
    assert ledger["ledger/unaccounted"] == 0, ledger
    assert ledger["ledger/trained"] == trained and ledger["ledger/drawn"] >= trained, ledger
    points = {name: values[out["steps"]] for name, values in out["series"].items() if name.startswith("ledger/")}
    assert points == ledger


def test_a_sync_run_resumed_from_a_checkpoint_repeats_the_uninterrupted_run(sync_run, cache_dir, ckpt_root):
    resumed = run("sync", 302, cache_dir, ckpt_root, resume_from=step_dir(ckpt_root, 301, 4))
    a, b = sync_run["series"], resumed["series"]
    assert sorted(b["loss"]) == [5, 6]  # steps continue from the checkpoint's; max_steps is the total
    assert resumed["steps"] == 6
    mismatched = [
        f"{name}@{step}: {a[name][step]!r} vs {b[name].get(step)!r}"
        for name in TRAINED
        for step in (5, 6)
        if name in a and not (step in b.get(name, {}) and math.isclose(a[name][step], b[name][step], abs_tol=0))
    ]
    assert mismatched == []
    assert resumed["policy_sha256"] == sync_run["policy_sha256"]
    # Its own checkpoints go under its own id.
    assert [c["step"] for c in resumed["checkpoints"]] == [6]
    assert resumed["checkpoints"][0]["location"] == step_dir(ckpt_root, 302, 6)


def test_a_driver_refuses_to_resume_from_an_incomplete_checkpoint(cluster, cache_dir, ckpt_root):
    os.makedirs(step_dir(ckpt_root, 399, 2))
    cfg = build("sync", SMALL).model_dump(mode="json")
    confinement = Confinement(scratch_root=os.path.join(cache_dir, "scratch"), checkpoint_root=ckpt_root)
    driver = RunDriver.options(name=actor_name(303), namespace=NAMESPACE).remote(
        303,
        cfg,
        None,
        TOKEN,
        cache_dir,
        exit_when_done=False,
        confinement=confinement,
        resume_from=step_dir(ckpt_root, 399, 2),
    )
    try:
        out = ray.get(driver.run.remote(), timeout=60)
    finally:
        ray.kill(driver)
    assert out["state"] == "failed"
    assert "not a complete checkpoint" in out["error"] + out["error_detail"]


def test_an_async_run_resumed_from_a_checkpoint_continues_the_step_count(sync_run, cache_dir, ckpt_root):
    # A checkpoint holds state, not the mode: the sync run's step 4 resumes as async.
    resumed = run("async", 304, cache_dir, ckpt_root, resume_from=step_dir(ckpt_root, 301, 4), stop={"max_steps": 7})
    assert sorted(resumed["series"]["loss"]) == [5, 6, 7]
    assert resumed["series"]["policy/version"] == {5: 5.0, 6: 6.0, 7: 7.0}
    # Inference ran ahead again, and within max_staleness: the gate's count was restored.
    assert max(resumed["series"]["staleness/max"].values()) <= 1.0
    # Step 6's checkpoint was taken with inference running ahead (the trainer's prefetch
    # and the buffer may hold groups), step 7's at the end with the loops stopped.
    assert [c["step"] for c in resumed["checkpoints"]] == [6, 7]
    for step in (6, 7):
        ckpt = Checkpoint(check_resume(step_dir(ckpt_root, 304, step), ckpt_root))  # complete and intact
        assert ckpt.load_torch("trainer.pt")["version"] == step
        state = ckpt.load_json(BUFFER)
        assert state["total_got"] == 4 * step  # groups trained, the parent run's included
        (worker,) = ckpt.load_json(INFERENCE)
        assert worker["calls"] > 0 and worker["version"] <= step
        # Written mid-run (step 6) or stopped (7): every row drawn, the parent run's
        # included, is trained, in the buffer, or in flight with the worker.
        assert LedgerTotals.of([worker], state).unaccounted == 0
    assert_ledger_closes(resumed, trained=4 * 7)


def test_rows_in_flight_at_a_checkpoint_are_carried_and_the_ledger_closes_after_the_resume(
    cluster, cache_dir, ckpt_root
):
    # The buffer holds one batch and the gate lets the worker run three batches ahead, so
    # while the trainer writes, the worker has drawn the batch after the buffered one; the
    # hook holds each periodic checkpoint until it has (CHECKPOINT_IN_FLIGHT_ENV).
    ahead = {
        "buffer": {"mode": "bounded", "capacity": 1, "max_staleness": 3, "max_head_offpolicyness": 3},
        "stop": {"max_steps": 4},
    }
    parent = run("async", 306, cache_dir, ckpt_root, env={CHECKPOINT_IN_FLIGHT_ENV: "1"}, **ahead)
    assert_ledger_closes(parent, trained=4 * 4)
    location = step_dir(ckpt_root, 306, 2)
    ckpt = Checkpoint(location)
    workers, buffer = ckpt.load_json(INFERENCE), ckpt.load_json(BUFFER)
    ((_, carried_rows),) = resume_parts(workers, buffer, num_workers=1)
    assert carried_rows, "the hook should have held the checkpoint until rows were in flight"
    assert LedgerTotals.of(workers, buffer).unaccounted == 0
    # Resumed, the worker generates the carried rows first: every row the parent drew
    # before its checkpoint, and every row drawn since, is accounted for at the end.
    resumed = run("async", 307, cache_dir, ckpt_root, resume_from=location, **ahead)
    assert sorted(resumed["series"]["loss"]) == [3, 4]
    assert_ledger_closes(resumed, trained=4 * 4)
    assert resumed["ledger"]["ledger/drawn"] >= workers[0]["drawn"]
    # Its first call took them all (a batch's worth at most): none waits at its end.
    (end,) = Checkpoint(step_dir(ckpt_root, 307, 4)).load_json(INFERENCE)
    assert end["carried"] == [] and len(carried_rows) <= 4
