"""``cp_impl=ulysses``: context parallelism by all-to-all (DeepSpeed-Ulysses).

Each cp rank holds its head-tail tokens of every head. One all-to-all per tensor trades that
for all tokens of 1/cp of the heads: Q, K and V go "sequence-sharded → head-sharded", ordinary
causal attention runs on whole sequences (the gathered tokens sorted into position order first),
and the output goes back "head-sharded → sequence-sharded". The backward is the same
all-to-alls in reverse (an all-to-all is a permutation; its adjoint is the inverse one).

Rule: cp divides the rank's K/V heads (n_kv_heads / tp; then also its query heads), so that
every rank gets whole K/V heads with the query heads that share them. The layout validator
(``plait.spec.validate``, rule ``ulysses-divides-heads``) checks it before launch. Traffic per
layer: 4 all-to-alls of (cp-1)/cp of the rank's Q/K/V/O bytes forward, the same backward,
independent of cp's ring length; the attention itself is the device's SDPA kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from plait.run.modules.documents import row_mask
from plait.run.modules.flex import flex_attention_kernel
from plait.run.modules.layers import core_attention
from plait.run.parallel.context.shard import SequenceShard


def _all_to_all(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Part i of dim 0 goes to cp rank i; part i of the result came from cp rank i."""
    x = x.contiguous()
    out = torch.empty_like(x)  # contiguous, as x is: empty_like keeps strides, c10d writes as if contiguous
    dist.all_to_all_single(out, x, group=group)
    return out


def heads_to_sequence(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """(b, h, s/cp, d) on each rank → (b, h/cp, s, d): the rank's heads, every rank's tokens in rank order."""
    size = dist.get_world_size(group)
    b, h, s, d = x.shape
    parts = x.reshape(b, size, h // size, s, d).movedim(1, 0)  # (cp, b, h/cp, s/cp, d): by destination
    gathered = _all_to_all(parts, group)  # (cp, b, h/cp, s/cp, d): by source
    return gathered.movedim(0, 2).reshape(b, h // size, size * s, d)


def sequence_to_heads(y: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """The inverse of ``heads_to_sequence``."""
    size = dist.get_world_size(group)
    b, h, s, d = y.shape
    parts = y.reshape(b, h, size, s // size, d).movedim(2, 0)  # (cp, b, h/cp, s/cp, d): by destination
    back = _all_to_all(parts, group)  # by source = head group
    return back.movedim(0, 1).reshape(b, size * h, s // size, d)


class _HeadsToSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return heads_to_sequence(x, group)

    @staticmethod
    def backward(ctx, grad):
        return sequence_to_heads(grad, ctx.group), None


class _SequenceToHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, group):
        ctx.group = group
        return sequence_to_heads(y, group)

    @staticmethod
    def backward(ctx, grad):
        return heads_to_sequence(grad, ctx.group), None


@dataclass(frozen=True, eq=False)
class UlyssesAttention:
    """``Attention.kernel`` for context parallelism over ``group`` by all-to-all of heads."""

    group: dist.ProcessGroup

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float, *, window: int = 0,
                 scale: float | None = None, softcap: float = 0.0, sinks: torch.Tensor | None = None,
                 documents: torch.Tensor | None = None) -> torch.Tensor:
        """Whole sequences of 1/cp of the heads, so the layer kernels take every option: ``window``,
        ``scale``, ``documents`` (the rows' document ids (batch, seq), --doc-mask) by SDPA with its
        boolean mask, and with ``softcap`` or ``sinks`` (this rank's heads'
        logits, of which the all-to-all leaves it 1/cp) by ``flex_attention_kernel`` (FlexAttention,
        or the eager kernel where it does not run)."""
        if dropout_p:
            raise ValueError("context-parallel attention has no dropout")
        size = dist.get_world_size(self.group)
        if k.shape[1] % size:
            raise ValueError(f"cp_impl=ulysses: cp={size} does not divide this rank's {k.shape[1]} K/V heads")
        local = q.shape[2]
        gathered_positions = torch.cat([SequenceShard(r, size).positions(local, q.device) for r in range(size)])
        order = torch.argsort(gathered_positions)  # gathered (rank-major) tokens → position order
        q, k, v = (_HeadsToSequence.apply(t, self.group)[:, :, order] for t in (q, k, v))
        if softcap or sinks is not None:
            if sinks is not None:  # the heads this rank now holds: the cp rank's share, in order
                part = sinks.shape[0] // size
                rank = dist.get_rank(self.group)
                sinks = sinks[rank * part:(rank + 1) * part]
            out = flex_attention_kernel(q, k, v, 0.0, window=window, scale=scale, softcap=softcap, sinks=sinks,
                                        documents=documents)
        elif documents is not None:  # SDPA's boolean mask of the whole sequences (priced as the whole square)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=row_mask(documents, window), scale=scale,
                                                 enable_gqa=k.shape[1] != q.shape[1])
        else:
            out = core_attention(q, k, v, 0.0, window=window, scale=scale)
        unsorted = torch.empty_like(order)
        unsorted[order] = torch.arange(order.numel(), device=order.device)
        return _SequenceToHeads.apply(out[:, :, unsorted], self.group)
