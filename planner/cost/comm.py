"""Collective communication times: measured alpha-beta fits when the cluster has them, else the
link tiers (bandwidth x per-collective efficiency) with ring algorithms.

Ring volumes per rank for a buffer of B bytes over g ranks (Thakur et al. 2005; Narayanan et al.
2021 Sec 3.3): all-reduce `2(g-1)/g B` in 2(g-1) steps, all-gather / reduce-scatter `(g-1)/g B`
in g-1 steps, send/recv B in one step, a gather (fan-in: g-1 senders of B each to one root at
once) (g-1) B through the root's link. Measured fits (meshplan profile-links) give
time = latency + B / algbw for the full buffer B (a gather's: each sender's message), which
already includes the algorithm.

A group that spans nodes with k of its ranks on each node crosses the network on k NICs at once:
NCCL lays one ring (channel) per NIC, so each carries 1/k of the ring volume over the network
and the rest over NVLink — per-rank bandwidth min(k x NIC, NVLink). On 2 x p5 (16 H100, 400 GB/s
of EFA per node) nccl-tests all-reduce reaches 487 GB/s bus bandwidth at 16 GiB, ten times one
50 GB/s NIC (a published nccl-tests run; tests/test_cost_model.py). With k = 1 (a group one rank per node, e.g.
data parallel across t = 8 tensor-parallel ranks) every rank uses its own NIC.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from meshplan.cluster import ClusterSpec, LinkSpec

_RING = {"all_reduce": (2.0, 2), "all_gather": (1.0, 1), "reduce_scatter": (1.0, 1), "all_to_all": (1.0, 1)}


class Tier(str):
    """A link tier name ("intra_node" / "inter_node") that also carries how many of the group's
    ranks share a node (`ranks_per_node`, 1 for a bare tier string)."""

    ranks_per_node: int = 1

    def __new__(cls, name: str, ranks_per_node: int = 1):
        tier = super().__new__(cls, name)
        tier.ranks_per_node = max(1, ranks_per_node)
        return tier


def group_tier(cluster: ClusterSpec, stride: int, size: int) -> Tier:
    """ "intra_node" when a group of `size` ranks, `stride` apart, lies inside one node; else
    "inter_node" with the number of its ranks on each node."""
    per_node = cluster.devices_per_node
    if stride * size <= per_node:
        return Tier("intra_node", size)
    return Tier("inter_node", min(size, per_node // stride) if stride < per_node else 1)


def _bandwidth_bytes_s(cluster: ClusterSpec, collective: str, tier: str) -> float:
    """Per-rank bandwidth of a collective on this tier: NVLink inside a node; across nodes the
    NICs of the group's ranks on a node together, capped by NVLink (module docstring). A pipeline
    send/recv is one pair of ranks on one NIC."""
    if tier == "intra_node":
        return cluster.intra_node.effective_gbps(collective) * 1e9
    nic = cluster.inter_node.effective_gbps(collective) * 1e9
    k = 1 if collective in ("send_recv", "gather") else getattr(tier, "ranks_per_node", 1)
    return min(k * nic, cluster.intra_node.effective_gbps(collective) * 1e9) if k > 1 else nic


def _link(cluster: ClusterSpec, tier: str) -> LinkSpec:
    return cluster.intra_node if tier == "intra_node" else cluster.inter_node


def ring_latency_s(cluster: ClusterSpec, collective: str, group: int, tier: str) -> float:
    """The latency term of one ring collective: a chunk's way round the ring sums the latency of
    each hop it takes, and of a ring over `group` ranks with k on each node only the hops between
    nodes cross the network, the rest are NVLink hops (NCCL's own model, src/graph/tuning.cc:
    latency = (nsteps - nInterSteps) x intra + nInterSteps x inter, nInterSteps = nNodes - 1 for
    all-gather / reduce-scatter, twice that for all-reduce). A group inside one node: all NVLink."""
    if group <= 1 or collective in ("send_recv", "gather"):
        return _link(cluster, tier).latency_s if group > 1 else 0.0
    _, steps = _RING[collective]
    hops = steps * (group - 1)
    if tier == "intra_node":
        return hops * cluster.intra_node.latency_s
    nodes = -(-group // getattr(tier, "ranks_per_node", 1))
    inter = min(steps * (nodes - 1), hops)
    return inter * cluster.inter_node.latency_s + (hops - inter) * cluster.intra_node.latency_s


_COEFFICIENTS: ContextVar[dict | None] = ContextVar("collective_coefficients", default=None)
"""Inside collectives_memoized(): {(cluster id, collective, group, tier, ranks per node):
(cluster, coefficients)}; the cluster is held so that its id cannot be reused while it lasts."""


@contextmanager
def collectives_memoized() -> Iterator[None]:
    """Within the block, each collective's coefficients are worked out once per (cluster,
    collective, group, tier): the search prices the same few groups tens of thousands of times
    on a cluster it does not change. Outside, nothing is kept (a ClusterSpec is mutable)."""
    token = _COEFFICIENTS.set({})
    try:
        yield
    finally:
        _COEFFICIENTS.reset(token)


def _coefficients(cluster: ClusterSpec, collective: str, group: int, tier: str) -> tuple[float, float, float]:
    """(fixed seconds, scale, bytes per second): one collective on B bytes takes
    fixed + scale x B / bytes per second (a measured fit's alpha-beta, else the link tier's ring)."""
    fit = cluster.fit(collective, group) if cluster.collectives else None
    if fit is not None:
        return fit.latency_s, 1.0, fit.bandwidth_gbps * 1e9
    link = _link(cluster, tier)
    bw_bytes_s = _bandwidth_bytes_s(cluster, collective, tier)
    if collective == "send_recv":
        return link.latency_s, 1.0, bw_bytes_s
    if collective == "gather":  # group - 1 point-to-point flows at once, all through the root's link
        return link.latency_s, float(group - 1), bw_bytes_s
    factor, _ = _RING[collective]
    return ring_latency_s(cluster, collective, group, tier), factor * (group - 1) / group, bw_bytes_s


def collective_s(cluster: ClusterSpec, collective: str, group: int, buffer_bytes: float, tier: str) -> float:
    """Seconds for one collective over `group` ranks on a buffer of `buffer_bytes`."""
    if group <= 1 or buffer_bytes <= 0:
        return 0.0
    memo = _COEFFICIENTS.get()
    if memo is None:
        fixed, scale, rate = _coefficients(cluster, collective, group, tier)
    else:
        key = (id(cluster), collective, group, str(tier), getattr(tier, "ranks_per_node", 1))
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = (cluster, _coefficients(cluster, collective, group, tier))
        fixed, scale, rate = hit[1]
    return fixed + scale * buffer_bytes / rate


def collective_latency_s(cluster: ClusterSpec, collective: str, group: int, tier: str) -> float:
    """The fixed part of one more collective of the same kind (a measured fit's alpha, else the
    ring's latency): what splitting a buffer into several collectives adds per extra one."""
    if group <= 1:
        return 0.0
    fit = cluster.fit(collective, group) if cluster.collectives else None
    if fit is not None:
        return fit.latency_s
    return ring_latency_s(cluster, collective, group, tier)


def all_reduce_s(cluster, group, buffer_bytes, tier, sequence_parallel: bool = False) -> float:
    """All-reduce, or reduce-scatter + all-gather of the same buffer (sequence parallelism:
    Korthikanti et al. 2022 Sec 4.2.2 — same volume, split in two collectives)."""
    if sequence_parallel:
        return collective_s(cluster, "reduce_scatter", group, buffer_bytes, tier) + collective_s(
            cluster, "all_gather", group, buffer_bytes, tier
        )
    return collective_s(cluster, "all_reduce", group, buffer_bytes, tier)


def p2p_s(cluster, buffer_bytes: float, tier: str) -> float:
    """Point-to-point send of one pipeline boundary tensor."""
    if buffer_bytes <= 0:
        return 0.0
    fit = cluster.fit("send_recv", 2) if cluster.collectives else None
    if fit is not None:
        return fit.time_s(buffer_bytes)
    return collective_s(cluster, "send_recv", 2, buffer_bytes, tier)
