"""The per-block attention math of ring attention: partial forward with its log-sum-exp, the
online-softmax merge of partial results, and the exact backward of one block.

Shapes: queries (b, kv_heads, group, sq, d) with the query heads grouped by the K/V head they
share (grouped-query attention), keys and values (b, kv_heads, sk, d), all fp32. Inside, the
group is folded into the query rows, so each K/V head is one batched matmul (and dK, dV come
out summed over the query heads that share them). The block's scores (group·sq × sk) are
materialized: these kernels are written for correctness on any device, not for speed.
``causal`` masks the block's upper triangle (a diagonal block, sq == sk); ``allowed`` (bool
(b, sq, sk), packed documents: ``plait.run.modules.documents``) masks every score it is False
at, for all heads. A query that sees no key of the block gets a zero output and a log-sum-exp
of -inf, which the merge then ignores. ``softcap`` (c > 0, Gemma-2) caps the scaled scores to
c·tanh(score/c) before the masks; the backward multiplies by its derivative 1 - tanh². Attention
sinks are one more term of the merge (``add_sink``) and have their own gradient (``sink_grad``).
"""

from __future__ import annotations

import torch


def _rows(x: torch.Tensor) -> torch.Tensor:
    """(b, kv_heads, group, s, ...) → (b, kv_heads, group·s, ...)."""
    return x.reshape(x.shape[0], x.shape[1], x.shape[2] * x.shape[3], *x.shape[4:])


def _scores(q: torch.Tensor, k: torch.Tensor, scale: float, causal: bool,
            allowed: torch.Tensor | None = None, softcap: float = 0.0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(b, kv_heads, group·sq, sk) scaled (and soft-capped) scores, -inf above the diagonal when
    ``causal`` and where ``allowed`` (b, sq, sk) is False; with ``softcap``, also tanh(score/c)."""
    scores = (_rows(q) @ k.transpose(-2, -1)).mul_(scale)
    tanh = None
    if softcap:
        tanh = scores.div_(softcap).tanh_()
        scores = tanh * softcap
    group, sq, sk = q.shape[2], q.shape[3], k.shape[2]
    if causal:
        mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device).triu(1).repeat(group, 1)
        scores.masked_fill_(mask, float("-inf"))
    if allowed is not None:  # the query rows of every head of a group share their tokens' mask
        scores.masked_fill_(~allowed.repeat(1, group, 1)[:, None], float("-inf"))
    return scores, tanh


def block_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool,
                  allowed: torch.Tensor | None = None, softcap: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(softmax(q kᵀ·scale) v with q's shape, log-sum-exp of each query's scores (b, kv_heads, group, sq))."""
    scores, _ = _scores(q, k, scale, causal, allowed, softcap)
    lse = scores.logsumexp(dim=-1)
    shift = lse if allowed is None else lse.masked_fill(lse == float("-inf"), 0.0)  # rows seeing no key: 0
    out = scores.sub_(shift.unsqueeze(-1)).exp_() @ v
    return out.view(q.shape), lse.view(q.shape[:-1])


def merge_partials(out: torch.Tensor, lse: torch.Tensor, part: torch.Tensor,
                   part_lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over the union of two disjoint key sets from the two partial results."""
    merged = torch.logaddexp(lse, part_lse)
    out = out * torch.exp(lse - merged).unsqueeze(-1) + part * torch.exp(part_lse - merged).unsqueeze(-1)
    return out, merged


def add_sink(out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge the sink column (a logit per query head, (heads,), no value) into the final result:
    out (b, kv_heads, group, sq, d) and lse (b, kv_heads, group, sq)."""
    sink = sinks.float().view(1, lse.shape[1], lse.shape[2], 1).expand_as(lse)
    return merge_partials(out, lse, torch.zeros_like(out), sink)


def sink_grad(lse: torch.Tensor, delta: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """Gradient of the sink logits (heads,) from the final lse and delta = rowsum(dO ∘ O), both
    (b, kv_heads, group, sq): the sink's probability p = exp(sink - lse) times (0 - delta) (its
    value is 0), summed over the batch and the queries."""
    sink = sinks.float().view(1, lse.shape[1], lse.shape[2], 1)
    return -(torch.exp(sink - lse) * delta).sum(dim=(0, 3)).reshape(-1).to(sinks.dtype)


def block_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor, lse: torch.Tensor,
                   delta: torch.Tensor, scale: float, causal: bool, allowed: torch.Tensor | None = None,
                   softcap: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """This block's share of (dq, dk, dv), given the *final* log-sum-exp and
    delta = rowsum(grad_out ∘ out) of the queries (FlashAttention's backward).

    dq has q's shape; dk and dv have k's, summed over the query heads sharing them.
    """
    scores, tanh = _scores(q, k, scale, causal, allowed, softcap)
    probs = scores.sub_(_rows(lse).unsqueeze(-1)).exp_()
    dout = _rows(grad_out)
    dv = probs.transpose(-2, -1) @ dout
    dscores = (dout @ v.transpose(-2, -1)).sub_(_rows(delta).unsqueeze(-1)).mul_(probs)
    if tanh is not None:  # d(c·tanh(x/c))/dx = 1 - tanh²
        dscores.mul_(1 - tanh.square())
    dq = (dscores @ k).mul_(scale)
    dk = (dscores.transpose(-2, -1) @ _rows(q)).mul_(scale)
    return dq.view(q.shape), dk, dv
