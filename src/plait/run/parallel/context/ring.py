"""Context parallelism: each sequence split over the ``cp`` ranks, attention exact across them.

Load balancing (head-tail, "zig-zag"). A sequence of ``seq`` tokens is cut into 2·cp chunks of
seq / (2·cp) tokens; cp rank r holds chunks r and 2·cp-1-r, in that order. Under a causal mask
the early chunks attend to little and the late ones to much, so every rank gets the same
attention work. ``SequenceShard`` maps a full sequence to a rank's tokens (the data path:
inputs and labels alike) and gives their global positions (RoPE angles, learned positions).

Attention kernels (``Attention.kernel``, called as ``kernel(q, k, v, dropout_p)`` on the rank's
(batch, heads, local seq, head_dim) tensors; K/V may have fewer heads, GQA):

  * ``RingAttention``: the K/V chunks travel around the cp ring (point-to-point send/recv,
    overlapped with the attention of the chunk in hand); partial results are merged with the
    online softmax (log-sum-exp). Its own backward sends K/V around the ring again, with their
    gradient accumulators one hop behind, so each dK/dV returns to its owner after cp hops.
    Activation memory per rank: O(seq / cp); traffic per layer: (cp-1)/cp of the K/V forward,
    twice that backward.
  * ``AllGatherAttention`` (``plait.run.parallel.context.allgather``): all-gather K/V over the cp
    group, mask by global positions, and reduce-scatter dK/dV in the backward. Simpler; holds
    the whole sequence's K/V.
  * ``TorchRingAttention`` (``plait.run.parallel.context.torch_ring``): PyTorch's own ring attention
    with fused (Flash) kernels per block; the one to use on GPU.
  * ``UlyssesAttention`` (``plait.run.parallel.context.ulysses``): all-to-all from sequence- to
    head-sharded and back around the device's SDPA; needs cp to divide the K/V heads.

The first two run on gloo (CPU) and NCCL and compute in fp32 with the (seq/cp × seq/cp) scores
materialized per block (``plait.run.parallel.context.ops``): exact and portable, not fast.
``Layout.cp_impl`` (ring | allgather | torch | ulysses) picks one. No attention dropout
(``plait.run.config`` refuses cp with dropout models).

Attention options (the layer kernels' keywords, ``plait.run.modules.layers``): ring, all-gather
and Ulysses take them all: ``window`` (sliding window), ``scale``, ``softcap`` and ``sinks`` (one
logit per local query head) and ``documents`` (``plait train --doc-mask``: the document ids of the
whole rows (batch, seq) in position order, which every cp rank holds). Each block's mask (window,
same document, on top of the causal mask) is taken at the global positions of the block's
queries and keys (``plait.run.parallel.context.masks``), so no mask travels; the ring skips the
blocks the mask hides whole (with a window, every block more than W positions behind a query
chunk), forward and backward, and still passes their K/V on. Soft-capping caps each block's
scores (``ops``); the sinks are one more term of the online-softmax merge, with their gradient
from the final log-sum-exp. ``cp_impl=torch`` takes none of them (rules
``runtime-cp-attention-options``, ``runtime-doc-mask-cp-torch``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from plait.run.parallel.context.allgather import AllGatherAttention
from plait.run.parallel.context.masks import SKIP, BlockMasks
from plait.run.parallel.context.ops import add_sink, block_backward, block_forward, merge_partials, sink_grad
from plait.run.parallel.context.shard import SequenceShard, sequence_shard_of


# ------------------------------------------------------------------------------------ ring
def _ring_exchange(send: torch.Tensor, group: dist.ProcessGroup) -> tuple[torch.Tensor, list]:
    """Start sending ``send`` to the next cp rank and receiving the previous rank's; (buffer, works)."""
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    following = dist.get_global_rank(group, (rank + 1) % size)
    preceding = dist.get_global_rank(group, (rank - 1) % size)
    send = send.contiguous()
    received = torch.empty_like(send)  # contiguous, as send is: empty_like keeps strides, c10d writes as if contiguous
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, send, following, group),
                                    dist.P2POp(dist.irecv, received, preceding, group)])
    return received, works


