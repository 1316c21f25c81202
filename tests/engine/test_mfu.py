"""Model FLOPs utilisation (workers/train/mfu.py): FLOPs per token against hand counts of four
families, the table of peaks by device name, and the trainer's series."""

from __future__ import annotations

import pytest
import torch
import transformers

import workers.train.mfu
from tests.engine.helpers import fixed_groups, small_config
from workers.train.mfu import PEAK_SETTING, ModelFlops, device_peak, lookup_peak, peak_flops
from workers.train.trainer import Trainer

D, FF, L, H, KV, V, T = 64, 128, 2, 4, 2, 100, 50  # hidden, MLP, layers, heads, KV heads, vocab, tokens
HD = D // H
ATTN = 12 * L * H * HD * T  # the attention term per token of a T-token sequence


def built(config) -> torch.nn.Module:
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(config)


def lookup_free_params(model: torch.nn.Module, skip: tuple[str, ...]) -> int:
    """The instantiated model's parameter count, less the embedding tables named in `skip`."""
    return sum(p.numel() for n, p in model.named_parameters() if not n.endswith(skip))


def test_a_llama_counts_its_projections_mlp_norms_and_head_but_not_its_embedding():
    config = transformers.LlamaConfig(
        hidden_size=D, intermediate_size=FF, num_hidden_layers=L, num_attention_heads=H, num_key_value_heads=KV,
        vocab_size=V, tie_word_embeddings=False,
    )  # fmt: skip
    layer = D * D + 2 * D * KV * HD + D * D + 3 * D * FF + 2 * D  # q, k, v, o, gated MLP, two norms
    n = L * layer + D + V * D  # final norm, LM head
    flops = ModelFlops.from_config(config)
    assert flops.weight_flops == 6 * n == 6 * lookup_free_params(built(config), ("embed_tokens.weight",))
    assert flops.per_token(T) == 6 * n + ATTN


def test_a_qwen2_with_tied_embeddings_counts_the_shared_table_once_as_its_head():
    config = transformers.Qwen2Config(
        hidden_size=D, intermediate_size=FF, num_hidden_layers=L, num_attention_heads=H, num_key_value_heads=KV,
        vocab_size=V, tie_word_embeddings=True,
    )  # fmt: skip
    layer = D * D + 2 * D * KV * HD + D * D + (D + 2 * KV * HD) + 3 * D * FF + 2 * D  # + q, k, v biases
    n = L * layer + D + V * D
    flops = ModelFlops.from_config(config)
    assert flops.weight_flops == 6 * n == 6 * lookup_free_params(built(config), ())
    assert flops.per_token(T) == 6 * n + ATTN


def test_a_gpt2_counts_its_plain_mlp_and_biases_but_not_its_position_table():
    config = transformers.GPT2Config(n_embd=D, n_layer=L, n_head=H, vocab_size=V, n_positions=256)
    layer = 2 * D + (3 * D * D + 3 * D) + (D * D + D) + 2 * D + (4 * D * D + 4 * D) + (4 * D * D + D)
    n = L * layer + 2 * D + V * D  # ln_f, the tied wte as the head
    flops = ModelFlops.from_config(config)
    assert flops.weight_flops == 6 * n == 6 * lookup_free_params(built(config), ("wpe.weight",))
    assert flops.per_token(T) == 6 * n + ATTN


def test_a_mixtral_counts_only_the_experts_a_token_is_routed_to():
    E, K = 8, 2
    config = transformers.MixtralConfig(
        hidden_size=D, intermediate_size=FF, num_hidden_layers=L, num_attention_heads=H, num_key_value_heads=KV,
        vocab_size=V, num_local_experts=E, num_experts_per_tok=K,
    )  # fmt: skip
    attention = D * D + 2 * D * KV * HD + D * D
    n = L * (attention + E * D + K * 3 * D * FF + 2 * D) + D + V * D  # the router sees every token
    flops = ModelFlops.from_config(config)
    assert flops.weight_flops == 6 * n
    model = built(config)
    experts = sum(p.numel() for name, p in model.named_parameters() if ".experts." in name)
    assert experts == L * E * 3 * D * FF
    assert n == lookup_free_params(model, ("embed_tokens.weight",)) - experts * (E - K) // E
    assert flops.per_token(T) == 6 * n + ATTN


def test_a_qwen2_moe_counts_its_routed_experts_by_top_k_and_its_shared_expert_whole():
    E, K, MI, SI = 4, 2, 32, 48
    config = transformers.Qwen2MoeConfig(
        hidden_size=D, intermediate_size=FF, num_hidden_layers=L, num_attention_heads=H, num_key_value_heads=KV,
        vocab_size=V, num_experts=E, num_experts_per_tok=K, moe_intermediate_size=MI,
        shared_expert_intermediate_size=SI, tie_word_embeddings=False,
    )  # fmt: skip
    attention = D * D + 2 * D * KV * HD + D * D + (D + 2 * KV * HD)
    moe = E * D + K * 3 * D * MI + 3 * D * SI + D  # router, active experts, shared expert and its gate
    n = L * (attention + moe + 2 * D) + D + V * D
    flops = ModelFlops.from_config(config)
    assert flops.weight_flops == 6 * n
    experts = L * E * 3 * D * MI
    assert n == lookup_free_params(built(config), ("embed_tokens.weight",)) - experts * (E - K) // E


