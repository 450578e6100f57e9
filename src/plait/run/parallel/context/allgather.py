"""``cp_impl=allgather``: all-gather K/V over the cp group, attend with a mask by global position.

Each rank gathers the whole sequence's K and V (in rank order: the head-tail chunks of rank 0,
then rank 1, ...) and attends its own queries to them under the mask of ``allowed_pairs``
(causal, sliding window, same document, at the tokens' global positions). The backward
reduce-scatters dK/dV. Every attention option runs: the score scale, soft-capping and sinks
(one logit per head) as in the layer kernels (``plait.run.modules.layers``).

The kernel, by what the call needs: with a window, soft-cap or sinks, FlexAttention with that
mask as its ``mask_mod`` where it runs (CUDA: blocks wholly outside the causal window are
skipped; ``plait.run.modules.flex``); else SDPA with the boolean mask when there is neither
soft-cap nor sinks (the whole local × seq square), else the eager kernel (``masked_eager_attention``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from plait.run.modules.flex import compiled_flex, flex_call, flex_runs
from plait.run.modules.layers import masked_eager_attention
from plait.run.parallel.context.masks import allowed_pairs
from plait.run.parallel.context.shard import SequenceShard, sequence_shard_of


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


def _flex_positional(q, k, v, q_pos, k_pos, window, documents, scale, softcap, sinks):
    """FlexAttention of local queries against gathered keys, masked by their global positions."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def mask_mod(b, h, q_idx, kv_idx):
        distance = q_pos[q_idx] - k_pos[kv_idx]
        allowed = distance >= 0
        if window:
            allowed = allowed & (distance < window)
        if documents is not None:
            allowed = allowed & (documents[b, q_pos[q_idx]] == documents[b, k_pos[kv_idx]])
        return allowed

    batch = None if documents is None else documents.shape[0]
    mask = create_block_mask(mask_mod, batch, None, q.shape[2], k.shape[2], device=q.device)
    function = compiled_flex() if q.device.type == "cuda" and not torch.compiler.is_compiling() else flex_attention
    return flex_call(function, q, k, v, mask, scale=scale, softcap=softcap, sinks=sinks)


@dataclass(frozen=True, eq=False)
class AllGatherAttention:
    """``Attention.kernel`` for context parallelism over ``group`` by all-gathering K/V."""

    group: dist.ProcessGroup

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float, *, window: int = 0,
                 scale: float | None = None, softcap: float = 0.0, sinks: torch.Tensor | None = None,
                 documents: torch.Tensor | None = None) -> torch.Tensor:
        if dropout_p:
            raise ValueError("context-parallel attention has no dropout")
        size = dist.get_world_size(self.group)
        local = q.shape[2]
        k_all, v_all = _GatherSequence.apply(k, self.group), _GatherSequence.apply(v, self.group)
        q_pos = sequence_shard_of(self.group).positions(local, q.device)
        k_pos = torch.cat([SequenceShard(r, size).positions(local, q.device) for r in range(size)])
        if (window or softcap or sinks is not None) and flex_runs(q, 0.0, k_all, v_all, sinks):
            return _flex_positional(q, k_all, v_all, q_pos, k_pos, window, documents, scale, softcap, sinks)
        mask = allowed_pairs(q_pos, k_pos, window, documents)[:, None]  # (1 or b, 1, local, seq)
        if softcap or sinks is not None:
            return masked_eager_attention(q, k_all, v_all, mask, scale=scale, softcap=softcap, sinks=sinks)
        return F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask, scale=scale,
                                              enable_gqa=k.shape[1] != q.shape[1])
