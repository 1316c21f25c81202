"""The policy model: a tiny Llama built from `ModelConfig`, saved as a Hugging Face dir.

The directory format is the one thing every backend shares: `config.json` +
`model.safetensors` (LlamaForCausalLM, untied embeddings, checkpoint-format names) plus
the tokenizer JSON. vLLM loads it with `skip_tokenizer_init=True`; the trainer and the
torch backend load it with transformers / safetensors.
"""

from __future__ import annotations

import os

import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.utils import logging as hf_logging

from workers.config import ModelConfig
from workers.tokenizer import CharTokenizer

# Progress bars from every save/load would flood the run logs.
hf_logging.disable_progress_bar()


def build_tiny(model_cfg: ModelConfig, tokenizer: CharTokenizer, seed: int) -> LlamaForCausalLM:
    """A freshly initialised Llama of the configured size (deterministic from `seed`)."""
    config = LlamaConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=model_cfg.hidden_size,
        intermediate_size=model_cfg.intermediate_size,
        num_hidden_layers=model_cfg.num_layers,
        num_attention_heads=model_cfg.num_heads,
        num_key_value_heads=model_cfg.num_heads,
        max_position_embeddings=model_cfg.max_position_embeddings,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_id,
        bos_token_id=tokenizer.bos_id,
        eos_token_id=tokenizer.eos_id,
        torch_dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.float()


def load_model(model_dir: str) -> LlamaForCausalLM:
    """Load a Hugging Face model directory (float32, eval mode)."""
    if not os.path.exists(os.path.join(model_dir, "config.json")):
        raise FileNotFoundError(
            f"{model_dir} is not a Hugging Face model directory (no config.json); model.path must point at one"
        )
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return model.eval()


def save_model(model: LlamaForCausalLM, tokenizer: CharTokenizer, model_dir: str) -> None:
    """Write `model_dir` as config.json + model.safetensors + tokenizer JSON."""
    os.makedirs(model_dir, exist_ok=True)
    model.save_pretrained(model_dir, safe_serialization=True)
    tokenizer.save(model_dir)


def checkpoint_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Weights under HF checkpoint names, as contiguous detached CPU tensors (a copy)."""
    return {name: t.detach().to("cpu").contiguous().clone() for name, t in model.state_dict().items()}
