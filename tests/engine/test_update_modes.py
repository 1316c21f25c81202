"""Weight-update modes (workers/rollout/partial_rollouts.py) on both backends: TorchBackend and real vLLM.

New weights are loaded after decode step K of a batch. Two weight sets make the
effect visible token by token:

- FORCE: every position's logits put all mass on one token Z (embeddings all ones,
  attention and MLP outputs zeroed, lm_head only on Z), so a token sampled under it is
  Z with logprob ≈ 0, whatever the context and the KV: it marks exactly which tokens the
  new weights produced.
- PERTURBED: the policy plus noise, an ordinary model, so a token's logprob depends on
  the KV of the tokens before it: a re-prefilled sequence (abort_resume) matches a full
  forward of the new weights, a sequence continued in flight (stale KV) does not.

The reference is the same call with no update (same seed: the first attempt of a batch
samples the same stream).
"""

from __future__ import annotations

import importlib

import pytest
import torch
from safetensors.torch import load_file

from workers.config.run_config import ModelConfig, RunConfig
from workers.rollout.partial_rollouts import (
    PartialCounts,
    StagedWeights,
    UpdatePolicy,
    generate_across_updates,
    partial_metrics,
)

K = 3  # decode steps before the update
MAX_NEW = 8
N = 4
SHARPEN = 8.0
# hidden 64 / 2 heads: head_dim 32, which vLLM-CPU has kernels for.
MODEL = ModelConfig(hidden_size=64, num_heads=2, intermediate_size=128)


