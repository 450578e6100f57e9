"""Collectives per algorithm and topology: bytes per link, then time. Seconds, bytes, bytes/s.

``nbytes`` (S) is always the size of the full (unsharded) buffer; n ranks, r of them per node on
N nodes. For every algorithm ``traffic`` gives the bytes ONE GPU sends (and receives) over NVLink
and over its NIC, and the sequential steps on each level; ``time_of`` charges them at each level's
bus bandwidth plus one latency per step:

  level     bus bandwidth (per GPU, per direction)
  NVLink    ``intra_node_bandwidth`` · ``link_efficiency``
  network   the GPU's NIC share, ``inter_node_bandwidth / gpus_per_nic`` · ``link_efficiency``
            (never the node's other NICs: they carry the other GPUs' bytes)

Each op may reach its own bus bandwidth: ``ClusterSpec.<op>_bandwidth_factor`` scales the link's
for all-gather, reduce-scatter, all-to-all and send/recv (1.0 on every preset; a profile of gloo
on a CPU measures reduce-scatter far slower than all-reduce).

"Bus bandwidth" is nccl-tests' definition (NVIDIA/nccl-tests doc/PERFORMANCE.md): the link
speed a rank needs to reach the measured time, busbw = S/t · 2(n-1)/n for all-reduce and
S/t · (n-1)/n for all-gather and reduce-scatter - so that one bus bandwidth describes a link for
every n. The per-GPU bytes of each algorithm:

  ring (flat, all n ranks in one ring; all-gather and reduce-scatter: p = 1, all-reduce: p = 2):
      each GPU sends p·(n-1)/n·S on p·(n-1) steps. Inside a node all of it goes over NVLink.
      Across nodes NCCL runs one ring channel per NIC, each leaving the node through a
      different GPU's NIC, so a GPU's own NIC share carries 1/r of its ring bytes and NVLink the
      rest, both at once (the slower level sets the pace). With one rank per node (r = 1, e.g.
      tp = 8) every byte crosses that GPU's NIC share.
  tree (all-reduce; NCCL's intra-node chain + inter-node double binary tree): 2·S over NVLink
      on 2·(r-1) steps, 2·S/r over the NIC (the node's r channels use its r GPUs' NICs) on
      2·ceil(log2 N) steps.
  two_level (rail-aligned hierarchical: reduce-scatter inside the node, the ring across nodes
      among the GPUs of one local rank - one rail - on S/r, all-gather inside the node):
      p·(r-1)/r·S over NVLink, p·(N-1)/N·S/r over the NIC. It moves r times fewer bytes over
      the network than the flat ring: what hierarchical schemes (HSDP's shard-inside-a-node,
      ZeRO++'s secondary partition, 2-level all-gathers) earn - fewer bytes, same bandwidth.

NCCL's choice (its tuner predicts each algorithm's time from the size, the rank count and the
topology, and takes the fastest): all-reduce runs ring or tree - tree for small and medium
sizes at scale (log N latency against the ring's n), ring for large buffers on few nodes - and
plait takes the faster of the two (``all_reduce``). All-gather and reduce-scatter have only the
ring on InfiniBand/RoCE (NVLS/CollNet need SHARP switches; PAT, NCCL 2.23+, only serves one GPU
per node), so ZeRO/FSDP collectives across nodes are flat rings (``all_gather``,
``reduce_scatter``) whose latency grows with n; ``two_level`` is the hierarchical variant.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from plait.spec.hardware import OP_BANDWIDTH_FACTORS, ClusterSpec
from plait.spec.layout import GroupPlacement

ALGORITHMS = ("ring", "tree", "two_level")


@dataclass(frozen=True)
class Traffic:
    """What one GPU sends (and receives) in one collective, per link."""

    nvlink_bytes: float = 0.0
    nic_bytes: float = 0.0
    nvlink_steps: int = 0
    nic_steps: int = 0
    concurrent: bool = False  # both levels run at once (a ring: its slowest level sets the pace)


def nvlink_bandwidth(cluster: ClusterSpec) -> float:
    """Bus bandwidth of the intra-node level, bytes/s per GPU."""
    return cluster.intra_node_bandwidth * cluster.link_efficiency


def nic_bandwidth(cluster: ClusterSpec) -> float:
    """Bus bandwidth of the inter-node level: the GPU's own NIC share, bytes/s."""
    return cluster.nic_share * cluster.link_efficiency


def bus_bandwidth(cluster: ClusterSpec, group: GroupPlacement) -> float:
    """Bus bandwidth of a flat ring over ``group`` (its slowest level), bytes/s."""
    return nic_bandwidth(cluster) if group.spans_nodes else nvlink_bandwidth(cluster)


