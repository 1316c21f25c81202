"""Full-reload weight sync: tensors survive the wire format and the object store."""

from __future__ import annotations

import pytest
import ray
import torch

from workers import weight_sync


def state_dict():
    g = torch.Generator().manual_seed(0)
    return {
        "model.embed_tokens.weight": torch.randn(16, 8, generator=g),
        "model.norm.weight": torch.randn(8, generator=g).to(torch.bfloat16),
        "lm_head.weight": torch.randn(8, 16, generator=g).t(),  # non-contiguous
    }


def test_wire_format_round_trips_every_dtype_and_shape():
    sd = state_dict()
    wire, nbytes = weight_sync.to_wire(sd)
    assert nbytes == sum(t.numel() * t.element_size() for t in sd.values())
    back = weight_sync.from_wire(wire)
    for name, t in sd.items():
        assert back[name].dtype == t.dtype and back[name].shape == t.shape
        assert torch.equal(back[name], t)


class Recorder:
    def __init__(self):
        self.loaded = None

    def load_weights(self, sd):
        self.loaded = {k: v.clone() for k, v in sd.items()}


@pytest.mark.slow
def test_publish_fetch_load_through_the_object_store():
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        @ray.remote(num_cpus=0)
        class Sink:
            def __init__(self):
                self.update = None

            def update_weights(self, update):
                self.update = update

            def get(self):
                return self.update

        sink = Sink.remote()
        sd = state_dict()
        update, trainer_ms = weight_sync.publish(sd, 3, [sink])
        assert trainer_ms >= 0 and update.version == 3
        received = ray.get(sink.get.remote())
        while received is None:
            received = ray.get(sink.get.remote())
        fetched, fetch_ms = weight_sync.fetch(received)
        backend = Recorder()
        stats = weight_sync.load(backend, received, fetched, fetch_ms)
        assert stats.version == 3 and stats.nbytes == update.nbytes
        assert stats.end_to_end_ms >= stats.load_ms >= 0
        for name, t in sd.items():
            assert torch.equal(backend.loaded[name], t)
    finally:
        ray.shutdown()
