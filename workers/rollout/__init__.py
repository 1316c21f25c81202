"""The rollout tier: from a task's data to scored groups. Loading and splitting task data,
a run's context length, generating groups (whole, partial or as multi-agent episodes),
scoring them (reward functions, reward models, process rewards) and evaluation passes.

May import the core, tasks, config, model, sync and inference tiers.
"""
