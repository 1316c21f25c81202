"""The config tier: a run's typed configuration (`run_config.RunConfig`), its presets and
its reference page.

May import the core and tasks tiers only.
"""
