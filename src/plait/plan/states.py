"""Model states of ZeRO-sharded parameters: bf16 weights, bf16 gradients and the fp32 Adam state
(master copy, m, v: 12 bytes per parameter), as one function for dense and expert parameters."""

from __future__ import annotations

from plait.spec.layout import Layout


def sharded_states(params: float, layout: Layout, degree: int,
                   gathered_layer_params: float) -> tuple[float, float, float, float, float]:
    """(weights, gradients, optimizer, ZeRO-3 buffers, host) bytes on one rank for ``params`` local
    parameters sharded over ``degree`` ranks by ``layout.zero`` (1: optimizer, 2: + gradients,
    3: + weights). ZeRO-3 holds two gathered layers of ``gathered_layer_params`` parameters and one
    unsharded gradient; ``opt_offload`` moves the optimizer bytes to the host."""
    weights, grads, optim, buffers = 2.0 * params, 2.0 * params, 12.0 * params, 0.0
    if layout.zero >= 1:
        optim /= degree
    if layout.zero >= 2:
        grads /= degree
    if layout.zero >= 3:
        weights /= degree
        buffers = 2 * 2.0 * gathered_layer_params + 2.0 * gathered_layer_params
    host = 0.0
    if layout.opt_offload:
        host, optim = optim, 0.0
    return weights, grads, optim, buffers, host
