"""Worked examples of bringing your own task, dataset and reward to Rollway."""
