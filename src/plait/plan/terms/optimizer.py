"""The optimizer step: Adam's HBM traffic over the local (ZeRO-sharded) parameters, or on the host
with ``opt_offload`` (its Adam rate, and the gradients out and parameters back over the link). Seconds."""

from __future__ import annotations

from plait.plan.memory import zero_shard_degree
from plait.plan.moe.memory import stage_expert_params
from plait.plan.params import CostParams
from plait.spec.hardware import ClusterSpec
from plait.spec.layout import Layout
from plait.spec.model import ModelSpec
from plait.spec.moe.layout import expert_data_parallel


def optimizer_step(model: ModelSpec, cluster: ClusterSpec, lay: Layout, local_params: float, layers: int,
                   params: CostParams, runtime: str = "megatron") -> tuple[float, float]:
    """(optimizer seconds, host-link seconds of an offloaded optimizer) per step."""
    gpu = cluster.gpu
    d = zero_shard_degree(lay)
    opt_params = local_params / d if lay.zero >= 1 else local_params
    if model.moe is not None:
        experts = stage_expert_params(model, lay, layers)
        opt_params += experts / expert_data_parallel(lay, runtime) if lay.zero >= 1 else experts
    if lay.opt_offload:
        return (opt_params / params.cpu_adam_params_per_s,
                opt_params * (params.grad_reduce_bytes + 2.0) / cluster.host_link_bandwidth)
    return opt_params * params.optimizer_bytes_per_param / (gpu.hbm_bandwidth * gpu.memory_efficiency), 0.0
