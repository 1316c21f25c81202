"""An fsdp2 pool's checkpoints, checksum and export never hold the whole model on one rank.

The real Trainer on the real pool (two Ray processes, gloo on this CPU host):

- a checkpoint is torch.distributed.checkpoint's shards (each rank writes its own) plus
  the Hugging Face model files, streamed a safetensors shard at a time; resumed onto the
  same pool it repeats the uninterrupted step bit for bit, and DCP reshards it onto one
  rank (a single trainer, or an fsdp2 pool of one), whole onto each rank of a ddp pool,
  and from one rank back onto two;
- `GatherMeter` counts the bytes of whole (all-gathered) tensors alive at once on a rank:
  the checkpoint, checksum and export peak at one bucket, where the full-state gather
  they replace peaks at the whole model.
"""

from __future__ import annotations

import copy
import gc
import json
import os
import sys
import weakref

import pytest
import ray
import torch
from ray import cloudpickle

from tests.engine.helpers import PoolRank, build_pool, fixed_groups, small_config
from workers.run.checkpoints import (
    OPTIMIZER,
    SHARDED,
    Checkpoint,
    CheckpointTarget,
    restore_trainer,
    write_checkpoint,
)
from workers.sync.base import state_checksum
from workers.train.trainer import Trainer

CPU = torch.device("cpu")
# Ray ships this module by value: its workers cannot import a test file.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class GatherMeter:
    """Bytes of whole tensors a rank holds at once: every all-gather of a DTensor (its
    `redistribute` to Replicate, which `full_tensor` and torch's full state dict both
    run) is counted from when it returns until its storage is freed."""

    def __init__(self) -> None:
        self.alive = self.peak = self.total = 0

    def __enter__(self) -> GatherMeter:
        from torch.distributed.tensor import DTensor, Replicate

        self._original = original = DTensor.redistribute
        meter = self
        # What the process built before metering (torch, transformers, the model: hundreds
        # of thousands of objects) is left out of the collections below, which then walk
        # only what was made since: a full walk per gather was 96% of the ranks' CPU.
        # (`__exit__` thaws everything frozen, an earlier freeze's too: these ranks make none.)
        gc.freeze()

        def redistribute(dt, *args, **kwargs):
            out = original(dt, *args, **kwargs)
            if all(isinstance(p, Replicate) for p in out.placements):
                # What the code still holds, not what the cycle collector has yet to free:
                # a gathered tensor left in a reference cycle would otherwise count until
                # a collection happens to run (once, two whole tensors: a flaky peak).
                gc.collect()
                local = out._local_tensor
                nbytes = local.numel() * local.element_size()
                meter.alive += nbytes
                meter.total += nbytes
                meter.peak = max(meter.peak, meter.alive)
                weakref.finalize(local.untyped_storage(), meter._freed, nbytes)
            return out

        DTensor.redistribute = redistribute
        return self

    def _freed(self, nbytes: int) -> None:
        self.alive -= nbytes

    def __exit__(self, *exc) -> None:
        from torch.distributed.tensor import DTensor

        DTensor.redistribute = self._original
        gc.unfreeze()


def _wait_for(refs):
    return lambda: [f for files in ray.get(refs) for f in files]


