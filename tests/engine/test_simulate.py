"""The simulator (workers/simulate): properties of a run that follow from the engine's
own buffer, gate and update modes, and the cost models against published figures."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.config.presets import PRESETS, build
from workers.simulate import QWEN25_7B, QWEN25_32B, Cluster, Workload, simulate
from workers.simulate.calibration import SEED_GENERATION, generation_seconds, kv_read_floor_seconds
from workers.simulate.costs import DecodeCost

# Long-tailed 2K-median completions up to 8K: generation dominates a step, as in practice.
TAILED = Workload(QWEN25_7B, median_tokens=2048, p90_tokens=6000, max_tokens=8192)


def config(preset: str, batch_groups: int = 32, **overrides):
    return build(preset, {"trainer": {"batch_groups": batch_groups, "group_size": 16}, **overrides})


def test_the_sync_preset_never_trains_while_generating_and_async_overlaps():
    sync = simulate(config("sync"), Cluster(gpus=64), TAILED, steps=30)
    async_ = simulate(config("async"), Cluster(gpus=64), TAILED, steps=30)
    assert sync.summary["overlap"] == 0.0
    assert sync.summary["staleness_max"] == 0
    # The trainer waits out every generation: idle most of each step.
    assert min(v for _, v in sync.series["trainer/idle_frac"]) > 0.5
    assert async_.summary["overlap"] > 0.5 * async_.summary["trainer_busy"]
    assert async_.summary["samples_per_s"] > 1.2 * sync.summary["samples_per_s"]


def test_colocated_pools_take_turns_on_the_gpus():
    colocated = {"placement": {"devices": "gpu", "mode": "colocated"}}
    for preset in ("sync", "async"):
        run = simulate(config(preset, **colocated), Cluster(gpus=16), TAILED, steps=20)
        assert run.summary["overlap"] == 0.0
        assert run.summary["trainer_ranks"] == 16 and run.summary["inference_workers"] == 16


@pytest.mark.parametrize("preset", ["async", "trl-async", "miles", "nemo-rl", "verl-fully-async", "slime"])
def test_staleness_never_exceeds_max_staleness(preset):
    cfg = config(preset)
    run = simulate(cfg, Cluster(gpus=16), TAILED, steps=40)
    worst = max(v for _, v in run.series["staleness/max"])
    assert worst <= cfg.buffer.max_staleness
    assert len(run.series["staleness/max"]) == 40


def test_rejection_is_the_buffers_own():
    """max_staleness 0 on an async run: every group generated under older weights than
    the trainer's is rejected by RolloutBuffer.get, and none is ever trained."""
    cfg = config("async", buffer={"mode": "bounded", "capacity": 2, "max_staleness": 0, "max_head_offpolicyness": 1})
    run = simulate(cfg, Cluster(gpus=16), TAILED, steps=30)
    assert run.summary["staleness_max"] == 0
    assert run.series["buffer/dropped_stale"][-1][1] > 0
    assert run.summary["dropped_share"] > 0


def test_more_inference_gpus_give_more_samples_until_the_trainer_saturates():
    runs = [
        simulate(config("async", batch_groups=256), Cluster(gpus=64, inference_share=share), TAILED, steps=20).summary
        for share in (0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875)
    ]
    growing = [r for r in runs if r["trainer_busy"] < 0.9]
    assert len(growing) >= 3
    rates = [r["samples_per_s"] for r in growing]
    assert rates == sorted(rates) and rates[-1] > 2 * rates[0]
    # Past saturation the trainer is the bottleneck: fewer trainer GPUs, fewer samples/s.
    assert runs[-1]["trainer_busy"] > 0.9
    assert runs[-1]["samples_per_s"] < max(r["samples_per_s"] for r in runs)


@pytest.mark.parametrize("tokens", [2048, 8192])
def test_predicted_7b_generation_is_within_30_percent_of_the_published_h100_table(tokens):
    published = SEED_GENERATION[(QWEN25_7B, tokens)]
    assert generation_seconds(QWEN25_7B, tokens) == pytest.approx(published, rel=0.30)


def test_published_rows_past_the_roofline_are_not_matched():
    """7B at 32K and the 32B row are faster than one H100 can decode in bfloat16: below
    the KV-read floor, or with no room for the KV cache beside the weights. The model
    predicts slower (or cannot run), never the published figure."""
    assert SEED_GENERATION[(QWEN25_7B, 32768)] < kv_read_floor_seconds(QWEN25_7B, 32768)
    assert SEED_GENERATION[(QWEN25_32B, 32768)] < kv_read_floor_seconds(QWEN25_32B, 32768)
    assert generation_seconds(QWEN25_32B, 32768) is None
    for tokens in (2048, 8192):
        predicted = generation_seconds(QWEN25_32B, tokens)
        assert predicted is not None and predicted > 2 * SEED_GENERATION[(QWEN25_32B, tokens)]