def test_a_model_with_no_attention_heads_has_no_attention_term():
    config = transformers.MambaConfig(vocab_size=V, hidden_size=D, num_hidden_layers=L, tie_word_embeddings=True)
    flops = ModelFlops.from_config(config)
    assert flops.per_token(T) == flops.weight_flops == 6 * lookup_free_params(built(config), ())


def test_frozen_parameters_count_four_flops_not_six():
    config = transformers.LlamaConfig(
        hidden_size=D, intermediate_size=FF, num_hidden_layers=L, num_attention_heads=H, num_key_value_heads=KV,
        vocab_size=V,
    )  # fmt: skip
    model = built(config)
    trained = ModelFlops.of(model).weight_flops
    assert ModelFlops.of(model.requires_grad_(False)).weight_flops == trained * 4 / 6


def test_a_steps_flops_sum_each_sequence_at_its_own_length():
    flops = ModelFlops(weight_flops=600.0, layers=2, attn_width=8)
    assert flops.of_sequences([3, 5]) == 3 * (600 + 12 * 2 * 8 * 3) + 5 * (600 + 12 * 2 * 8 * 5)


@pytest.mark.parametrize(
    "name, bf16, fp32",
    [
        ("NVIDIA H100 80GB HBM3", 989.5, 67.0),
        ("NVIDIA H100 PCIe", 756.5, 51.0),
        ("NVIDIA H100 NVL", 835.5, 60.0),
        ("NVIDIA H200", 989.5, 67.0),
        ("NVIDIA H200 NVL", 835.5, 60.0),
        ("NVIDIA GH200 480GB", 989.5, 67.0),
        ("NVIDIA A100-SXM4-40GB", 312.0, 19.5),
        ("NVIDIA A100-SXM4-80GB", 312.0, 19.5),
        ("NVIDIA A100 80GB PCIe", 312.0, 19.5),
        ("NVIDIA L40S", 362.05, 91.6),
        ("NVIDIA L4", 121.0, 30.3),
        ("NVIDIA A10", 125.0, 31.2),
        ("NVIDIA GeForce RTX 4090", 165.2, 82.6),
    ],
)
def test_the_peak_is_found_by_the_name_torch_gives_the_device(name, bf16, fp32):
    peak = lookup_peak(name)
    assert peak is not None and (peak.bf16, peak.fp32) == (bf16, fp32)


@pytest.mark.parametrize("name", ["NVIDIA A10G", "NVIDIA B200", "Tesla T4", "NVIDIA GeForce RTX 4080", "AMD MI300X"])
def test_a_device_not_in_the_table_has_no_peak(name):
    assert lookup_peak(name) is None and peak_flops(name, "bfloat16", env={}) is None


def test_float32_takes_the_tf32_peak_only_where_torch_lets_matmuls_use_tf32():
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert peak_flops("NVIDIA A100-SXM4-80GB", "float32", env={}) == 19.5e12
        torch.set_float32_matmul_precision("high")
        assert peak_flops("NVIDIA A100-SXM4-80GB", "float32", env={}) == 156e12
        assert peak_flops("NVIDIA A100-SXM4-80GB", "bfloat16", env={}) == 312e12
    finally:
        torch.set_float32_matmul_precision(before)


def test_the_cpu_has_no_peak(monkeypatch):
    monkeypatch.delenv(PEAK_SETTING, raising=False)
    assert device_peak(torch.device("cpu"), "bfloat16") is None


def test_the_operators_peak_names_any_device_and_a_bad_one_is_refused_with_the_fix():
    assert peak_flops(None, "bfloat16", env={PEAK_SETTING: "123.5"}) == 123.5e12
    assert peak_flops("NVIDIA H100 PCIe", "bfloat16", env={PEAK_SETTING: "700"}) == 700e12
    for bad in ("fast", "0", "-5", "inf"):
        with pytest.raises(ValueError, match=f"{PEAK_SETTING} must be one device's peak in TFLOP/s, a number > 0"):
            peak_flops(None, "bfloat16", env={PEAK_SETTING: bad})


def test_the_trainer_reports_mfu_only_on_a_device_with_a_peak(tiny_model_dir, monkeypatch):
    """Named as an H100's, the CPU trainer's step gets an MFU against the H100's float32
    peak; as the CPU it is, none. Its FLOPs are counted again here from the checkpoint's
    config, apart from the trainer's own count."""
    monkeypatch.delenv(PEAK_SETTING, raising=False)
    assert torch.get_float32_matmul_precision() == "highest"  # torch's default: no TF32
    cfg = small_config()
    groups = fixed_groups(tiny_model_dir, cfg)
    lengths = [len(r.prompt_ids) + len(r.completion_ids) for g in groups for r in g.rollouts]
    flops = ModelFlops.from_config(transformers.AutoConfig.from_pretrained(tiny_model_dir)).of_sequences(lengths)

    on_cpu = Trainer(cfg, tiny_model_dir).train_step(groups)
    assert "trainer/mfu" not in on_cpu
    assert on_cpu["trainer/tokens_per_s"] == pytest.approx(sum(lengths) / on_cpu["trainer/step_s"])

    monkeypatch.setattr(workers.train.mfu, "device_name", lambda device: "NVIDIA H100 80GB HBM3")
    trainer = Trainer(cfg, tiny_model_dir)
    assert trainer.peak_flops == 67e12
    metrics = trainer.train_step(groups)
    achieved = flops / metrics["trainer/step_s"]
    assert metrics["trainer/model_tflops"] == pytest.approx(achieved / 1e12)
    assert metrics["trainer/mfu"] == pytest.approx(achieved / 67e12)
    assert 0 < metrics["trainer/mfu"] < 1
