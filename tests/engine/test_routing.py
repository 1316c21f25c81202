"""Keep Routing's parts on real transformers MoE models: finding the routers, recording
their choice, replaying a forced one (gradients reaching the router), and the compact
record."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.core.routing import (
    NO_EXPERT,
    Recorder,
    Replay,
    RoutingRecord,
    batch_routing,
    pack,
    packed_bits_per_slot,
    router_shape,
    routers,
    unpack,
)
from workers.model import tiny_hf

MOE = ["qwen2_moe", "mixtral"]


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_hf.train_tokenizer(tiny_hf.TaskConfig())


def _model(arch, tokenizer):
    return tiny_hf.build_model(arch, tokenizer, seed=0, hidden_size=64, num_layers=2)


def _ids(n=2, t=7, vocab=200, seed=0):
    return torch.randint(5, vocab, (n, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("arch", MOE)
def test_routers_are_found_through_transformers_own_record(arch, tokenizer):
    model = _model(arch, tokenizer)
    assert len(routers(model)) == 2
    assert router_shape(model) == (2, 2, 4)


def test_a_dense_model_has_no_router(tokenizer):
    model = _model("qwen2", tokenizer)
    assert routers(model) == []
    assert router_shape(model) is None
    with pytest.raises(ValueError, match="mixture-of-experts"):
        Replay(model)


@pytest.mark.parametrize("arch", MOE)
def test_recorder_keeps_the_top_k_of_the_routers_logits(arch, tokenizer):
    model = _model(arch, tokenizer)
    ids = _ids()
    with Recorder(model) as rec, torch.no_grad():
        out = model(input_ids=ids, output_router_logits=True)
        kept = rec.take()
    assert kept.shape == (2, ids.numel(), 2)
    for layer, logits in enumerate(out.router_logits):
        own = torch.topk(torch.softmax(logits.float(), -1), 2, dim=-1).indices
        assert torch.equal(kept[layer].long().sort(-1).values, own.sort(-1).values)
    with pytest.raises(RuntimeError, match="no forward"):
        rec.take()


@pytest.mark.parametrize("arch", MOE)
def test_replaying_the_models_own_choice_changes_nothing(arch, tokenizer):
    model = _model(arch, tokenizer)
    ids = _ids()
    with torch.no_grad(), Recorder(model) as rec:
        plain = model(input_ids=ids).logits
        own = rec.take()  # [layers, rows, k]
    forced = own.permute(1, 0, 2).reshape(ids.shape[0], ids.shape[1], 2, 2)
    with torch.no_grad(), Replay(model) as replay, replay.use(forced):
        replayed = model(input_ids=ids).logits
    torch.testing.assert_close(replayed, plain, atol=1e-6, rtol=0)
    assert replay.agreement.counted == 2 * ids.numel()
    assert replay.agreement.share == 1.0


@pytest.mark.parametrize("arch", MOE)
def test_the_slots_order_changes_nothing_so_a_packed_set_replays_the_same_forward(arch, tokenizer):
    """`pack` keeps each top-k as a set (ascending on the way back): replay must give
    the same logits and gradients whatever order the slots come in."""
    model = _model(arch, tokenizer)
    ids = _ids()
    with torch.no_grad(), Recorder(model) as rec:
        model(input_ids=ids)
        own = rec.take()
    forced = own.permute(1, 0, 2).reshape(ids.shape[0], ids.shape[1], 2, 2)
    # a different forward than the model's own: every other token through other experts
    forced[:, ::2] = (forced[:, ::2] + 1) % 4
    forced[:, ::2, :, 1] = torch.where(
        forced[:, ::2, :, 1] == forced[:, ::2, :, 0], (forced[:, ::2, :, 1] + 1) % 4, forced[:, ::2, :, 1]
    )
    record = forced.reshape(-1, 2, 2).numpy()
    packed = RoutingRecord.of(record, 4).array()
    assert not np.array_equal(packed, record)  # some sets came back in another order
    runs = []
    for slots in (forced, forced.flip(-1), torch.from_numpy(packed).reshape(forced.shape)):
        model.zero_grad()
        with Replay(model) as replay, replay.use(slots):
            logits = model(input_ids=ids).logits
        logits.float().logsumexp(-1).sum().backward()
        runs.append((logits.detach(), [r.weight.grad.clone() for r in routers(model)]))
    for logits, grads in runs[1:]:
        torch.testing.assert_close(logits, runs[0][0], atol=1e-6, rtol=0)
        for g, g0 in zip(grads, runs[0][1], strict=True):
            torch.testing.assert_close(g, g0, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("arch", MOE)
def test_a_forced_choice_is_used_and_its_weights_come_from_the_routers_softmax(arch, tokenizer):
    model = _model(arch, tokenizer)
    ids = _ids(n=1, t=5)
    # Every token through experts 0 and 3, except the last (no record: the router's own).
    forced = torch.full((1, 5, 2, 2), NO_EXPERT, dtype=torch.int16)
    forced[:, :4] = torch.tensor([3, 0], dtype=torch.int16)
    seen = {}

    def spy(module, inputs, output):
        seen[module] = output

    handles = []
    with Replay(model) as replay, replay.use(forced):
        # Registered after the replay's hooks: sees what the block gets.
        handles = [r.register_forward_hook(spy) for r in routers(model)]
        out = model(input_ids=ids).logits
    for h in handles:
        h.remove()
    for router in routers(model):
        logits, weights, chosen = seen[router]
        assert chosen[:4].tolist() == [[3, 0]] * 4
        probs = torch.softmax(logits.float(), -1)
        want = probs[:4][:, [3, 0]]
        if getattr(router, "norm_topk_prob", True):  # Mixtral's always; Qwen2-MoE's as configured
            want = want / want.sum(-1, keepdim=True)
        torch.testing.assert_close(weights[:4].float(), want)
        own = torch.topk(probs[4], 2).indices
        assert sorted(chosen[4].tolist()) == sorted(own.tolist())
    with torch.no_grad():
        plain = model(input_ids=ids).logits
    assert not torch.allclose(out, plain)
    assert replay.agreement.counted == 2 * 4
    out.float().logsumexp(-1).sum().backward()
    for router in routers(model):
        assert router.weight.grad is not None and router.weight.grad.abs().sum() > 0


def test_a_router_weighted_otherwise_is_refused(tokenizer):
    model = _model("mixtral", tokenizer)
    router = routers(model)[0]

    def uniform(module, inputs, output):
        logits, weights, ids = output
        return logits, torch.full_like(weights, 0.5), ids

    router.register_forward_hook(uniform, prepend=True)
    forced = torch.full((1, 3, 2, 2), NO_EXPERT, dtype=torch.int16)
    with Replay(model) as replay, replay.use(forced), pytest.raises(ValueError, match="top-k of its softmax"):
        model(input_ids=_ids(n=1, t=3))


def test_a_record_of_the_wrong_length_is_refused(tokenizer):
    model = _model("qwen2_moe", tokenizer)
    forced = torch.zeros((1, 4, 2, 2), dtype=torch.int16)
    with Replay(model) as replay, replay.use(forced), pytest.raises(ValueError, match="laid out alike"):
        model(input_ids=_ids(n=1, t=3))


@pytest.mark.parametrize(
    ("experts", "top_k", "bits"), [(4, 2, 1.5), (8, 2, 2.5), (64, 8, 4.125), (128, 8, 5.125), (60, 4, 4.75)]
)
def test_pack_round_trips_a_set_per_token_and_layer_in_a_few_bits_a_slot(experts, top_k, bits):
    rng = np.random.default_rng(experts)
    tokens, layers = 37, 3
    record = np.stack(
        [np.stack([rng.choice(experts, top_k, replace=False) for _ in range(layers)]) for _ in range(tokens)]
    ).astype(np.int16)
    record[5] = NO_EXPERT
    record[-1] = NO_EXPERT
    assert packed_bits_per_slot(experts, top_k) == bits
    data = pack(record, experts)
    assert len(data) == -(-tokens * layers * int(top_k * bits) // 8)
    back = unpack(data, tokens, layers, top_k, experts)
    assert np.array_equal(back, np.sort(record, -1))  # the set, in ascending order
    rec = RoutingRecord.of(record, experts)
    assert np.array_equal(rec.array(), np.sort(record, -1))
    # A checkpoint's buffer.json holds it as JSON, through the group's own to_json.
    from workers.core.records import Group, Rollout

    group = Group(
        "g",
        "p",
        "a",
        [Rollout([1], [2], [-0.5], [0], "stop", expert_routing=rec), Rollout([1], [3], [-1.0], [0], "stop")],
    )
    back_group = Group.from_json(json.loads(json.dumps(group.to_json())))
    assert back_group.rollouts[0].expert_routing == rec and back_group.rollouts[1].expert_routing is None
    assert rec.bytes_per_token == pytest.approx(len(data) / tokens)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_any_record_comes_back_as_its_sets_and_padding_never_as_an_expert(data):
    experts = data.draw(st.integers(1, 160), label="experts")
    top_k = data.draw(st.integers(1, min(experts, 8)), label="top_k")
    tokens = data.draw(st.integers(0, 12), label="tokens")
    layers = data.draw(st.integers(1, 3), label="layers")
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    rng = np.random.default_rng(seed)
    record = np.full((tokens, layers, top_k), NO_EXPERT, dtype=np.int16)
    padded = rng.random((tokens, layers)) < 0.3
    for t in range(tokens):
        for la in range(layers):
            if not padded[t, la]:
                # any slot order, the extremes included (expert 0, the last expert)
                record[t, la] = rng.choice(experts, top_k, replace=False)
    back = unpack(pack(record, experts), tokens, layers, top_k, experts)
    assert back.dtype == np.int16 and back.shape == record.shape
    assert np.array_equal(back[padded], record[padded])  # NO_EXPERT in every slot
    assert np.array_equal(back[~padded], np.sort(record[~padded], -1))
    assert ((back[~padded] >= 0) & (back[~padded] < experts)).all()


def test_a_record_of_nothing_but_padding_decodes_to_no_expert_and_bad_ones_are_refused():
    for experts, top_k in ((8, 2), (128, 8), (1, 1)):
        none = np.full((5, 2, top_k), NO_EXPERT, dtype=np.int16)
        assert (unpack(pack(none, experts), 5, 2, top_k, experts) == NO_EXPERT).all()
    with pytest.raises(ValueError, match="all top_k experts or none"):
        pack(np.array([[[3, NO_EXPERT]]]), 8)
    with pytest.raises(ValueError, match="each of its top_k experts once"):
        pack(np.array([[[3, 3]]]), 8)
    with pytest.raises(ValueError, match=r"in \[0, 8\)"):
        pack(np.array([[[3, 8]]]), 8)
    with pytest.raises(ValueError, match="no top-k set has"):
        unpack(bytes([0xFF]), 1, 1, 2, 8)  # code 31 > C(8, 2) = 28


def test_batch_routing_pads_rows_with_no_expert():
    rec = RoutingRecord.of(np.array([[[0, 1]], [[2, 3]], [[1, 3]]], dtype=np.int16), 4)
    out = batch_routing([rec, None, rec], [2, 3, 3], 4, 1, 2)
    assert out.shape == (3, 4, 1, 2)
    assert out[0, :2].tolist() == [[[0, 1]], [[2, 3]]]
    assert (out[0, 2:] == NO_EXPERT).all() and (out[1] == NO_EXPERT).all()  # past its row; no record
    assert out[2, :3].tolist() == [[[0, 1]], [[2, 3]], [[1, 3]]] and (out[2, 3] == NO_EXPERT).all()


@pytest.mark.parametrize("arch", MOE)
def test_generation_records_the_routing_the_trainers_replay_scores_the_samples_with(arch, tmp_path):
    """The record made while sampling, replayed over prompt + completion in one forward,
    gives back the behaviour logprobs: the trainer scores the sub-network that sampled."""
    from workers.inference.transformers_backend import TransformersBackend
    from workers.model.loading import load_model
    from workers.rollout.partial_rollouts import DRAIN, generate_across_updates
    from workers.train.trainer import pack, token_logprobs

    model_dir = tiny_hf.make_tiny_checkpoint(str(tmp_path / arch), arch, hidden_size=64)
    backend = TransformersBackend(model_dir, record_routing=True)
    prompts = [[1, 40, 41, 42], [1, 50, 51]]
    comps = [c for group in backend.generate(prompts, n=2, max_new_tokens=6, temperature=1.0, seed=3) for c in group]
    # The abort/resume path's sequences carry it too.
    resumed = generate_across_updates(backend, prompts, 2, 6, 1.0, 3, 0, DRAIN, None)
    assert [s.routing.array().tolist() for g in resumed.sequences for s in g] == [
        c.routing.array().tolist() for c in comps
    ]
    rows = [p for p in prompts for _ in range(2)]
    for row, c in zip(rows, comps, strict=True):
        assert c.routing.layers == 2 and c.routing.top_k == 2
        # Every prompt token and every completion token but the last was run through the model.
        assert c.routing.tokens == len(row) + len(c.token_ids) - 1
        assert (c.routing.array() != NO_EXPERT).all()

    model = load_model(model_dir, "float32")
    batch = pack(rows, [c.token_ids for c in comps], backend.pad_id)
    lengths = [len(r) + len(c.token_ids) for r, c in zip(rows, comps, strict=True)]
    forced = batch_routing([c.routing for c in comps], lengths, batch.input_ids.shape[1], 2, 2)
    with torch.no_grad(), Replay(model) as replay, replay.use(forced):
        logp = token_logprobs(model, batch, 1.0)
    for i, (row, c) in enumerate(zip(rows, comps, strict=True)):
        got = logp[i, len(row) - 1 : len(row) - 1 + len(c.token_ids)]
        torch.testing.assert_close(got, torch.tensor(c.logprobs), atol=1e-4, rtol=0)
    assert replay.agreement.share > 0.9
