"""The run tier: a run as Ray actors. Admission and placement, spawning the actors, the
driver loop and the messages it exchanges, the rollout buffer, checkpoints, failures,
the reporter that sends figures to the site, and the paths a config may name.

May import every tier below it; only the simulate tier sits above.
"""