def _wait(works: list) -> None:
    for work in works:
        work.wait()


def _grouped(x: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """(b, heads, s, d) → fp32 (b, kv_heads, heads/kv_heads, s, d): query heads grouped by K/V head."""
    b, h, s, d = x.shape
    return x.float().reshape(b, kv_heads, h // kv_heads, s, d)


def _block(step: int, src: int, rank: int, half: int) -> tuple[slice, slice, bool]:
    """(query slice, key slice, causal) of ring step ``step``'s block, K/V from rank ``src``."""
    if step == 0:
        return slice(None), slice(None), True
    if src < rank:
        return slice(None), slice(None, half), False
    return slice(half, None), slice(None), False


@dataclass(frozen=True)
class _Options:
    """The attention options the ring function carries (besides the sinks, a differentiable input)."""

    window: int = 0
    scale: float | None = None
    softcap: float = 0.0
    documents: torch.Tensor | None = None


class _RingAttentionFunction(torch.autograd.Function):
    """Causal attention of head-tail sharded q, k, v over the cp ring (see module docstring).

    At ring step t rank r holds the K/V of rank src = r - t (mod cp). Step 0 is causal attention
    of the local 2 chunks. For src < r both local query chunks see the first K/V chunk of src
    entirely and its second not at all; for src > r only the second query chunk sees, entirely,
    both K/V chunks. Every later step is therefore half a block, unmasked but for the window and
    documents (``_block``; a block they hide whole is skipped).
    """

    @staticmethod
    def forward(ctx, q, k, v, sinks, group, options):
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        kv_heads, seq, half = k.shape[1], q.shape[2], q.shape[2] // 2
        scale = q.shape[-1] ** -0.5 if options.scale is None else options.scale
        qg = _grouped(q, kv_heads)
        kv = torch.stack((k.float(), v.float()))  # (2, b, kv_heads, s, d), sent as one buffer
        masks = BlockMasks(rank, size, seq, q.device, options.window, options.documents)
        out = lse = None
        for step in range(size):
            pending = _ring_exchange(kv, group) if step < size - 1 else None
            src = (rank - step) % size
            queries, keys, causal = _block(step, src, rank, half)
            allowed = masks(src, queries, keys)
            if allowed is not SKIP:
                part, part_lse = block_forward(qg[..., queries, :], kv[0][..., keys, :], kv[1][..., keys, :], scale,
                                               causal, allowed, options.softcap)
                if out is None:  # step 0: the diagonal block, never skipped
                    out, lse = part, part_lse
                else:
                    out[..., queries, :], lse[..., queries] = merge_partials(out[..., queries, :], lse[..., queries],
                                                                             part, part_lse)
            if pending is not None:
                _wait(pending[1])
                kv = pending[0]
        if sinks is not None:
            out, lse = add_sink(out, lse, sinks)
        ctx.save_for_backward(q, k, v, out, lse, sinks)
        ctx.group, ctx.options, ctx.scale = group, options, scale
        b, h, _, d = q.shape
        return out.reshape(b, h, seq, d).to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse, sinks = ctx.saved_tensors
        group, options, scale = ctx.group, ctx.options, ctx.scale
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        kv_heads, half = k.shape[1], q.shape[2] // 2
        qg, dout = _grouped(q, kv_heads), _grouped(grad_out, kv_heads)
        delta = (dout * out).sum(-1)  # rowsum(dO ∘ O) of the final output
        dq = torch.zeros_like(qg)
        kv = torch.stack((k.float(), v.float()))
        dkv = torch.zeros_like(kv)  # gradient accumulator of the K/V in hand; travels with it
        masks = BlockMasks(rank, size, q.shape[2], q.device, options.window, options.documents)
        for step in range(size):
            pending = _ring_exchange(kv, group) if step < size - 1 else None
            src = (rank - step) % size
            queries, keys, causal = _block(step, src, rank, half)
            allowed = masks(src, queries, keys)
            if allowed is not SKIP:
                dq_part, dk, dv = block_backward(qg[..., queries, :], kv[0][..., keys, :], kv[1][..., keys, :],
                                                 dout[..., queries, :], lse[..., queries], delta[..., queries], scale,
                                                 causal, allowed, options.softcap)
                dq[..., queries, :] += dq_part
                dkv[0, ..., keys, :] += dk
                dkv[1, ..., keys, :] += dv
            # pass the accumulator on: after the last hop each rank holds its own K/V's gradient
            dkv, grad_works = _ring_exchange(dkv, group)
            _wait(grad_works)
            if pending is not None:
                _wait(pending[1])
                kv = pending[0]
        b, h, seq, d = q.shape
        dsinks = None if sinks is None else sink_grad(lse, delta, sinks)
        return (dq.reshape(b, h, seq, d).to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), dsinks, None, None)


@dataclass(frozen=True, eq=False)
class RingAttention:
    """``Attention.kernel`` for context parallelism over ``group`` by ring attention."""

    group: dist.ProcessGroup

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float, *, window: int = 0,
                 scale: float | None = None, softcap: float = 0.0, sinks: torch.Tensor | None = None,
                 documents: torch.Tensor | None = None) -> torch.Tensor:
        if dropout_p:
            raise ValueError("context-parallel attention has no dropout")
        return _RingAttentionFunction.apply(q, k, v, sinks, self.group, _Options(window, scale, softcap, documents))