@ray.remote(num_cpus=0)
class Rank(PoolRank):
    """A pool rank (tests/engine/helpers.py) that checkpoints, checksums and exports,
    metering the whole tensors it gathers."""

    def checkpoint(self, root: str, others: list) -> tuple[str, int]:
        """Rank 0: write a checkpoint (ranks 1.. write their shards); its location and
        this rank's peak of whole tensors held meanwhile."""
        from workers.run.checkpoints import trainer_parts

        def start(location, path):
            return _wait_for([o.checkpoint_shards.remote(location, path) for o in others])

        with GatherMeter() as meter:
            parts = trainer_parts(self.trainer, 0.0, others=start)
            record = write_checkpoint(CheckpointTarget(root, 1), self.trainer.version, parts)
        return record.location, meter.peak

    def checkpoint_shards(self, location: str, path: str) -> list[dict]:
        from workers.run.checkpoints import write_shards

        with GatherMeter() as meter:
            files = write_shards(self.trainer, location, path)
        self.shards_peak = meter.peak
        return files

    def last_shards_peak(self) -> int:
        """This rank's peak of whole tensors held while it wrote its last shards."""
        return self.shards_peak

    def restore(self, location: str) -> None:
        from workers.run.checkpoints import load_shards

        ckpt = Checkpoint(location)
        if self.rank == 0:
            restore_trainer(self.trainer, ckpt)
        else:
            load_shards(self.trainer, ckpt)
            self.trainer.version = ckpt.step

    def checksum(self, others: list) -> tuple[str, int, list[int]]:
        from workers.sync.weights import streamed_checksum

        refs = [o.follow_checksum.remote() for o in others]
        with GatherMeter() as meter:
            checksum = streamed_checksum(self.trainer.model)
        return checksum, meter.peak, ray.get(refs)

    def follow_checksum(self) -> int:
        from workers.sync.weights import drain, effective_stream

        with GatherMeter() as meter:
            drain(effective_stream(self.trainer.model))
        return meter.peak

    def export(self, target: str, others: list) -> tuple[dict, int, list[int]]:
        from workers.train.export import export_policy

        refs = [o.follow_export.remote() for o in others]
        with GatherMeter() as meter:
            manifest = export_policy(self.trainer.model, self.trainer.model_dir, target, self.trainer.cfg)
        return manifest, meter.peak, ray.get(refs)

    def follow_export(self) -> int:
        from workers.train.export import follow_export

        with GatherMeter() as meter:
            follow_export(self.trainer.model, self.trainer.cfg)
        return meter.peak

    def full_gather_peak(self) -> int:
        """The peak of gathering the whole state at once, as checkpoints did (control)."""
        with GatherMeter() as meter:
            self.trainer.gathered_state()
        return meter.peak


@pytest.fixture(scope="module")
def ranks(cluster):
    actors = [Rank.remote(0), Rank.remote(1)]
    yield actors
    for a in actors:
        ray.kill(a)


def _step(ranks, groups) -> dict:
    return ray.get(ranks[0].step.remote(copy.deepcopy(groups), ranks[1:]))


def _weights(ranks) -> dict:
    return ray.get([r.weights.remote() for r in ranks])[0]


TRAINER = {"minibatches": 2, "micro_batch_rows": 3}
BUCKET_MB = 0.05


def _configs(ranks: int = 2, **trainer):
    single = small_config(trainer={**TRAINER, **trainer}, sync={"bucket_mb": 0.004})
    pool = small_config(
        trainer={**TRAINER, **trainer, "backend": "fsdp2", "num_ranks": ranks}, sync={"bucket_mb": 0.004}
    )
    return single, pool


