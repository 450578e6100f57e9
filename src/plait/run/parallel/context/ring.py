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
  * ``AllGatherAttention``: all-gather K/V over the cp group, mask by global positions, and
    reduce-scatter dK/dV in the backward. Simpler; holds the whole sequence's K/V.
  * ``TorchRingAttention`` (``plait.run.parallel.context.torch_ring``): PyTorch's own ring attention
    with fused (Flash) kernels per block; the one to use on GPU.
  * ``UlyssesAttention`` (``plait.run.parallel.context.ulysses``): all-to-all from sequence- to
    head-sharded and back around the device's SDPA; needs cp to divide the K/V heads.

The first two run on gloo (CPU) and NCCL and compute in fp32 with the (seq/cp × seq/cp) scores
materialized per block (``plait.run.parallel.context.ops``): exact and portable, not fast.
``Layout.cp_impl`` (ring | allgather | torch | ulysses) picks one. No attention dropout
(``plait.run.config`` refuses cp with dropout models).

Packed documents (``plait train --doc-mask``): the kernels take ``documents``, the document ids
of the whole rows (batch, seq) in position order, which every cp rank holds; each block's mask
(same document, on top of the causal mask) is taken from it at the global positions of the
block's queries and keys (``SequenceShard.positions``), so no mask travels. The ring computes
every block whole (a block no document crosses is still computed); all-gather and Ulysses pass
SDPA the boolean mask. ``cp_impl=torch`` takes no mask (rule ``runtime-doc-mask-cp-torch``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from plait.run.modules.documents import document_mask
from plait.run.parallel.context.ops import block_backward, block_forward, merge_partials
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


class _RingAttentionFunction(torch.autograd.Function):
    """Causal attention of head-tail sharded q, k, v over the cp ring (see module docstring).

    At ring step t rank r holds the K/V of rank src = r - t (mod cp). Step 0 is causal attention
    of the local 2 chunks. For src < r both local query chunks see the first K/V chunk of src
    entirely and its second not at all; for src > r only the second query chunk sees, entirely,
    both K/V chunks. Every later step is therefore half a block, unmasked.
    """

    @staticmethod
    def forward(ctx, q, k, v, group, documents=None):
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        kv_heads, seq, half = k.shape[1], q.shape[2], q.shape[2] // 2
        scale = q.shape[-1] ** -0.5
        qg = _grouped(q, kv_heads)
        kv = torch.stack((k.float(), v.float()))  # (2, b, kv_heads, s, d), sent as one buffer
        masks = _BlockDocuments(documents, rank, size, seq)
        out = lse = None
        for step in range(size):
            pending = _ring_exchange(kv, group) if step < size - 1 else None
            src = (rank - step) % size
            keys, values = kv[0], kv[1]
            if step == 0:
                out, lse = block_forward(qg, keys, values, scale, causal=True, allowed=masks(src))
            elif src < rank:
                part, part_lse = block_forward(qg, keys[..., :half, :], values[..., :half, :], scale, causal=False,
                                               allowed=masks(src, keys=slice(None, half)))
                out, lse = merge_partials(out, lse, part, part_lse)
            else:
                part, part_lse = block_forward(qg[..., half:, :], keys, values, scale, causal=False,
                                               allowed=masks(src, queries=slice(half, None)))
                tail, tail_lse = merge_partials(out[..., half:, :], lse[..., half:], part, part_lse)
                out = torch.cat((out[..., :half, :], tail), dim=-2)
                lse = torch.cat((lse[..., :half], tail_lse), dim=-1)
            if pending is not None:
                _wait(pending[1])
                kv = pending[0]
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.documents = group, documents
        b, h, _, d = q.shape
        return out.reshape(b, h, seq, d).to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        group = ctx.group
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        kv_heads, half = k.shape[1], q.shape[2] // 2
        scale = q.shape[-1] ** -0.5
        qg, dout = _grouped(q, kv_heads), _grouped(grad_out, kv_heads)
        delta = (dout * out).sum(-1)  # rowsum(dO ∘ O) of the final output
        dq = torch.zeros_like(qg)
        kv = torch.stack((k.float(), v.float()))
        dkv = torch.zeros_like(kv)  # gradient accumulator of the K/V in hand; travels with it
        masks = _BlockDocuments(ctx.documents, rank, size, q.shape[2])
        for step in range(size):
            pending = _ring_exchange(kv, group) if step < size - 1 else None
            src = (rank - step) % size
            keys, values = kv[0], kv[1]
            if step == 0:
                dq_part, dk, dv = block_backward(qg, keys, values, dout, lse, delta, scale, causal=True,
                                                 allowed=masks(src))
                dq += dq_part
                dkv[0] += dk
                dkv[1] += dv
            elif src < rank:
                dq_part, dk, dv = block_backward(qg, keys[..., :half, :], values[..., :half, :], dout, lse, delta,
                                                 scale, causal=False, allowed=masks(src, keys=slice(None, half)))
                dq += dq_part
                dkv[0, ..., :half, :] += dk
                dkv[1, ..., :half, :] += dv
            else:
                dq_part, dk, dv = block_backward(qg[..., half:, :], keys, values, dout[..., half:, :],
                                                 lse[..., half:], delta[..., half:], scale, causal=False,
                                                 allowed=masks(src, queries=slice(half, None)))
                dq[..., half:, :] += dq_part
                dkv[0] += dk
                dkv[1] += dv
            # pass the accumulator on: after the last hop each rank holds its own K/V's gradient
            dkv, grad_works = _ring_exchange(dkv, group)
            _wait(grad_works)
            if pending is not None:
                _wait(pending[1])
                kv = pending[0]
        b, h, seq, d = q.shape
        return dq.reshape(b, h, seq, d).to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None, None


class _BlockDocuments:
    """The same-document masks of a rank's ring blocks, from the rows' document ids (batch, seq):
    ``masks(src, queries, keys)`` is bool (b, local queries, src's keys), sliced as the block is;
    None without documents."""

    def __init__(self, documents: torch.Tensor | None, rank: int, size: int, local: int) -> None:
        self.documents, self.size, self.local = documents, size, local
        if documents is not None:
            self.mine = documents[:, SequenceShard(rank, size).positions(local, documents.device)]

    def __call__(self, src: int, queries: slice = slice(None), keys: slice = slice(None)) -> torch.Tensor | None:
        if self.documents is None:
            return None
        theirs = self.documents[:, SequenceShard(src, self.size).positions(self.local, self.documents.device)]
        return self.mine[:, queries, None] == theirs[:, None, keys]


@dataclass(frozen=True, eq=False)
class RingAttention:
    """``Attention.kernel`` for context parallelism over ``group`` by ring attention."""

    group: dist.ProcessGroup

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float,
                 documents: torch.Tensor | None = None) -> torch.Tensor:
        if dropout_p:
            raise ValueError("context-parallel attention has no dropout")
        return _RingAttentionFunction.apply(q, k, v, self.group, documents)


