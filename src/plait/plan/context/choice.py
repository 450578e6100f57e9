"""Which context-parallel kernel a searched layout gets: the one the planner prices fastest. No torch."""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from plait.plan.context.exchange import cp_exchange
from plait.plan.kernels import layer_times
from plait.plan.moe.timing import moe_layer_times
from plait.plan.params import CostParams
from plait.spec.hardware import ClusterSpec
from plait.spec.layout import RUNTIME_CP_IMPLS, GroupPlacement, JobSpec, Layout, group_of
from plait.spec.model import ModelSpec
from plait.spec.moe.parts import is_extended
from plait.spec.validate import ulysses_splits_heads


def fastest_cp_impl(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, lay: Layout, params: CostParams,
                    impls: tuple[str, ...] = RUNTIME_CP_IMPLS) -> str:
    """The ``cp_impl`` of ``impls`` (the kernels the software has: plait's runtime's by default; those
    ``lay`` can run: ``ulysses`` where cp divides the rank's K/V heads)
    whose attention (recomputed under ckpt=full or selective) and exchange take least time per
    layer and micro-batch: the only step-time terms the kernel moves, and memory does not tell
    the kernels apart (``plait.plan.context.exchange``), so the search tries this one rather than all four."""
    group = group_of(lay, cluster.gpus_per_node, ("cp",))
    recomputed = lay.ckpt in ("full", "selective")
    options = model.sliding_window or model.attn_scale or model.attn_softcap or model.sinks or model.mla
    if job.doc_len or options:  # masks and score options (MLA's scale): PyTorch's ring takes none (runtime-doc-mask-cp-torch,
        impls = tuple(impl for impl in impls if impl != "torch") or impls  # runtime-cp-attention-options)
    if is_extended(model):  # experts, MLA: their own layer times, which read more of the layout
        return _fastest(model, cluster, job.seq_len, params, lay, group, recomputed, impls)
    kernel_keys = Layout(tp=lay.tp, cp=lay.cp, mbs=lay.mbs, sp=lay.sp, attn=lay.attn, precision=lay.precision,
                         norm=lay.norm)  # what the dense layer's attention and exchange read
    return _fastest(model, cluster, job.seq_len, params, kernel_keys, group, recomputed, impls, job.doc_len)


@lru_cache(maxsize=4096)
def _fastest(model: ModelSpec, cluster: ClusterSpec, seq_len: int, params: CostParams, lay: Layout,
             group: GroupPlacement, recomputed: bool, impls: tuple[str, ...], doc_len: int = 0) -> str:
    tokens = seq_len / lay.cp * lay.mbs

    def seconds(impl: str) -> float:
        candidate = replace(lay, cp_impl=impl)
        if is_extended(model):
            times = moe_layer_times(model, cluster.gpu, params, candidate, tokens, seq_len)
        else:
            times = layer_times(model, cluster.gpu, params, tokens, seq_len, lay.tp, lay.cp, lay.sequence_parallel,
                                lay.attn, lay.precision, lay.norm, "torch", impl, doc_len)
        return (times.attn_fwd * (2.0 if recomputed else 1.0) + times.attn_bwd
                + sum(cp_exchange(model, cluster, group, candidate, tokens, times.attn_fwd, times.attn_bwd, params)))

    usable = [impl for impl in impls if impl != "ulysses" or ulysses_splits_heads(model, lay)]
    return min(usable, key=seconds)