def test_a_seed_gives_the_same_run_and_another_seed_another():
    cfg = config("pipelinerl")
    one = simulate(cfg, Cluster(gpus=32), TAILED, steps=25, seed=7)
    again = simulate(cfg, Cluster(gpus=32), TAILED, steps=25, seed=7)
    other = simulate(cfg, Cluster(gpus=32), TAILED, steps=25, seed=8)
    assert one.series == again.series and one.samples_at == again.samples_at
    assert one.series["samples/per_s"] != other.series["samples/per_s"]


@pytest.mark.parametrize("split", [0.25, 0.5, 0.75])
def test_every_preset_runs_and_reports_the_engines_series(split):
    """Also where the buffer holds one batch and a worker's call fills it (it once stalled
    there: a full buffer of exactly one batch was never taken)."""
    from workers.core.metric_names import NAMES

    for name in PRESETS:
        run = simulate(config(name), Cluster(gpus=8, inference_share=split), TAILED, steps=5)
        assert set(run.series) <= NAMES, name
        for series in ("samples/per_s", "trainer/idle_frac", "inference/idle_frac", "staleness/mean", "buffer/depth"):
            assert len(run.series[series]) == 5, (name, series)
        assert run.summary["samples_per_s"] > 0


def test_abort_modes_count_their_partial_rollouts():
    retry = simulate(config("slime"), Cluster(gpus=16), TAILED, steps=20)
    resume = simulate(config("areal"), Cluster(gpus=16), TAILED, steps=20)
    assert retry.series["rollout/partial_retried"][-1][1] > 0 and retry.summary["wasted_token_share"] > 0
    assert resume.series["rollout/partial_resumed"][-1][1] > 0 and resume.summary["wasted_token_share"] == 0


def test_it_refuses_a_cluster_it_cannot_lay_out():
    with pytest.raises(ValueError, match="inference_share"):
        Cluster(gpus=8, inference_share=1.0)
    with pytest.raises(ValueError, match="tensor parallel"):
        simulate(config("async"), Cluster(gpus=8, tp=1), Workload(QWEN25_32B, 16384, 16384, 32768), steps=2)
    with pytest.raises(ValueError, match="each pool needs at least one"):
        simulate(config("async"), Cluster(gpus=8, tp=4, inference_share=0.25), TAILED, steps=2)
    with pytest.raises(ValueError, match="median_tokens"):
        Workload(QWEN25_7B, median_tokens=4096, p90_tokens=2048)


def test_decode_amortises_weights_over_the_batch_until_the_kv_cache_or_compute_bounds_it():
    decode = DecodeCost(QWEN25_7B)
    rates = [decode.tokens_per_s(b, 2048) for b in (1, 8, 64, 512)]
    assert rates == sorted(rates) and rates[1] > 5 * rates[0]  # weight reads shared
    # Longer contexts read more KV cache per token: slower at the same batch.
    assert decode.tokens_per_s(64, 32768) < 0.5 * decode.tokens_per_s(64, 2048)
    # Past the roofline's ridge, more batch buys nothing: compute bound.
    big = DecodeCost(QWEN25_7B).tokens_per_s(4096, 16)
    assert big == pytest.approx(DecodeCost(QWEN25_7B).tokens_per_s(8192, 16), rel=0.01)
    # Four GPUs of tensor parallelism split the reads: faster per worker.
    assert DecodeCost(QWEN25_32B, tp=4).tokens_per_s(64, 8192) > 3 * DecodeCost(QWEN25_32B).tokens_per_s(64, 8192)