def test_a_sharded_checkpoint_resumes_exactly_and_onto_another_number_of_ranks(ranks, tiny_model_dir, tmp_path):
    single_cfg, pool_cfg = _configs()
    first = fixed_groups(tiny_model_dir, single_cfg, seed=1)
    second = fixed_groups(tiny_model_dir, single_cfg, seed=2)

    build_pool(ranks, pool_cfg, tiny_model_dir)
    _step(ranks, first)
    at_checkpoint = _weights(ranks)
    location, _ = ray.get(ranks[0].checkpoint.remote(str(tmp_path / "two"), ranks[1:]))
    whole = _step(ranks, second)
    whole_weights = _weights(ranks)

    # Each rank wrote its own shards; no whole optimizer file; the model files are
    # shards with an index (tiny buckets) that from_pretrained reads back.
    meta = Checkpoint(location).meta
    names = {f["name"] for f in meta["files"]}
    assert {f"{SHARDED}/.metadata", f"{SHARDED}/__0_0.distcp", f"{SHARDED}/__1_0.distcp"} <= names
    assert OPTIMIZER not in names and "model.safetensors.index.json" in meta["model_files"]
    assert not any(n.startswith(SHARDED) for n in meta["model_files"])
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(location)
    from workers.model.loading import checkpoint_state_dict

    assert state_checksum(checkpoint_state_dict(loaded)) == state_checksum(at_checkpoint)

    # The same pool size: the uninterrupted step, bit for bit.
    build_pool(ranks, pool_cfg, tiny_model_dir)
    ray.get([r.restore.remote(location) for r in ranks])
    resumed = _step(ranks, second)
    assert resumed["loss"] == whole["loss"] and resumed["trainer/grad_norm"] == whole["trainer/grad_norm"]
    assert state_checksum(_weights(ranks)) == state_checksum(whole_weights)

    # 2 → 1: a single trainer reads the shards whole, then steps as the pool did.
    single = Trainer(single_cfg, tiny_model_dir, device=CPU)
    restore_trainer(single, Checkpoint(location))
    assert state_checksum(single.state_dict()) == state_checksum(at_checkpoint)
    alone = single.train_step(copy.deepcopy(second))
    assert alone["loss"] == pytest.approx(whole["loss"], rel=1e-4, abs=1e-6)
    for k, want in whole_weights.items():
        torch.testing.assert_close(single.state_dict()[k], want, rtol=1e-4, atol=1e-6, msg=k)

    # A ddp pool: each rank reads the shards whole into its replica.
    ddp_cfg = pool_cfg.model_copy(update={"trainer": pool_cfg.trainer.model_copy(update={"backend": "ddp"})})
    build_pool(ranks, ddp_cfg, tiny_model_dir)
    ray.get([r.restore.remote(location) for r in ranks])
    replicas = ray.get([r.weights.remote() for r in ranks])
    assert [state_checksum(w) for w in replicas] == [state_checksum(at_checkpoint)] * 2
    assert _step(ranks, second)["loss"] == pytest.approx(whole["loss"], rel=1e-4, abs=1e-6)

    # 2 → 1 → 2: an fsdp2 pool of one rank resumes it, checkpoints, and two ranks resume that.
    _, one_cfg = _configs(ranks=1)
    build_pool(ranks[:1], one_cfg, tiny_model_dir)
    ray.get(ranks[0].restore.remote(location))
    assert state_checksum(_weights(ranks[:1])) == state_checksum(at_checkpoint)
    one_location, _ = ray.get(ranks[0].checkpoint.remote(str(tmp_path / "one"), []))
    one = _step(ranks[:1], second)
    one_weights = _weights(ranks[:1])
    assert {f["name"] for f in Checkpoint(one_location).meta["files"]} >= {f"{SHARDED}/__0_0.distcp"}

    build_pool(ranks, pool_cfg, tiny_model_dir)
    ray.get([r.restore.remote(one_location) for r in ranks])
    assert state_checksum(_weights(ranks)) == state_checksum(at_checkpoint)
    again = _step(ranks, second)
    assert again["loss"] == pytest.approx(one["loss"], rel=1e-4, abs=1e-6)
    after = _weights(ranks)
    for k, want in one_weights.items():
        torch.testing.assert_close(after[k], want, rtol=1e-4, atol=1e-6, msg=k)
    print(
        f"\nloss after resume: 2 ranks {resumed['loss']!r} (uninterrupted {whole['loss']!r}), "
        f"1 rank {one['loss']!r}, single {alone['loss']!r}, 1 → 2 ranks {again['loss']!r}"
    )


@pytest.fixture(scope="module")
def wide_model_dir(tiny_model_dir, tmp_path_factory) -> str:
    """The tiny model with a 4096-row embedding and output layer, untied: nearly all its
    bytes in two tensors, as in a real LM's vocabulary layers."""
    import shutil

    from transformers import AutoConfig, AutoModelForCausalLM

    directory = str(tmp_path_factory.mktemp("wide") / "model")
    shutil.copytree(tiny_model_dir, directory)
    config = AutoConfig.from_pretrained(directory)
    config.vocab_size, config.tie_word_embeddings = 4096, False
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    return directory


