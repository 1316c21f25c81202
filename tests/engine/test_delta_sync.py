"""Delta weight sync (`sync.delta`, workers/sync/delta.py, through workers/sync/object_store.py):
the worker's weights are the trainer's cast to bf16, bit for bit, at every version; a
caught-up worker pulls only the changes; one that missed a version, or is new, pulls the
whole version instead."""

from __future__ import annotations

import pytest
import torch

from tests.engine.test_weight_sync_protocols import backend_weights, model_dir, trainer_model
from workers.config.run_config import RunConfig, SyncConfig
from workers.sync import make_receiver, make_sender
from workers.sync.delta import DENSE_FROM, Shadow, apply, diff
from workers.sync.object_store import InProcessStore

__all__ = ["model_dir"]  # the protocols' tests' fixture, used here too

BF16 = torch.bfloat16


def test_a_diff_holds_the_changed_elements_or_the_whole_tensor():
    g = torch.Generator().manual_seed(0)
    old = torch.randn(64, 32, generator=g).to(BF16)
    new = old.clone()
    new.view(-1)[[3, 700, 2047]] += 1.0
    sparse = diff(new, old)
    assert sparse.indices.tolist() == [3, 700, 2047] and sparse.nbytes == 3 * (4 + 2)
    rebuilt = old.clone()
    apply(rebuilt, sparse)
    assert torch.equal(rebuilt.view(torch.int16), new.view(torch.int16))
    many = old + 1.0  # every element: whole
    assert diff(many, old).indices is None and diff(many, old).nbytes == many.numel() * 2
    assert diff(new, None).indices is None  # nothing to compare with
    assert pytest.approx(1 / 3) == DENSE_FROM
    nan = old.clone()
    nan.view(-1)[5] = float("nan")
    assert diff(nan, nan.clone()).indices.numel() == 0  # equal bits, NaN or not


def nudge(model: torch.nn.Module, seed: int, scale: float) -> None:
    """An update of about `scale` on every parameter: bf16 sees only the few whose
    float32 value crosses a rounding boundary."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)


def sync_once(sender, receiver, backend, version: int, apply_it: bool = True):
    notices = []
    sent = sender.send(version, notices.append)
    got = receiver.apply(backend, receiver.receive(notices[0])) if apply_it else None
    return sent, got


def as_bf16(model) -> dict[str, torch.Tensor]:
    return {k: v.to(BF16).float() for k, v in model.state_dict().items()}


def test_a_caught_up_worker_pulls_the_changes_and_a_lagging_one_the_whole_version(model_dir):
    from workers.inference.torch_backend import TorchBackend

    cfg = SyncConfig(protocol="object_store", delta=True)
    store = InProcessStore()
    model = trainer_model(model_dir)
    sender = make_sender(cfg, store=store, wire_dtype="bfloat16")
    sender.attach(model)
    receiver, backend = make_receiver(cfg, store=store), TorchBackend(model_dir)
    late, late_backend = make_receiver(cfg, store=store), TorchBackend(model_dir)

    sent, got = sync_once(sender, receiver, backend, 1)
    whole_bytes = sent.bytes
    assert (
        got.bytes
        == whole_bytes
        == sum(t.numel() * 2 for t in model.state_dict().values() if t.dim() >= 0)
        - (model.lm_head.weight.numel() * 2 if model.config.tie_word_embeddings else 0)
    )
    for version in (2, 3):
        nudge(model, version, 3e-6)
        sent, got = sync_once(sender, receiver, backend, version)
        assert 0 < got.bytes == sent.bytes < whole_bytes / 4  # the changes only
        assert all(torch.equal(backend_weights(backend)[k], v) for k, v in as_bf16(model).items())

    nudge(model, 4, 3e-6)
    sync_once(sender, receiver, backend, 4, apply_it=False)  # version 4 never loaded
    nudge(model, 5, 3e-6)
    notices = []
    sender.send(5, notices.append)
    got = receiver.apply(backend, receiver.receive(notices[0]))
    assert got.bytes == whole_bytes  # its delta starts from 4: the whole version instead
    assert all(torch.equal(backend_weights(backend)[k], v) for k, v in as_bf16(model).items())
    got_late = late.apply(late_backend, late.receive(notices[0]))  # new: the whole version
    assert got_late.bytes == whole_bytes
    assert all(torch.equal(backend_weights(late_backend)[k], v) for k, v in as_bf16(model).items())

    nudge(model, 6, 3e-6)  # both caught up at 5: the changes only, for each
    notices = []
    sent = sender.send(6, notices.append)
    for r, b in ((receiver, backend), (late, late_backend)):
        assert 0 < r.apply(b, r.receive(notices[0])).bytes == sent.bytes < whole_bytes / 4
        assert all(torch.equal(backend_weights(b)[k], v) for k, v in as_bf16(model).items())


def test_a_shadow_starts_from_a_whole_version():
    shadow = Shadow()
    shadow.take_whole(3, {"w": torch.zeros(4, dtype=BF16)})
    shadow.take_changes(4, {"w": diff(torch.tensor([0, 1, 0, 0], dtype=BF16), torch.zeros(4, dtype=BF16))})
    assert shadow.version == 4 and shadow.state["w"].tolist() == [0, 1, 0, 0]


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"sync": {"delta": True, "protocol": "filesystem"}}, "set sync.protocol 'object_store' or sync.delta false"),
        ({"sync": {"delta": True}}, "set inference.dtype 'bfloat16' or sync.delta false"),
    ],
)
def test_a_delta_config_that_cannot_work_is_refused_naming_the_fields(fields, match):
    with pytest.raises(ValueError, match=match):
        RunConfig.model_validate(fields)


def test_a_delta_sender_needs_the_wire_dtype():
    with pytest.raises(ValueError, match="sync.delta needs the inference workers' dtype"):
        make_sender(SyncConfig(protocol="object_store", delta=True), store=InProcessStore())
