"""A discrete-event simulator of a run at scale: the engine's own buffer, admission gate,
staleness rejection and update modes, against cost models of generation, training and
weight sync on a simulated cluster (docs/simulation.md).

    costs.py    cost models: decode roofline, training FLOPs, weight sync per protocol
    cluster.py  cluster size, pool split, links
    events.py   the event loop
    run.py      simulate(config, cluster, workload) → per-step series + summary
    calibration.py  the published single-H100 generation times the decode model is checked against
    published.py    verl's and AReaL's published tables, rebuilt as scenarios and simulated

May import every tier below it: it runs the run tier's own buffer and admission code.
"""

from workers.simulate.cluster import Cluster
from workers.simulate.costs import MODELS, QWEN25_7B, QWEN25_32B
from workers.simulate.run import SimResult, Workload, simulate

__all__ = ["MODELS", "QWEN25_7B", "QWEN25_32B", "Cluster", "SimResult", "Workload", "simulate"]
