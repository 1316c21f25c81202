"""What a simulated run says about itself (workers/simulate/advice.py): the pool that
bounds it, the groups it dropped, and the setting to change."""

from __future__ import annotations

from workers.config.presets import build
from workers.simulate import QWEN25_7B, Cluster, Workload, simulate
from workers.simulate.advice import advice


def summary(trainer: float, inference: float, dropped: float = 0.0) -> dict:
    return {"trainer_busy": trainer, "inference_busy": inference, "dropped_share": dropped}


def test_a_starving_trainer_names_generation_and_the_gpu_split():
    cfg = build("async", {})
    said = advice(summary(0.1, 0.97), cfg, Cluster(gpus=64))
    assert said == [
        "The trainer waits 90% of the time: generation bounds this run (inference busy 97%); give generation more "
        "of the GPUs (cluster.inference_share above 0.5)."
    ]


def test_starving_inference_workers_name_the_trainer_and_staleness():
    said = advice(summary(0.95, 0.3, dropped=0.2), build("async", {}), Cluster(gpus=16, inference_share=0.75))
    assert said[0].startswith("The inference workers wait 70% of the time: the trainer bounds this run")
    assert "cluster.inference_share below 0.75" in said[0] and "buffer.max_staleness" in said[0]
    assert said[1].startswith("20% of the generated groups were dropped as stale (older than buffer.max_staleness")


def test_a_balanced_run_says_neither_pool_starves():
    assert advice(summary(0.9, 0.9), build("sync", {}), Cluster(gpus=8)) == [
        "Neither pool starves: trainer busy 90%, inference busy 90%, 0% of the groups dropped as stale."
    ]


def test_the_default_async_split_of_a_7b_model_on_64_gpus_is_told_where_it_starves():
    """The case that had no word about it: an async 7B run on 64 H100s at the default split."""
    cfg = build("async", {})
    result = simulate(cfg, Cluster(gpus=64), Workload(model=QWEN25_7B), steps=20)
    said = advice(result.summary, cfg, Cluster(gpus=64))
    assert result.summary["trainer_busy"] < 0.5 < result.summary["inference_busy"] < 0.8
    assert said[0].startswith("The trainer waits") and "cluster.inference_share above 0.5" in said[0]
    assert said[1].startswith("The inference workers wait") and "buffer.max_staleness 1" in said[1]