def test_sync_bytes_are_what_the_engines_senders_move(tmp_path):
    """The cost model's bytes per protocol against the engine's own senders on a tiny
    model: float32 master weights for a full sync, the adapter alone for LoRA."""
    import torch

    from workers.config.run_config import LoRAConfig, ModelConfig, SyncConfig
    from workers.model.loading import build_tiny
    from workers.model.lora import apply_lora
    from workers.model.tokenizer import CharTokenizer
    from workers.simulate.costs import INFINIBAND, shape_of, sync_cost
    from workers.sync import make_sender
    from workers.sync.object_store import InProcessStore

    model = build_tiny(ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), CharTokenizer(), 0)
    shape = shape_of(model)
    # The filesystem's file adds its safetensors header (a few KB: nothing at 7B).
    for protocol, header in (("object_store", 0), ("filesystem", 4096)):
        sync = SyncConfig(protocol=protocol, directory=str(tmp_path) if protocol == "filesystem" else None)
        sender = make_sender(sync, store=InProcessStore())
        sender.attach(model)
        sent = sender.send(1, lambda notice: None).bytes
        modelled = sync_cost(protocol, shape, link=INFINIBAND, workers=1, nodes=1).bytes
        assert modelled <= sent <= modelled + header
    torch.manual_seed(0)
    adapted = apply_lora(model, LoRAConfig(enabled=True, rank=4))
    sender = make_sender(SyncConfig(protocol="lora"), store=InProcessStore())
    sender.attach(adapted)
    sent = sender.send(1, lambda notice: None).bytes
    assert sync_cost("lora", shape, link=INFINIBAND, workers=1, nodes=1, lora_rank=4).bytes == sent


def test_the_delta_sync_model_pulls_the_bytes_the_engine_sends():
    """`sync.delta`: at the share of elements a step changed, the modelled bytes a
    caught-up worker pulls are the engine's delta (every tensor sparse at this share),
    and the trainer is blocked longer than by a whole put, as measured."""
    import torch

    from workers.config.run_config import ModelConfig, SyncConfig
    from workers.model.loading import build_tiny
    from workers.model.tokenizer import CharTokenizer
    from workers.simulate.costs import INFINIBAND, shape_of, sync_cost
    from workers.sync import make_sender
    from workers.sync.object_store import InProcessStore

    model = build_tiny(ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), CharTokenizer(), 0)
    sender = make_sender(SyncConfig(protocol="object_store", delta=True), store=InProcessStore(), wire_dtype="bfloat16")
    sender.attach(model)
    sender.send(1, lambda notice: None)
    before = {n: p.detach().to(torch.bfloat16) for n, p in model.named_parameters()}
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 3e-6)
    changed = sum(int((p.to(torch.bfloat16) != before[n]).sum()) for n, p in model.named_parameters())
    share = changed / sum(p.numel() for p in model.parameters())
    sent = sender.send(2, lambda notice: None).bytes
    modelled = sync_cost("object_store", shape_of(model), link=INFINIBAND, workers=1, nodes=1, delta_changed=share)
    assert 0 < share < 0.1 and modelled.bytes == pytest.approx(sent, rel=1e-6)
    whole = sync_cost("object_store", shape_of(model), link=INFINIBAND, workers=1, nodes=1)
    # Fewer bytes on the link, but the trainer blocked longer (the cast and the
    # comparison), as bench/delta_sync.py measures.
    assert modelled.latency_s < whole.latency_s and modelled.trainer_s > whole.trainer_s


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    preset=st.sampled_from(sorted(PRESETS)),
    batch_groups=st.sampled_from([1, 3, 8, 32]),
    group_size=st.sampled_from([2, 4, 16]),
    colocated=st.booleans(),
    on_stale=st.sampled_from(["drop", "requeue"]),
    max_staleness=st.integers(0, 3),
    update_mode=st.sampled_from(["drain", "abort_retry", "abort_resume", "in_flight"]),
    gpus=st.sampled_from([8, 24, 64]),
    share=st.sampled_from([0.25, 0.5, 0.75]),
    median=st.sampled_from([64, 2048]),
    tail=st.sampled_from([1, 5]),
)
def test_any_config_runs_to_its_last_step_within_its_staleness(
    preset, batch_groups, group_size, colocated, on_stale, max_staleness, update_mode, gpus, share, median, tail
):
    """No layout, buffer or update mode stalls the loop (nothing left to happen before the
    last step), and no trained group is older than max_staleness."""
    overrides = {
        "trainer": {"batch_groups": batch_groups, "group_size": group_size},
        "buffer": {"on_stale": on_stale, "max_staleness": max_staleness},
        "sync": {"update_mode": update_mode},
    }
    if colocated:
        overrides["placement"] = {"devices": "gpu", "mode": "colocated"}
    try:
        cfg = build(preset, overrides)
    except ValueError:
        return  # a combination the config itself refuses (e.g. sync with a head)
    workload = Workload(QWEN25_7B, median_tokens=median, p90_tokens=median * tail, max_tokens=median * 8)
    run = simulate(cfg, Cluster(gpus, inference_share=share), workload, steps=8, seed=1)
    assert len(run.series["staleness/max"]) == 8
    assert max(v for _, v in run.series["staleness/max"]) <= cfg.buffer.max_staleness


