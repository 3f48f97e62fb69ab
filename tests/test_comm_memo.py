"""The search's collective memo (planner/cost/comm.collectives_memoized) prices every collective as
the unmemoised formula does, keeps groups with different NICs per node apart, and keeps nothing
once its block ends (a ClusterSpec is mutable)."""

from __future__ import annotations

import dataclasses

from meshplan.cluster import CollectiveFit
from meshplan.planner.cost.comm import Tier, collective_s, collectives_memoized
from meshplan.presets import cluster_preset

CASES = [
    (collective, group, tier, size)
    for collective in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv", "gather")
    for group, tier in ((8, Tier("intra_node", 8)), (64, Tier("inter_node", 8)), (64, Tier("inter_node", 1)))
    for size in (1e3, 3.3e8)
]


def test_memoised_collectives_equal_the_formula_exactly():
    cluster = cluster_preset("a100-80g", 1024)
    plain = [collective_s(cluster, c, g, b, t) for c, g, t, b in CASES]
    with collectives_memoized():
        memo = [collective_s(cluster, c, g, b, t) for c, g, t, b in CASES]
        again = [collective_s(cluster, c, g, b, t) for c, g, t, b in CASES]
    assert memo == plain == again


def test_nics_per_node_are_part_of_the_key():
    cluster = cluster_preset("a100-80g", 1024)
    with collectives_memoized():
        eight = collective_s(cluster, "all_reduce", 64, 1e9, Tier("inter_node", 8))
        one = collective_s(cluster, "all_reduce", 64, 1e9, Tier("inter_node", 1))
    assert one > 4 * eight  # one NIC per rank against eight rings over a node's NICs


def test_each_cluster_and_each_block_prices_afresh():
    cluster = cluster_preset("a100-80g", 64)
    slow = dataclasses.replace(cluster, inter_node=dataclasses.replace(cluster.inter_node, bandwidth_gbps=1.0))
    tier = Tier("inter_node", 1)
    with collectives_memoized():
        fast_s = collective_s(cluster, "all_gather", 16, 1e9, tier)
        slow_s = collective_s(slow, "all_gather", 16, 1e9, tier)
    assert slow_s > 10 * fast_s
    cluster.collectives = [
        CollectiveFit(collective="all_gather", group_size=16, tier="inter_node", latency_s=1.0, bandwidth_gbps=1.0)
    ]
    with collectives_memoized():  # a fresh block sees the fit added since
        assert collective_s(cluster, "all_gather", 16, 1e9, tier) == 2.0
