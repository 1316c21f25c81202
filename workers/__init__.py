"""Rollway's engine: everything that runs on the Ray cluster. Never imports Django."""