def cp_kernel(impl: str, cp_mesh: DeviceMesh):
    """The attention kernel of ``Layout.cp_impl`` over the 1-D ``cp_mesh``."""
    if impl == "torch":
        from plait.run.parallel.context.torch_ring import TorchRingAttention

        return TorchRingAttention(cp_mesh)
    if impl == "ring":
        return RingAttention(cp_mesh.get_group())
    if impl == "allgather":
        return AllGatherAttention(cp_mesh.get_group())
    if impl == "ulysses":
        from plait.run.parallel.context.ulysses import UlyssesAttention

        return UlyssesAttention(cp_mesh.get_group())
    raise ValueError(f"unknown context-parallel attention {impl!r}; known: ring, allgather, torch, ulysses")


@dataclass(frozen=True)
class PaddedValues:
    """A cp kernel for values narrower than the queries and keys (multi-head latent attention: d_v <
    d_n + d_r; the cp kernels take one head width): V zero-padded to the query width, the output's
    padded columns dropped (they are zeros; their gradient is dropped with them). Equal widths pass through."""

    kernel: object

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float, **options) -> torch.Tensor:
        width = v.shape[-1]
        if width == q.shape[-1]:
            return self.kernel(q, k, v, dropout_p, **options)
        padded = torch.nn.functional.pad(v, (0, q.shape[-1] - width))
        return self.kernel(q, k, padded, dropout_p, **options)[..., :width]


def apply_context_parallel(model, cp_mesh: DeviceMesh, impl: str = "ring") -> SequenceShard:
    """Make ``model`` (a full ``Transformer``) attend across the 1-D ``cp_mesh``, in place.

    Every block's attention kernel becomes the cp kernel ``impl``. Returns which tokens of each
    sequence this rank is given: the model's forward must be called with their global positions
    (``SequenceShard.positions``).
    """
    kernel = PaddedValues(cp_kernel(impl, cp_mesh))
    for block in model.layers.values():
        block.attention.kernel = kernel
    model.sequence_parts = cp_mesh.size()  # RoPE tables for the whole sequence (Transformer.rope_for)
    return sequence_shard_of(cp_mesh.get_group())