def traffic(algorithm: str, group: GroupPlacement, nbytes: float, passes: int = 1) -> Traffic:
    """Per-GPU bytes and steps of ``algorithm`` over ``group`` (``passes``: 1 all-gather or
    reduce-scatter, 2 all-reduce; the tree is an all-reduce only)."""
    n, r, nodes = group.size, group.ranks_per_node, group.nodes
    if n <= 1 or nbytes <= 0:
        return Traffic()
    sent, steps = passes * (n - 1) / n * nbytes, passes * (n - 1)
    if not group.spans_nodes:
        return Traffic(sent, 0.0, steps, 0)
    if algorithm == "ring":
        return Traffic(sent * (r - 1) / r, sent / r, 0, steps, concurrent=True)
    if algorithm == "tree":
        return Traffic(2.0 * nbytes if r > 1 else 0.0, 2.0 * nbytes / r, 2 * (r - 1),
                       2 * math.ceil(math.log2(nodes)))
    if algorithm == "two_level":
        return Traffic(passes * (r - 1) / r * nbytes, passes * (nodes - 1) / nodes * nbytes / r,
                       passes * (r - 1), passes * (nodes - 1))
    raise ValueError(f"unknown collective algorithm {algorithm!r}; known: {', '.join(ALGORITHMS)}")


def op_factor(cluster: ClusterSpec, op: str) -> float:
    """The bus bandwidth ``op`` reaches as a multiple of the all-reduce's (1.0 for the all-reduce)."""
    return getattr(cluster, OP_BANDWIDTH_FACTORS[op]) if op in OP_BANDWIDTH_FACTORS else 1.0


def time_of(cluster: ClusterSpec, moved: Traffic, op: str = "all_reduce") -> float:
    """Seconds for ``moved``: each level's bytes at its bus bandwidth (scaled for ``op``,
    ``op_factor``) plus one latency per step."""
    seconds = moved.nvlink_steps * cluster.intra_node_latency + moved.nic_steps * cluster.inter_node_latency
    factor = op_factor(cluster, op)
    nvlink = moved.nvlink_bytes / (nvlink_bandwidth(cluster) * factor) if moved.nvlink_bytes else 0.0
    nic = moved.nic_bytes / (nic_bandwidth(cluster) * factor) if moved.nic_bytes else 0.0
    return seconds + (max(nvlink, nic) if moved.concurrent else nvlink + nic)


def all_reduce(cluster: ClusterSpec, group: GroupPlacement, nbytes: float) -> float:
    """All-reduce of ``nbytes``: the faster of NCCL's ring and tree."""
    ring = time_of(cluster, traffic("ring", group, nbytes, passes=2))
    if not group.spans_nodes:
        return ring
    return min(ring, time_of(cluster, traffic("tree", group, nbytes, passes=2)))


def all_gather(cluster: ClusterSpec, group: GroupPlacement, nbytes: float) -> float:
    """Gather ``nbytes`` in total (each rank contributes nbytes / n): NCCL's ring."""
    return time_of(cluster, traffic("ring", group, nbytes), "all_gather")


def reduce_scatter(cluster: ClusterSpec, group: GroupPlacement, nbytes: float) -> float:
    """Reduce-scatter of ``nbytes``: the same ring, bytes and steps as the all-gather of the result."""
    return time_of(cluster, traffic("ring", group, nbytes), "reduce_scatter")


def two_level(cluster: ClusterSpec, group: GroupPlacement, nbytes: float, passes: int = 1) -> float:
    """A rail-aligned hierarchical all-gather / reduce-scatter (passes=1) or all-reduce (2)."""
    return time_of(cluster, traffic("two_level", group, nbytes, passes))


def all_to_all(cluster: ClusterSpec, group: GroupPlacement, nbytes: float) -> float:
    """Each rank sends (n-1)/n of its ``nbytes`` buffer: (r-1)/n of it over NVLink, the rest
    (to the other nodes) over its NIC share, all destinations at once (one step per level)."""
    n, r = group.size, group.ranks_per_node
    if n <= 1 or nbytes <= 0:
        return 0.0
    return time_of(cluster, Traffic((r - 1) / n * nbytes, (n - r) / n * nbytes,
                                    1 if r > 1 else 0, 1 if group.spans_nodes else 0), "all_to_all")


def all_to_all_hierarchical(cluster: ClusterSpec, group: GroupPlacement, nbytes: float,
                            nic_bytes: float) -> float:
    """HetuMoE's (and DeepEP's) two-level all-to-all of a rank's ``nbytes`` buffer: what goes to
    another node crosses the network once per destination node, rail-aligned (to the GPU of the
    same local rank there), and is fanned out over NVLink inside the node; ``nic_bytes`` is what
    this rank sends over its NIC share after that aggregation (at most the flat all-to-all's
    (n-r)/n · nbytes). NVLink carries (r-1)/r of the buffer (the intra-node exchange and the
    fan-out); both levels run at once (pipelined), one latency each. Inside one node it is the
    flat all-to-all."""
    n, r = group.size, group.ranks_per_node
    if n <= 1 or nbytes <= 0:
        return 0.0
    if not group.spans_nodes:
        return all_to_all(cluster, group, nbytes)
    nic = min(nic_bytes, (n - r) / n * nbytes)
    return time_of(cluster, Traffic((r - 1) / r * nbytes, nic, 1 if r > 1 else 0, 1, concurrent=True), "all_to_all")


def send_recv(cluster: ClusterSpec, crosses_nodes: bool, nbytes: float) -> float:
    """Point-to-point transfer between neighbouring pipeline stages (over the NIC share when
    they are on different nodes)."""
    if nbytes <= 0:
        return 0.0
    factor = op_factor(cluster, "send_recv")
    if crosses_nodes:
        return nbytes / (nic_bandwidth(cluster) * factor) + cluster.inter_node_latency
    return nbytes / (nvlink_bandwidth(cluster) * factor) + cluster.intra_node_latency
