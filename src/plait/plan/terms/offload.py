"""Activation offload traffic over the host link, per micro-batch of the first stage (it offloads the
most): out during the forward, back during the backward, each hidden behind that pass's compute. Seconds."""

from __future__ import annotations

from plait.plan.activations import stage_layer_bytes
from plait.plan.terms.overlap import exposed
from plait.plan.kernels import LayerTimes
from plait.plan.params import CostParams
from plait.spec.hardware import ClusterSpec
from plait.spec.layout import Layout
from plait.spec.model import ModelSpec


def offload_microbatch(model: ModelSpec, cluster: ClusterSpec, lay: Layout, seq_len: int, layers: int,
                       times: LayerTimes, params: CostParams, runtime: str = "torch") -> float:
    """Exposed seconds per micro-batch; 0 without offload. To disk: through host memory at the
    lower of the host link and ``disk_bandwidth``. ``runtime``: whose saved tensors move (the memory
    model's, ``plait.plan.activations``)."""
    if lay.offload <= 0:
        return 0.0
    bandwidth = cluster.host_link_bandwidth
    if lay.offload_target == "disk":
        bandwidth = min(bandwidth, params.disk_bandwidth)
    moved = sum(stage_layer_bytes(model, lay, seq_len, layers, 0, runtime=runtime,
                                  element_bytes=cluster.gpu.element_bytes)[1])
    transfer = moved / bandwidth
    return (exposed(transfer, layers * times.fwd, params, params.offload_overlap)
            + exposed(transfer, layers * times.bwd, params, params.offload_overlap))
