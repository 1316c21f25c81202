"""The train tier: a training step from scored groups. The trainer and its pool of ranks,
the loss, how a batch is laid out and accounted for, warm starts and exports.

May import every tier below it: core, tasks, config, model, sync, inference, rollout.
"""
