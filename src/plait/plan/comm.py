"""Hierarchical alpha-beta model of NCCL-style collectives. Times in seconds, sizes in bytes.

A group that fits inside a node runs at NVLink speed. A group that spans nodes is bounded by
the network: each node's part of the group drives its GPUs' NICs in parallel (NCCL uses one
ring or tree channel per NIC), so its bus bandwidth is min(NVLink, ranks-per-node · NIC).
Latency: a ring collective takes n-1 steps (2(n-1) for all-reduce), and every step waits for
its slowest hop: the network latency once the group spans nodes, else the NVLink latency. ``nbytes`` is always the size of the full (unsharded) buffer.
"""

from __future__ import annotations

from plait.spec.hardware import ClusterSpec
from plait.spec.layout import GroupPlacement


def bus_bandwidth(cluster: ClusterSpec, group: GroupPlacement) -> float:
    """Achievable bus bandwidth of a collective over ``group``, bytes/s."""
    intra = cluster.intra_node_bandwidth * cluster.link_efficiency
    if not group.spans_nodes:
        return intra
    return min(intra, group.ranks_per_node * cluster.inter_node_bandwidth * cluster.link_efficiency)


def _step_latency(cluster: ClusterSpec, group: GroupPlacement) -> float:
    return cluster.inter_node_latency if group.spans_nodes else cluster.intra_node_latency


def all_reduce(cluster: ClusterSpec, group: GroupPlacement, nbytes: float) -> float:
    n = group.size
    if n <= 1 or nbytes <= 0:
        return 0.0
    return 2 * (n - 1) * (nbytes / n / bus_bandwidth(cluster, group) + _step_latency(cluster, group))


def all_gather(cluster: ClusterSpec, group: GroupPlacement, nbytes: float) -> float:
    """Gather ``nbytes`` in total (each rank contributes nbytes / n)."""
    n = group.size
    if n <= 1 or nbytes <= 0:
        return 0.0
    return (n - 1) * (nbytes / n / bus_bandwidth(cluster, group) + _step_latency(cluster, group))


reduce_scatter = all_gather  # same traffic and steps as the all-gather of the result
all_to_all = all_gather  # each rank sends (n-1)/n of its buffer


def send_recv(cluster: ClusterSpec, crosses_nodes: bool, nbytes: float) -> float:
    """Point-to-point transfer between neighbouring pipeline stages."""
    if nbytes <= 0:
        return 0.0
    if crosses_nodes:
        return nbytes / (cluster.inter_node_bandwidth * cluster.link_efficiency) + cluster.inter_node_latency
    return nbytes / (cluster.intra_node_bandwidth * cluster.link_efficiency) + cluster.intra_node_latency
