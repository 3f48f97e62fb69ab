"""Collective communication times: measured alpha-beta fits when the cluster has them, else the
link tiers (bandwidth x per-collective efficiency) with ring algorithms.

Ring volumes per rank for a buffer of B bytes over g ranks (Thakur et al. 2005; Narayanan et al.
2021 Sec 3.3): all-reduce `2(g-1)/g B` in 2(g-1) steps, all-gather / reduce-scatter `(g-1)/g B`
in g-1 steps, send/recv B in one step. Measured fits (meshplan profile-links) give
time = latency + B / algbw for the full buffer B, which already includes the algorithm.
"""
from __future__ import annotations

from meshplan.cluster import ClusterSpec, LinkSpec

_RING = {"all_reduce": (2.0, 2), "all_gather": (1.0, 1), "reduce_scatter": (1.0, 1),
         "all_to_all": (1.0, 1)}


def group_tier(cluster: ClusterSpec, stride: int, size: int) -> str:
    """"intra_node" when a group of `size` ranks, `stride` apart, lies inside one node."""
    return "intra_node" if stride * size <= cluster.devices_per_node else "inter_node"


def _link(cluster: ClusterSpec, tier: str) -> LinkSpec:
    return cluster.intra_node if tier == "intra_node" else cluster.inter_node


def collective_s(cluster: ClusterSpec, collective: str, group: int, buffer_bytes: float,
                 tier: str) -> float:
    """Seconds for one collective over `group` ranks on a buffer of `buffer_bytes`."""
    if group <= 1 or buffer_bytes <= 0:
        return 0.0
    fit = cluster.fit(collective, group) if cluster.collectives else None
    if fit is not None:
        return fit.time_s(buffer_bytes)
    link = _link(cluster, tier)
    bw_bytes_s = link.effective_gbps(collective) * 1e9
    if collective == "send_recv":
        return link.latency_s + buffer_bytes / bw_bytes_s
    factor, steps = _RING[collective]
    return steps * (group - 1) * link.latency_s + factor * (group - 1) / group * buffer_bytes / bw_bytes_s


def all_reduce_s(cluster, group, buffer_bytes, tier, sequence_parallel: bool = False) -> float:
    """All-reduce, or reduce-scatter + all-gather of the same buffer (sequence parallelism:
    Korthikanti et al. 2022 Sec 4.2.2 — same volume, split in two collectives)."""
    if sequence_parallel:
        return (collective_s(cluster, "reduce_scatter", group, buffer_bytes, tier)
                + collective_s(cluster, "all_gather", group, buffer_bytes, tier))
    return collective_s(cluster, "all_reduce", group, buffer_bytes, tier)


def p2p_s(cluster, buffer_bytes: float, tier: str) -> float:
    """Point-to-point send of one pipeline boundary tensor."""
    if buffer_bytes <= 0:
        return 0.0
    fit = cluster.fit("send_recv", 2) if cluster.collectives else None
    if fit is not None:
        return fit.time_s(buffer_bytes)
    return collective_s(cluster, "send_recv", 2, buffer_bytes, tier)
