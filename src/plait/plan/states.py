"""Model states of ZeRO-sharded parameters, as one function for dense and expert parameters.

In the compute dtype of ``element_bytes`` per element (``GpuSpec.element_bytes``): weights and
gradients ``element_bytes`` each per parameter; the fp32 Adam state m and v (8 bytes), and an fp32
master copy of the weights (4 bytes) when the compute dtype is narrower than fp32. With bf16 (2,
every GPU preset) that is the ZeRO paper's 2 + 2 + 12 bytes; with fp32 (4, plait's runtime on a
CPU: fp32 parameters, no mixed precision) 4 + 4 + 8: the weights are their own master copy."""

from __future__ import annotations

from plait.spec.layout import Layout

FP32 = 4  # bytes per element of the Adam state and the master weights


def zero3_buffer_params(layer: float, largest: float = 0.0, live_cap: float = 0.0, bucket: float = 0.0) -> float:
    """Unsharded parameters and gradients (elements) that ZeRO-3 holds at once on a rank.

    ``live_cap`` 0 (FSDP, one unit per transformer block): two gathered layers of ``layer``
    parameters (the one computing, the one prefetched) and one layer's unsharded gradients before
    its reduce-scatter: 3·layer.
    ``live_cap`` > 0 (DeepSpeed's ZeRO-3: ``stage3_max_live_parameters``): parameters are gathered
    submodule by submodule (one GEMM weight at a time) and prefetches only while fewer than
    ``live_cap`` parameters are gathered, one whole parameter at least: at most
    min(live_cap, 2·layer) + ``largest`` are live, ``largest`` being the biggest submodule's
    (fetched whole, also past the cap); gradients are reduced and partitioned in
    buckets of ``bucket`` elements (``reduce_bucket_size``), one full-size parameter gradient at a
    time beyond it: at most ``bucket`` + ``largest`` (DeepSpeed v0.3.16
    deepspeed/runtime/zero/stage3.py: ``prefetch_next_sub_modules``,
    ``reduce_independent_p_g_buckets_and_remove_grads``)."""
    if live_cap <= 0:
        return 3 * layer
    return min(live_cap, 2 * layer) + largest + bucket + largest


def sharded_states(params: float, layout: Layout, degree: int, gathered_layer_params: float,
                   element_bytes: float = 2.0, largest: float = 0.0, live_cap: float = 0.0,
                   bucket: float = 0.0) -> tuple[float, float, float, float, float]:
    """(weights, gradients, optimizer, ZeRO-3 buffers, host) bytes on one rank for ``params`` local
    parameters sharded over ``degree`` ranks by ``layout.zero`` (1: optimizer, 2: + gradients,
    3: + weights). ZeRO-3 holds the unsharded parameters and gradients of ``zero3_buffer_params``
    (layers of ``gathered_layer_params`` parameters; ``largest``, ``live_cap``, ``bucket``: as there),
    in the compute dtype; ``opt_offload`` moves the optimizer bytes to the host.
    ``element_bytes``: bytes per element of the compute dtype (module docstring)."""
    e = element_bytes
    master = FP32 if e < FP32 else 0.0
    weights, grads, optim, buffers = e * params, e * params, (master + 2 * FP32) * params, 0.0
    if layout.zero >= 1:
        optim /= degree
    if layout.zero >= 2:
        grads /= degree
    if layout.zero >= 3:
        weights /= degree
        buffers = e * zero3_buffer_params(gathered_layer_params, largest, live_cap, bucket)
    host = 0.0
    if layout.opt_offload:
        host, optim = optim, 0.0
    return weights, grads, optim, buffers, host


def ddp_accumulation_bytes(params: float, layout: Layout, micro_batches: int, element_bytes: float = 2.0) -> float:
    """Bytes of the second gradient copy of plait's DDP (``plait.run.parallel.data``: zero=0 over
    dp·cp > 1 ranks without tp, pp or ep) in a step of several micro-batches, counted where the
    states are priced as the runtime allocates them (``element_bytes >= 4``; with bf16 the
    accounting is ZeRO's, and ``comm_buffer_bytes`` stands for DDP's buckets). The micro-batches
    before the last run under ``no_sync`` and accumulate ordinary gradients, while DDP's flat
    gradient buckets (the gradients of the last micro-batch, ``gradient_as_bucket_view``) stay
    allocated: two copies until the last micro-batch's gradients land in the buckets.
    ``params``: the rank's parameters."""
    ddp = (layout.zero == 0 and layout.dp * layout.cp > 1 and layout.tp == 1 and layout.pp == 1
           and layout.ep == 1)
    if element_bytes < FP32 or not ddp or micro_batches <= 1:
        return 0.0
    return element_bytes * params


def gradients_at_peak(grads: float, layout: Layout, micro_batches: int, element_bytes: float,
                      dynamic: float) -> float:
    """Gradient bytes alive at the activation peak, where the states are priced as the runtime
    allocates them (``element_bytes >= 4``; with bf16: ``grads``, ZeRO's accounting). The runtime
    frees the gradients after every step (``zero_grad(set_to_none=True)``); with one micro-batch
    per step, no pipelining and no data-parallel gradient sync (no DDP buckets, no FSDP shards:
    dp·cp = 1, zero=0) none is alive when the backward starts, where the ``dynamic`` bytes
    (activations, logits) peak; the backward makes them as it frees activations, so only what
    exceeds the activations counts. With several micro-batches the earlier ones' gradients are
    alive during the last one's forward and backward: all of them."""
    alone = (micro_batches == 1 and layout.pp == 1 and layout.zero == 0 and layout.dp * layout.cp == 1
             and layout.ep == 1)
    if element_bytes < FP32 or not alone:
        return grads
    return max(0.0, grads - dynamic)
