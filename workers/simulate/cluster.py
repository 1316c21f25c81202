"""The simulated cluster: how many GPUs, how they split between the pools, where the
pools sit, and which link a weight sync crosses.

A `RunConfig` says how a run behaves (buffer, staleness, sync protocol, update mode,
placement mode); the cluster says how big it is. The pool sizes of the config
(inference.num_workers, trainer.num_ranks) describe the run as launched here and are
not read: `Cluster.inference_share` and `tp` size the pools instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from workers.simulate.costs import H100, INFINIBAND, NVLINK, Device, Link

# DGX/HGX H100 nodes: 8 GPUs on one NVLink switch.
GPUS_PER_NODE = 8


@dataclass(frozen=True)
class Cluster:
    """`gpus` GPUs of one kind in nodes of `gpus_per_node`; `inference_share` of them
    generate (disaggregated), the rest train; `tp` GPUs per inference worker; nodes
    joined by `inter_node` (InfiniBand unless said), GPUs in a node by `intra_node`
    (an H100's NVLink unless said)."""

    gpus: int
    inference_share: float = 0.5
    tp: int = 1
    device: Device = H100
    gpus_per_node: int = GPUS_PER_NODE
    inter_node: Link = INFINIBAND
    intra_node: Link = NVLINK

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise ValueError(f"cluster.gpus must be ≥ 1 (got {self.gpus})")
        if not 0 < self.inference_share < 1:
            raise ValueError(
                f"cluster.inference_share must be between 0 and 1, exclusive (got {self.inference_share}): "
                "both pools need GPUs when disaggregated"
            )
        if self.tp < 1:
            raise ValueError(f"cluster.tp must be ≥ 1 (got {self.tp})")


@dataclass(frozen=True)
class Layout:
    """The pools on the cluster."""

    workers: int  # inference workers
    tp: int
    trainer_ranks: int
    colocated: bool
    sync_link: Link  # trainer → inference weights
    grad_link: Link  # between trainer ranks
    inference_nodes: int

    @property
    def inference_gpus(self) -> int:
        return self.workers * self.tp


def layout(cluster: Cluster, placement_mode: str) -> Layout:
    """Disaggregated: `inference_share` of the GPUs (whole workers of `tp`) generate and
    the rest train; colocated: every GPU does both, in turns (the trainer and an
    inference worker share each GPU, tp 1, as the engine lays it out)."""
    g, tp = cluster.gpus, cluster.tp
    one_node = g <= cluster.gpus_per_node
    intra_or_inter = cluster.intra_node if one_node else cluster.inter_node
    if placement_mode == "colocated":
        if tp != 1:
            # As the engine's config refuses it: Ray gives an actor a share of one GPU
            # or whole GPUs, so a worker and a rank share one GPU, never half of two.
            raise ValueError(
                f"cluster.tp must be 1 with placement.mode 'colocated' (got {tp}): each GPU is shared by one "
                "inference worker and one trainer rank; use placement.mode 'disaggregated' for tensor parallel workers"
            )
        workers = g // tp
        return Layout(workers, tp, g, True, cluster.intra_node, intra_or_inter, math.ceil(g / cluster.gpus_per_node))
    inference = math.floor(g * cluster.inference_share / tp) * tp
    trainer = g - inference
    if inference < tp or trainer < 1:
        raise ValueError(
            f"cluster.inference_share {cluster.inference_share} of {g} GPUs leaves "
            f"{inference} for inference (whole workers of tp={tp}) and {trainer} for the trainer: "
            "each pool needs at least one (raise cluster.gpus or move the share)"
        )
    # Pools on separate nodes talk over the inter-node link; on one node, over NVLink.
    return Layout(
        inference // tp,
        tp,
        trainer,
        False,
        intra_or_inter,
        cluster.intra_node if trainer <= cluster.gpus_per_node else cluster.inter_node,
        math.ceil(inference / cluster.gpus_per_node),
    )