def test_no_rank_holds_the_whole_model_to_checkpoint_checksum_or_export(ranks, wide_model_dir, tmp_path):
    _, pool_cfg = _configs()
    pool_cfg = pool_cfg.model_copy(update={"sync": pool_cfg.sync.model_copy(update={"bucket_mb": BUCKET_MB})})
    build_pool(ranks, pool_cfg, wide_model_dir)
    whole = _weights(ranks)
    total = sum(t.numel() * t.element_size() for t in whole.values())
    largest = max(t.numel() * t.element_size() for t in whole.values())
    bucket = int(BUCKET_MB * 2**20)
    # A shard is written once it holds a bucket: at most a bucket's worth of tensors
    # plus the one that filled it are held at once.
    cap = bucket + largest
    assert cap < total, "the cap must be below the model's size for the test to mean anything"

    control, _ = ray.get([r.full_gather_peak.remote() for r in ranks])
    assert control >= total, "the meter must see a whole-state gather for what it does not see to count"

    location, ckpt_peak = ray.get(ranks[0].checkpoint.remote(str(tmp_path / "ckpt"), ranks[1:]))
    shards_peak = ray.get(ranks[1].last_shards_peak.remote())
    checksum, sum_peak, sum_followers = ray.get(ranks[0].checksum.remote(ranks[1:]))
    manifest, export_peak, follower_peaks = ray.get(ranks[0].export.remote(str(tmp_path / "export"), ranks[1:]))

    assert checksum == manifest["sha256"] == state_checksum(whole)
    peaks = {
        "checkpoint": ckpt_peak,
        "checksum": sum_peak,
        "export": export_peak,
        "checkpoint rank 1": shards_peak,
        "checksum rank 1": sum_followers[0],
        "export rank 1": follower_peaks[0],
    }
    assert all(peak <= cap for peak in peaks.values()), (peaks, cap, total)
    with open(os.path.join(tmp_path / "export", "model.safetensors.index.json")) as f:
        shards = set(json.load(f)["weight_map"].values())
    assert len(shards) >= 3
    print(
        f"\nmodel {total} B (largest tensor {largest} B, bucket {bucket} B): rank 0's peak of whole tensors held "
        f"— checkpoint {ckpt_peak} B, checksum {sum_peak} B, export {export_peak} B; rank 1's checkpoint "
        f"{shards_peak} B, checksum {sum_followers[0]} B, export {follower_peaks[0]} B; full-state gather "
        f"(control) {control} B"
    )


def test_a_sharded_lora_pool_checkpoints_and_exports_its_base_and_adapter(ranks, tiny_model_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from workers.model.loading import checkpoint_state_dict

    lora = {"enabled": True, "rank": 2}
    single_cfg, pool_cfg = _configs()
    single_cfg = single_cfg.model_copy(update={"lora": single_cfg.lora.model_copy(update=lora)})
    pool_cfg = pool_cfg.model_copy(update={"lora": pool_cfg.lora.model_copy(update=lora)})
    first = fixed_groups(tiny_model_dir, single_cfg, seed=1)
    second = fixed_groups(tiny_model_dir, single_cfg, seed=2)

    build_pool(ranks, pool_cfg, tiny_model_dir)
    _step(ranks, first)
    at_checkpoint = _weights(ranks)  # merged
    location, _ = ray.get(ranks[0].checkpoint.remote(str(tmp_path / "ckpt"), ranks[1:]))
    manifest, _, _ = ray.get(ranks[0].export.remote(str(tmp_path / "export"), ranks[1:]))
    whole = _step(ranks, second)

    # The step directory and the export are each the merged policy, with its base in
    # base/ and a peft adapter on it in adapter/.
    export = str(tmp_path / "export")
    assert manifest["lora"] and manifest["base"] == "base"
    assert manifest["sha256"] == state_checksum(at_checkpoint)
    for top in (location, export):
        merged = AutoModelForCausalLM.from_pretrained(top)
        assert state_checksum(checkpoint_state_dict(merged)) == state_checksum(at_checkpoint), top
    for top in (location, export):
        base_dir, adapter_dir = os.path.join(top, "base"), os.path.join(top, "adapter")
        policy = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), adapter_dir)
        got = checkpoint_state_dict(policy.merge_and_unload())
        for k, want in at_checkpoint.items():
            torch.testing.assert_close(got[k], want, rtol=1e-5, atol=1e-7, msg=k)

    # Resumed onto a fresh pool: the uninterrupted step, bit for bit.
    build_pool(ranks, pool_cfg, tiny_model_dir)
    ray.get([r.restore.remote(location) for r in ranks])
    assert _step(ranks, second)["loss"] == whole["loss"]
