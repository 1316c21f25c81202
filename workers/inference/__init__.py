"""The inference tier: generation backends behind one interface
(workers.inference.base.InferenceBackend): the hand-written torch loop, transformers' own
forward, and a vLLM engine, chosen by `inference.backend` (workers/inference/backends.py
`make_backend`).

May import the core, tasks, config, model and sync tiers (a backend applies weights a
sync protocol delivered); what a run's sequences need (its context length) is worked out
in the rollout tier and handed in.

This file imports nothing: `workers.inference.base` (what a backend offers, no torch) is
read by processes that must stay light, such as the site's admission check, and
importing it runs this file first.
"""
