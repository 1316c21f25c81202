"""The core tier: the records that travel from inference to the loss (a rollout, its
routing and sampling masks), the vocabulary every tier speaks (metric names, actor names,
timelines, latency draws, chat messages, log lines, config merges), and the process-level
facts (devices, rendezvous, the Hub, which user modules may be imported).

Imports nothing else of the engine: every other tier may import it.
"""