def test_a_mixture_of_experts_computes_with_its_active_parameters_and_stores_them_all():
    """shape_of reads a mixture of experts from its config and state dict: every
    parameter stored and sent, a token's experts computed, each expert's projections a
    checkpoint tensor of their own; a hybrid-attention model keeps KV in its
    full-attention layers only."""
    from transformers import Qwen3_5MoeTextConfig, Qwen3MoeConfig

    from workers.simulate.costs import TrainCost, shape_of_config

    moe = Qwen3MoeConfig(
        vocab_size=1000, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
    )  # fmt: skip
    shape = shape_of_config(moe, "tiny-moe")
    experts = 2 * 8 * 3 * 64 * 32  # layers × experts × (gate, up, down) × hidden × expert width
    assert shape.active_params == pytest.approx(shape.params - experts * (1 - 2 / 8))
    non_expert_tensors = shape.tensors - 2 * 2  # the stacked gate_up and down of each layer
    assert shape.checkpoint_tensors == non_expert_tensors + 2 * 8 * 3
    dense = TrainCost(shape, ranks=1)
    assert dense.seconds(1000) == pytest.approx(8 * shape.active_params * 1000 / (989e12 * 0.4))
    decode = DecodeCost(shape)
    assert decode.weight_bytes == 2 * shape.params
    hybrid = shape_of_config(
        Qwen3_5MoeTextConfig(
            vocab_size=1000, hidden_size=64, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=8,
            num_experts_per_tok=2, linear_num_key_heads=2, linear_num_value_heads=4,
        ),
        "tiny-hybrid",
    )  # fmt: skip
    assert hybrid.kv_layers == 2  # every fourth layer attends in full
    assert hybrid.kv_bytes_per_token() == 2 * 2 * (2 * 16) * 2


def test_a_data_parallel_pass_ends_with_the_rank_that_holds_the_longest_sequence():
    from workers.simulate.costs import TrainCost

    train = TrainCost(QWEN25_7B, ranks=64)
    even = train.seconds(64 * 4096)
    assert train.seconds(64 * 4096, [4096.0]) == pytest.approx(even)
    # One 32K sequence in a pass of 4K per rank: the pass lasts 32K tokens' worth.
    assert train.seconds(64 * 4096, [32768.0]) == pytest.approx(8 * even)
    # Four minibatches (6·N each) each wait for their own longest; the π_old forward
    # (2·N) once.
    assert train.seconds(64 * 4096, [32768.0] * 4) == pytest.approx(8 * even * (4 * 6 + 2) / 8)


def test_the_engine_colocates_one_worker_per_gpu_so_the_simulator_does():
    with pytest.raises(ValueError, match="cluster.tp must be 1"):
        simulate(config("sync", placement={"devices": "gpu", "mode": "colocated"}), Cluster(16, tp=4), TAILED, steps=2)


def test_a_streaming_rollout_server_hands_each_group_over_as_it_ends():
    """Streaming (verl's and AReaL's servers) runs each group as a lane of the worker's
    batch: a group waits for its own longest completion, not its call's, so an async
    run's trainer waits less for its batch than with the engine's call-at-a-time
    workers, and the staleness bound still holds."""
    cfg = config("pipelinerl", 64)
    calls = simulate(cfg, Cluster(64, inference_share=0.5), TAILED, steps=20)
    stream = simulate(cfg, Cluster(64, inference_share=0.5), TAILED, steps=20, streaming=True)
    assert stream.summary["samples_per_s"] > calls.summary["samples_per_s"]
    assert stream.summary["staleness_max"] <= cfg.buffer.max_staleness
    assert stream.summary["inference_workers"] == calls.summary["inference_workers"] == 32


@pytest.mark.parametrize("update_mode", ["abort_retry", "abort_resume", "in_flight", "drain"])
def test_a_streaming_run_finishes_in_every_update_mode_within_its_staleness(update_mode):
    cfg = config("pipelinerl", 32, sync={"update_mode": update_mode})
    run = simulate(cfg, Cluster(16, inference_share=0.5), TAILED, steps=12, streaming=True)
    assert len(run.series["staleness/max"]) == 12
    assert run.summary["staleness_max"] <= cfg.buffer.max_staleness
