"""The model tier: loading a policy and its tokenizer through transformers' own classes,
LoRA adapters through peft, per-token log-probabilities, and the tiny checkpoints the
project makes for itself.

May import the core, tasks and config tiers.
"""