def _prompts() -> list[list[int]]:
    return [[1] + [3 + (i * 7 + j * 3) % 20 for j in range(3 + i % 3)] for i in range(5)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    from workers.model.loading import build_tiny, save_model
    from workers.model.tokenizer import CharTokenizer

    tokenizer = CharTokenizer()
    model = build_tiny(MODEL, tokenizer, seed=1)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(SHARPEN)
    path = str(tmp_path_factory.mktemp("update-modes-model"))
    save_model(model, tokenizer, path)
    return path


@pytest.fixture(scope="module")
def weights(model_dir) -> dict[str, dict[str, torch.Tensor]]:
    from workers.model.tokenizer import CharTokenizer

    base = load_file(f"{model_dir}/model.safetensors")
    z = CharTokenizer().encode("z")[0]
    force = {k: v.clone() for k, v in base.items()}
    for k in force:
        if k.endswith(("o_proj.weight", "down_proj.weight")):
            force[k].zero_()
    force["model.embed_tokens.weight"].fill_(1.0)
    force["model.norm.weight"].fill_(1.0)
    force["lm_head.weight"].zero_()
    force["lm_head.weight"][z] = 10.0
    gen = torch.Generator().manual_seed(7)
    perturbed = {
        k: v + 0.5 * v.std() * torch.randn(v.shape, generator=gen) if v.dim() == 2 else v.clone()
        for k, v in base.items()
    }
    return {"base": base, "force": force, "perturbed": perturbed, "z": z}


def _torch_backend(model_dir):
    from workers.inference.torch_backend import TorchBackend

    return TorchBackend(model_dir)


@pytest.fixture(scope="module")
def vllm_backend(model_dir):
    try:
        importlib.import_module("vllm")
    except Exception as exc:
        pytest.skip(f"vllm is not importable ({exc})")
    from workers.config.run_config import InferenceConfig
    from workers.inference.vllm_backend import VLLMBackend

    backend = VLLMBackend(model_dir, InferenceConfig(), exact_steps=True)
    yield backend
    backend.close()


@pytest.fixture(params=["torch", pytest.param("vllm", marks=[pytest.mark.slow, pytest.mark.vllm])])
def backend(request, model_dir, weights):
    b = _torch_backend(model_dir) if request.param == "torch" else request.getfixturevalue("vllm_backend")
    b.load_weights(weights["base"])
    yield b
    b.load_weights(weights["base"])


class SwitchAfter:
    """Stages `new` after decode step `k` (the k-th call of pending())."""

    def __init__(self, backend, new: dict[str, torch.Tensor] | None, k: int = K) -> None:
        self.backend, self.new, self.k, self.calls, self.applied = backend, new, k, 0, 0

    def pending(self) -> bool:
        self.calls += 1
        return self.new is not None and self.calls >= self.k and not self.applied

    def apply(self) -> int:
        self.backend.load_weights(self.new)
        self.applied += 1
        return 1


def _engine_pauses(backend, monkeypatch) -> list[tuple] | None:
    """vLLM's engine calls beneath a pause, recorded from now on: ("pause", mode),
    ("clear",) for a cache reset that preempts the running requests, ("resume",). These
    are the `EngineCore` calls that `AsyncLLM.pause_generation` / `resume_generation`
    reach too. None on the torch backend, which has no engine to pause."""
    llm = getattr(backend, "_llm", None)
    if llm is None:
        return None
    core = llm.llm_engine.engine_core.engine_core  # the in-process EngineCore
    events: list[tuple] = []
    pause, resume, reset = core.pause_scheduler, core.resume_scheduler, core.reset_prefix_cache

    def pausing(mode="abort", clear_cache=True):
        events.append(("pause", mode))
        return pause(mode=mode, clear_cache=clear_cache)

    def resuming():
        events.append(("resume",))
        return resume()

    def resetting(reset_running_requests=False, reset_connector=False):
        if reset_running_requests:
            events.append(("clear",))
        return reset(reset_running_requests, reset_connector)

    monkeypatch.setattr(core, "pause_scheduler", pausing)
    monkeypatch.setattr(core, "resume_scheduler", resuming)
    monkeypatch.setattr(core, "reset_prefix_cache", resetting)
    return events


# What each mode asks of vLLM's pause (workers.inference.vllm_backend.VLLMSession.take_weights).
PAUSES = {
    "in_flight": [("pause", "keep"), ("resume",)],
    "abort_resume": [("pause", "keep"), ("clear",), ("resume",)],
    "abort_retry": [("pause", "abort"), ("clear",), ("resume",)],
}


def _run(backend, mode: str, new, seed: int = 11):
    return generate_across_updates(
        backend, _prompts(), N, MAX_NEW, 1.0, seed, 0, UpdatePolicy(mode), SwitchAfter(backend, new)
    )


def _rows(gen):
    return [s for group in gen.sequences for s in group]


def _reference(backend, mode):
    ref = _run(backend, mode, None)
    assert ref.counts == PartialCounts() and ref.version == 0
    return _rows(ref)


def _split(ref_rows):
    """Rows still generating after step K (the update hits them) and the others."""
    hit = [i for i, r in enumerate(ref_rows) if len(r.token_ids) > K]
    assert len(hit) >= 5, "the test needs rows that outlive step K"
    return hit


@pytest.mark.parametrize("mode", ["in_flight", "abort_resume", "abort_retry"])
def test_every_token_carries_the_version_that_produced_it(backend, weights, mode, monkeypatch):
    ref = _reference(backend, mode)
    hit = _split(ref)
    pauses = _engine_pauses(backend, monkeypatch)
    gen = _run(backend, mode, weights["force"])
    if pauses is not None:  # vLLM: the weights arrived through its pause and resume, once
        assert pauses == PAUSES[mode]
    rows = _rows(gen)
    z = weights["z"]
    assert gen.version == 1 and gen.counts.mid_generation_updates == 1
    for i, (r, want) in enumerate(zip(rows, ref, strict=True)):
        if i not in hit:  # done before the update: untouched
            assert (r.token_ids, r.versions) == (want.token_ids, [0] * len(want.token_ids))
            continue
        assert len(r.token_ids) == len(r.versions) == len(r.logprobs) == MAX_NEW  # Z never ends a row
        kept = 0 if mode == "abort_retry" else K
        assert r.token_ids[:kept] == want.token_ids[:kept]
        assert r.logprobs[:kept] == pytest.approx(want.logprobs[:kept], abs=1e-6)
        assert r.versions == [0] * kept + [1] * (MAX_NEW - kept)
        assert r.token_ids[kept:] == [z] * (MAX_NEW - kept)
        assert max(abs(lp) for lp in r.logprobs[kept:]) < 1e-4
    aborted = 0 if mode == "in_flight" else len(hit)
    assert gen.counts.aborted == aborted
    assert gen.counts.resumed == (aborted if mode == "abort_resume" else 0)
    assert gen.counts.retried == (aborted if mode == "abort_retry" else 0)


def _full_forward_logprobs(model_dir, state, row) -> list[float]:
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    hf.load_state_dict(state)
    ids = torch.tensor([row.prompt_ids + row.token_ids])
    with torch.no_grad():
        logp = torch.log_softmax(hf(ids).logits[0].float(), dim=-1)
    start = len(row.prompt_ids) - 1
    return [logp[start + k, t].item() for k, t in enumerate(row.token_ids)]


def test_prefix_resume_reprefills_kept_tokens_while_in_flight_keeps_stale_kv(backend, model_dir, weights, monkeypatch):
    hit = _split(_reference(backend, "abort_resume"))
    pauses = _engine_pauses(backend, monkeypatch)
    resumed = _rows(_run(backend, "abort_resume", weights["perturbed"]))
    backend.load_weights(weights["base"])
    in_flight = _rows(_run(backend, "in_flight", weights["perturbed"]))
    if pauses is not None:  # on vLLM its own recompute re-prefilled the kept tokens
        assert pauses == PAUSES["abort_resume"] + PAUSES["in_flight"]
    stale_gap = 0.0
    for i in hit:
        r, f = resumed[i], in_flight[i]
        assert r.token_ids[:K] == f.token_ids[:K]  # same kept tokens, same versions
        new_r = _full_forward_logprobs(model_dir, weights["perturbed"], r)
        old_r = _full_forward_logprobs(model_dir, weights["base"], r)
        # Kept tokens: the old policy's logprobs; after: exactly a fresh forward of the
        # new weights over prompt + every token so far (the kept ones re-prefilled).
        assert r.logprobs[:K] == pytest.approx(old_r[:K], abs=2e-3)
        assert r.logprobs[K:] == pytest.approx(new_r[K:], abs=2e-3)
        new_f = _full_forward_logprobs(model_dir, weights["perturbed"], f)
        stale_gap = max(stale_gap, max(abs(a - b) for a, b in zip(f.logprobs[K:], new_f[K:], strict=False)))
    # In flight, the KV of the first K tokens was computed by the old weights: the new
    # tokens' logprobs are not those of a fresh forward.
    assert stale_gap > 0.05


def test_vllm_refuses_in_flight_lora_naming_the_fields_and_the_way_out():
    from pydantic import ValidationError

    from workers.config.run_config import RunConfig

    bad = {
        "inference": {"backend": "vllm"},
        "lora": {"enabled": True},
        "sync": {"protocol": "lora", "update_mode": "in_flight"},
    }
    with pytest.raises(ValidationError) as err:
        RunConfig.model_validate(bad)
    text = str(err.value)
    assert "sync.update_mode 'in_flight'" in text and "sync.protocol 'lora'" in text and "abort_resume" in text
    # Every other combination of mode and backend is accepted.
    for backend in ("torch", "vllm"):
        for mode in ("drain", "abort_retry", "abort_resume", "in_flight"):
            RunConfig.model_validate({"inference": {"backend": backend}, "sync": {"update_mode": mode}})
    RunConfig.model_validate({**bad, "sync": {"protocol": "lora", "update_mode": "abort_resume"}})
    RunConfig.model_validate({**bad, "inference": {"backend": "torch"}})


def test_a_session_refuses_bad_budgets(model_dir):
    backend = _torch_backend(model_dir)
    with pytest.raises(ValueError, match="max_new_tokens"):
        backend.start([[1, 3]], [0], 1.0, 0)


def test_drain_takes_no_weights_mid_call_even_with_some_staged(backend, weights, monkeypatch):
    ref = _reference(backend, "in_flight")
    switch = SwitchAfter(backend, weights["force"])
    pauses = _engine_pauses(backend, monkeypatch)
    gen = generate_across_updates(backend, _prompts(), N, MAX_NEW, 1.0, 11, 0, UpdatePolicy("drain"), switch)
    assert switch.calls == switch.applied == 0  # never even asked
    assert not pauses  # nothing paused either
    assert gen.version == 0 and gen.counts == PartialCounts()
    assert [(r.token_ids, r.versions) for r in _rows(gen)] == [(r.token_ids, r.versions) for r in ref]


def test_the_update_policy_answers_each_decision_from_the_mode_alone():
    table = {
        # mode: (stepped, aborts, keeps_tokens, loads with episodes in flight)
        "drain": (False, False, True, False),
        "in_flight": (True, False, True, True),
        "abort_resume": (True, True, True, True),
        "abort_retry": (True, True, False, True),
    }
    for mode, (stepped, aborts, keeps, loads) in table.items():
        policy = UpdatePolicy.of(RunConfig.model_validate({"sync": {"update_mode": mode}}))
        assert policy == UpdatePolicy(mode)
        assert (policy.stepped, policy.exact_steps) == (stepped, stepped)
        assert (policy.aborts, policy.keeps_tokens) == (aborts, keeps)
        assert policy.loads_between_calls(in_flight=True) == loads and policy.loads_between_calls(in_flight=False)
        assert policy.admits_while_pending() == stepped
        assert (policy.pause_mode, policy.clear_cache) == {
            "drain": ("wait", False),
            "in_flight": ("keep", False),
            "abort_resume": ("keep", True),
            "abort_retry": ("abort", True),
        }[mode]
        staged = StagedWeights(lambda w: None, lambda: 0)
        assert (policy.offered(staged) is staged) == stepped


def test_staged_weights_keep_the_newest_version_and_load_it_once():
    loaded: list[str] = []
    held = {"version": 0}

    def load(weights: str) -> None:
        loaded.append(weights)
        held["version"] = int(weights[1:])

    staged = StagedWeights(load, lambda: held["version"])
    assert not staged.pending() and staged.apply() == 0 and loaded == []
    staged.stage("v2", 2)
    staged.stage("v1", 1)  # arrived late: older than what is staged
    staged.stage("v3", 3)
    assert staged.pending()
    assert staged.apply() == 3 and loaded == ["v3"]
    assert not staged.pending() and staged.apply() == 3 and loaded == ["v3"]


def test_the_partial_series_sum_every_inference_workers_counts():
    counts = [PartialCounts(aborted=2, resumed=1), PartialCounts(aborted=3, retried=4, mid_generation_updates=9)]
    assert partial_metrics(counts) == {
        "rollout/partial_aborted": 5.0,
        "rollout/partial_resumed": 1.0,
        "rollout/partial_retried": 4.0,
    }


class _Arriving:
    """Staged weights that arrive on the `arrives_at`-th look (None: never)."""

    def __init__(self, arrives_at: int | None) -> None:
        self.arrives_at, self.looks, self.applied = arrives_at, 0, 0

    def pending(self) -> bool:
        self.looks += 1
        return self.arrives_at is not None and self.looks >= self.arrives_at

    def apply(self) -> int:
        self.applied += 1
        return 1


def test_a_forced_call_waits_at_its_first_look_until_weights_are_staged():
    import threading

    from workers.rollout.partial_rollouts import WeightsMidGeneration

    staged = _Arriving(arrives_at=5)
    updates = WeightsMidGeneration(staged, due=True, stopping=threading.Event(), poll_s=0)
    assert updates.pending() is True and staged.looks >= 5  # it kept looking until they came
    looks = staged.looks
    assert updates.pending() is True and staged.looks == looks + 1  # later looks do not wait
    assert updates.apply() == 1 and staged.applied == 1


def test_a_forced_call_does_not_wait_when_no_version_is_due_or_the_worker_stops():
    import threading

    from workers.rollout.partial_rollouts import WeightsMidGeneration

    staged = _Arriving(arrives_at=None)
    assert WeightsMidGeneration(staged, due=False, stopping=threading.Event(), poll_s=0).pending() is False
    assert staged.looks == 1
    stopping = threading.Event()
    stopping.set()
    assert WeightsMidGeneration(staged, due=True, stopping=stopping, poll_s=0).pending() is False


@pytest.mark.slow
@pytest.mark.vllm
def test_abort_resume_under_a_lora_sync_resumes_the_rows_on_the_new_adapter(tmp_path, monkeypatch):
    """A request vLLM keeps through a pause keeps the adapter it was added with, so under
    sync.protocol 'lora' abort_resume aborts (vLLM's pause mode "abort") and adds the rows
    again with their tokens: their later tokens come from the new adapter."""
    pytest.importorskip("vllm")
    import copy

    from tests.engine.test_weight_sync_protocols import connect, sync, sync_cfg, train_a_little, trainer_model
    from workers.config.run_config import InferenceConfig, LoRAConfig
    from workers.inference.vllm_backend import VLLMBackend
    from workers.model.loading import build_tiny, save_model
    from workers.model.lora import apply_lora
    from workers.model.tokenizer import CharTokenizer
    from workers.sync import make_receiver, make_sender
    from workers.sync.object_store import InProcessStore

    model_dir = str(tmp_path / "model")
    save_model(build_tiny(MODEL, CharTokenizer(), seed=1), CharTokenizer(), model_dir)
    torch.manual_seed(0)
    model = apply_lora(trainer_model(model_dir), LoRAConfig(enabled=True, rank=8, alpha=16.0), init_lora_weights=False)
    store = InProcessStore()
    sender = make_sender(sync_cfg("lora"), store=store)
    receiver = make_receiver(sync_cfg("lora"), model_dir=model_dir, store=store)
    sender.attach(model)
    connect(sender, [receiver])
    backend = VLLMBackend(model_dir, InferenceConfig(backend="vllm"), lora_rank=8, exact_steps=True)
    try:
        train_a_little(model, seed=1)
        sync(sender, receiver, backend, 1)
        merged = {1: copy.deepcopy(model).merge_and_unload().eval()}
        train_a_little(model, seed=2)
        with torch.no_grad():  # far enough from version 1 to tell the two apart
            gen = torch.Generator().manual_seed(2)
            for p in (p for p in model.parameters() if p.requires_grad):
                p.add_(0.3 * torch.randn(p.shape, generator=gen))
        merged[2] = copy.deepcopy(model).merge_and_unload().eval()

        class Version2AfterK:
            calls = 0

            def pending(self) -> bool:
                self.calls += 1
                return self.calls == K

            def apply(self) -> int:
                sync(sender, receiver, backend, 2)
                return 2

        pauses = _engine_pauses(backend, monkeypatch)
        out = generate_across_updates(
            backend, _prompts(), N, MAX_NEW, 1.0, 11, 1, UpdatePolicy("abort_resume"), Version2AfterK()
        )
        assert pauses == PAUSES["abort_retry"]  # aborted, then added again
        assert backend._lora_request.lora_name == "policy-v2"
        rows = _rows(out)
        hit = [r for r in rows if 2 in r.versions]
        assert len(hit) >= 5 and out.counts.aborted == out.counts.resumed == len(hit)
        gap = 0.0
        for r in rows:
            ids = torch.tensor([r.prompt_ids + r.token_ids])
            with torch.no_grad():
                logp = {v: torch.log_softmax(m(input_ids=ids).logits[0], -1) for v, m in merged.items()}
            start = len(r.prompt_ids) - 1
            for k, (t, v) in enumerate(zip(r.token_ids, r.versions, strict=True)):
                assert r.logprobs[k] == pytest.approx(logp[v][start + k, t].item(), abs=2e-3), (k, v)
                if v == 2:
                    gap = max(gap, abs(logp[1][start + k, t].item() - logp[2][start + k, t].item()))
        assert [r.versions[:K] for r in hit] == [[1] * K] * len(hit)
        assert gap > 0.05  # version 1's adapter would not have given those logprobs
    finally:
        backend.close()
        receiver.close()
