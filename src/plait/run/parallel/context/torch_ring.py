"""``cp_impl=torch``: PyTorch's own ring attention as a plait attention kernel.

PyTorch's context parallelism (``torch.distributed.tensor.experimental.context_parallel``)
shards buffers itself and reroutes ``F.scaled_dot_product_attention`` through DTensor; plait
shards the data itself (head-tail, ``plait.run.parallel.context.ring.SequenceShard``), so it calls
the ring underneath that API directly: ``_templated_ring_attention`` and its backward, with
the device's fused attention kernel on each block:

  * CUDA, bf16/fp16: FlashAttention (``_scaled_dot_product_ring_flash_attention``);
  * CUDA, fp32: memory-efficient attention (``_scaled_dot_product_ring_efficient_attention``);
  * CPU: ``aten._scaled_dot_product_flash_attention_for_cpu`` (what the CPU tests run).

Torch's load balancing (``_cp_options.enable_load_balance``, on by default) is the same
head-tail split as plait's, so the two kernels are interchangeable. K/V heads are repeated to
the query heads first (the fused kernels take equal head counts), so GQA models send
n_heads / n_kv_heads times more K/V bytes than with ``cp_impl=ring``. These are private
PyTorch functions (checked against torch 2.13; the module moved in recent releases, both
places are tried). The CUDA branches have not been run yet: no GPU was available.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

aten = torch.ops.aten


def _torch_ring():
    """PyTorch's context-parallel attention module (private; its path changed across releases)."""
    try:
        from torch.distributed.tensor.experimental._context_parallel import (
            _attention as ring,
        )
    except ImportError:
        from torch.distributed.tensor.experimental import _attention as ring
    if not ring._cp_options.enable_load_balance:
        raise RuntimeError("cp_impl=torch needs torch's head-tail load balancing "
                           "(_cp_options.enable_load_balance), which plait's data sharding assumes")
    return ring


class _TorchRingFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mesh):
        ring = _torch_ring()
        q, k, v = (t.contiguous() for t in (q, k, v))
        if q.device.type == "cuda" and q.dtype in (torch.float16, torch.bfloat16):
            ctx.kernel = "flash"
            out, lse, *rest = ring._scaled_dot_product_ring_flash_attention(mesh, q, k, v, dropout_p=0.0,
                                                                             is_causal=True)
        elif q.device.type == "cuda":
            ctx.kernel = "efficient"
            out, lse, *rest = ring._scaled_dot_product_ring_efficient_attention(
                mesh, q, k, v, attn_bias=None, compute_log_sumexp=True, dropout_p=0.0, is_causal=True)
        else:
            ctx.kernel = "cpu"
            out, lse, *rest = ring._templated_ring_attention(
                mesh.get_group(), 2, aten._scaled_dot_product_flash_attention_for_cpu.default,
                query=q, key=k, value=v, is_causal=True, dropout_p=0.0)
        ctx.mesh, ctx.rest = mesh, rest
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        ring = _torch_ring()
        q, k, v, out, lse = ctx.saved_tensors
        grad_out, mesh, rest = grad_out.contiguous(), ctx.mesh, ctx.rest
        if ctx.kernel == "flash":
            cum_q, cum_k, max_q, max_k, seed, offset = rest[:6]
            grads = ring._scaled_dot_product_ring_flash_attention_backward(
                mesh, grad_out, q, k, v, out, lse, cum_q, cum_k, max_q, max_k, 0.0, True, seed, offset)
        elif ctx.kernel == "efficient":
            seed, offset = rest[:2]
            grads = ring._scaled_dot_product_ring_efficient_attention_backward(
                mesh, grad_out, q, k, v, None, out, lse, seed, offset, 0.0, (True, True, True, False), True)
        else:
            grads = ring._templated_ring_attention_backward(
                mesh.get_group(), 2, aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
                grad_out=grad_out, grad_out_name="grad_out", query=q, key=k, value=v, out=out, logsumexp=lse,
                is_causal=True, dropout_p=0.0)
        return grads[0], grads[1], grads[2], None


@dataclass(frozen=True, eq=False)
class TorchRingAttention:
    """``Attention.kernel`` for context parallelism over the 1-D ``mesh`` by PyTorch's ring attention."""

    mesh: DeviceMesh

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float, *, window: int = 0,
                 scale: float | None = None, softcap: float = 0.0, sinks: torch.Tensor | None = None,
                 documents: torch.Tensor | None = None) -> torch.Tensor:
        if dropout_p:
            raise ValueError("context-parallel attention has no dropout")
        if window or scale is not None or softcap or sinks is not None:  # refused before launch
            raise ValueError("cp_impl=torch takes no sliding window, score scale, soft-cap or sinks "
                             "(rule runtime-cp-attention-options); use cp_impl=ring, allgather or ulysses")
        if documents is not None:  # refused before launch (rule runtime-doc-mask-cp-torch)
            raise ValueError("cp_impl=torch takes no document mask; use cp_impl=ring, allgather or ulysses")
        if k.shape[1] != q.shape[1]:  # GQA: the fused kernels want one K/V head per query head
            repeat = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        return _TorchRingFunction.apply(q, k, v, self.mesh)

    @property
    def group(self) -> dist.ProcessGroup:
        return self.mesh.get_group()