# ------------------------------------------------------------------------------- all-gather
class _GatherSequence(torch.autograd.Function):
    """All-gather along the sequence (dim 2) over the cp group; backward reduce-scatters (sums)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        x = x.contiguous()
        pieces = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(pieces, x, group=group)
        return torch.cat(pieces, dim=2)

    @staticmethod
    def backward(ctx, grad):
        size = dist.get_world_size(ctx.group)
        pieces = [piece.contiguous() for piece in grad.chunk(size, dim=2)]
        mine = torch.empty_like(pieces[0])
        dist.reduce_scatter(mine, pieces, group=ctx.group)
        return mine, None


@dataclass(frozen=True, eq=False)
class AllGatherAttention:
    """``Attention.kernel`` for context parallelism over ``group`` by all-gathering K/V."""

    group: dist.ProcessGroup

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float,
                 documents: torch.Tensor | None = None) -> torch.Tensor:
        if dropout_p:
            raise ValueError("context-parallel attention has no dropout")
        size = dist.get_world_size(self.group)
        local = q.shape[2]
        k_all, v_all = _GatherSequence.apply(k, self.group), _GatherSequence.apply(v, self.group)
        q_pos = sequence_shard_of(self.group).positions(local, q.device)
        k_pos = torch.cat([SequenceShard(r, size).positions(local, q.device) for r in range(size)])
        if documents is not None:  # (b, 1, local, seq): causal and the same document
            mask = document_mask(documents[:, q_pos], documents[:, k_pos], q_pos, k_pos)[:, None]
        else:
            mask = q_pos[:, None] >= k_pos[None, :]  # True: may attend
        return torch.nn.functional.scaled_dot_product_attention(
            q, k_all, v_all, attn_mask=mask, enable_gqa=k.shape[1] != q.shape[1])


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


def apply_context_parallel(model, cp_mesh: DeviceMesh, impl: str = "ring") -> SequenceShard:
    """Make ``model`` (a full ``Transformer``) attend across the 1-D ``cp_mesh``, in place.

    Every block's attention kernel becomes the cp kernel ``impl``. Returns which tokens of each
    sequence this rank is given: the model's forward must be called with their global positions
    (``SequenceShard.positions``).
    """
    kernel = cp_kernel(impl, cp_mesh)
    for block in model.layers.values():
        block.attention.kernel = kernel
    model.sequence_parts = cp_mesh.size()  # RoPE tables for the whole sequence (Transformer.rope_for)
    return sequence_shard_of(cp_mesh.get_group())
