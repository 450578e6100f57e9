"""Mixture-of-experts blocks under tensor and context parallelism: who routes which tokens, the
aux loss's statistics, and the routed experts split by ``etp`` (tensor parallel inside each expert).

Tokens. With sequence parallelism (tp > 1, sp on) an MoE block takes its input as the residual
stream leaves it, this rank's 1/tp of the micro-batch's tokens, and routes and computes only those:
no expert work is repeated over tp, as the planner prices it (``plait.plan.moe.memory.
routed_tokens``: T = s·b/tp). The router and the shared experts' gate are replicated weights
(``SequenceParallel`` over the token axis: their gradients, partial on each rank, are summed over
tp); the shared experts are a dense tensor-parallel MLP on the gathered tokens (column-parallel
w1/w3, row-parallel w2 reduce-scattered back to this rank's tokens: ``plait.run.parallel.tensor.
moe_block_plan``). Without sequence parallelism every tp rank holds the whole micro-batch: the
router and the routed experts run whole on each (the planner prices that: T = s·b, repeated on each
tp rank), the shared experts are split by tp as a dense MLP. Context parallelism splits the tokens
of each sequence over cp; each cp rank routes its own.

Aux loss. The per-expert counts and probability sums are all-reduced over the ranks that split one
micro-batch's tokens (tp under sp, and cp: ``MoEFeedForward.statistic_groups``), so every rank
computes the whole micro-batch's aux; each gets the gradient of its own tokens' probabilities. The
data-parallel gradient average divides by cp, which splits a micro-batch rather than adding
micro-batches: the aux gradient is scaled by cp to undo that (``aux_grad_factor``).

Routed experts' gradients. With etp = 1 and tokens split over tp, every tp rank holds the same
experts and computes its own tokens: ``sync_gradients`` sums their gradients over tp after the
backward (after FSDP's or DDP's average over the data-parallel ranks, with which it commutes).

etp (``Layout.etp``; Megatron-Core's expert tensor parallelism, its ranks the tp ranks: the
runtime runs etp = 1 or etp = tp, the two the planner enumerates). Each expert's w1 and w3 are
split column-wise (dim 2, the ffn width) and w2 row-wise (dim 1) over tp, on top of the ep split
of dim 0 (``plait.run.parallel.expert``). After the ep dispatch the etp ranks all-gather their rows
(``TensorParallelExperts``: every rank computes every row of the group on its 1/etp of the ffn,
R = T·top_k·etp rows, as the planner prices), and the partial outputs are reduce-scattered back
to the rows' owners (sum over etp: the row-parallel reduce). Without sequence parallelism every
etp rank already holds the same rows: nothing is gathered (R = T·top_k), the partial outputs are
all-reduced and so is the rows' gradient, Megatron's tensor-parallel MLP (the planner prices the
all-reduce of R·h over etp in place of the all-gather: ``plait.plan.moe.timing.expert_a2a``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from plait.run.modules.experts import GroupedExperts
from plait.run.modules.moe import Dispatcher, MoEFeedForward, SumOver
from plait.run.parallel.expert import ETP_SHARD_DIM, _AllToAll, expert_parameters
from plait.run.parallel.mesh import ParallelDims


class _ReduceGradient(torch.autograd.Function):
    """Identity whose backward all-reduces the gradient over ``group`` (Megatron's copy-to-region:
    every etp rank's slice of the ffn contributes to the rows' gradient)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class TensorParallelExperts(Dispatcher):
    """A dispatcher (``LocalDispatcher`` or ``AllToAllDispatcher``) followed by the etp exchange:
    rows gathered over the etp group, partial outputs summed back to their owners (module
    docstring). ``gather`` False (no sequence parallelism: every etp rank already has the same
    rows): no gather; the partial outputs are all-reduced, the rows' gradient too (Megatron's MLP)."""

    def __init__(self, inner, group: dist.ProcessGroup, size: int, gather: bool = True):
        self.inner, self.group, self.size, self.gather = inner, group, size, gather

    def dispatch(self, rows: torch.Tensor, counts: torch.Tensor):
        """As ``inner.dispatch``, then the etp group's rows too, grouped by local expert."""
        rows, local_counts, inner_state = self.inner.dispatch(rows, counts)
        if not self.gather:
            return _ReduceGradient.apply(rows, self.group), local_counts, (inner_state, None, None, None)
        # the counts are on the host: copied without a stream sync, gathered, read back in one copy
        mine = torch.tensor(local_counts, dtype=torch.int64).to(rows.device, non_blocking=True)
        every = [torch.empty_like(mine) for _ in range(self.size)]
        dist.all_gather(every, mine, group=self.group)
        every = torch.stack(every)  # (etp rank, local expert)
        host = every.tolist()
        sizes, n = [sum(row) for row in host], rows.shape[0]
        gathered = _AllToAll.apply(rows.repeat(self.size, 1), sizes, [n] * self.size, self.group)
        expert_of_row = torch.arange(len(local_counts), device=rows.device).repeat(self.size).repeat_interleave(
            every.reshape(-1), output_size=sum(sizes))
        regroup = expert_of_row.argsort(stable=True)
        per_expert = [sum(column) for column in zip(*host)]
        return gathered[regroup], per_expert, (inner_state, regroup.argsort(), sizes, n)

    def combine(self, out: torch.Tensor, state) -> torch.Tensor:
        """Each row's partial outputs summed over the etp group, back on its rank, then ``inner.combine``."""
        inner_state, inverse, sizes, n = state
        if not self.gather:
            return self.inner.combine(SumOver.apply(out, (self.group,)), inner_state)
        back = _AllToAll.apply(out[inverse], [n] * self.size, sizes, self.group)
        return self.inner.combine(back.view(self.size, n, -1).sum(0), inner_state)


def tokens_split_over_tp(pdims: ParallelDims) -> bool:
    """Whether the tp ranks hold different tokens of a micro-batch (sequence parallelism)."""
    return pdims.layout.sequence_parallel


def aux_grad_factor(pdims: ParallelDims) -> float:
    """What the aux-loss gradient is multiplied by: cp (module docstring)."""
    return float(pdims.layout.cp)


def apply_moe_tensor_parallel(model: nn.Module, pdims: ParallelDims) -> None:
    """Set every MoE layer of ``model`` (after tensor and expert parallelism) to this rank's tokens and
    experts: the aux statistics' groups, and with etp > 1 the etp exchange and, without ep, the
    experts' split over tp (with ep, ``ExpertParallel.apply`` splits them over ep × etp)."""
    layout = pdims.layout
    groups = tuple(pdims.group(name) for name, split in (("tp", tokens_split_over_tp(pdims)),
                                                          ("cp", layout.cp > 1)) if split)
    for module in model.modules():
        if not isinstance(module, MoEFeedForward):
            continue
        module.statistic_groups = groups
        if layout.etp > 1:
            module.dispatcher = TensorParallelExperts(module.dispatcher, pdims.group("tp"), layout.etp,
                                                      gather=tokens_split_over_tp(pdims))
            if layout.ep == 1:
                shard_experts_over_tp(module.experts, pdims)


def shard_experts_over_tp(experts: GroupedExperts, pdims: ParallelDims) -> None:
    """w1, w3 split on the ffn width (dim 2), w2 on its rows (dim 1) over the tp mesh (ep = 1)."""
    mesh = pdims.axis("tp")
    for name, param in list(experts.named_parameters(recurse=False)):
        sharded = distribute_tensor(param.data, mesh, [Shard(ETP_SHARD_DIM[name])], src_data_rank=None)
        setattr(experts, name, nn.Parameter(sharded))


@torch.no_grad()
def sync_gradients(chunks: list[nn.Module], pdims: ParallelDims) -> None:
    """Sum the routed experts' gradients over tp when the tp ranks split the tokens and etp = 1
    (module docstring); after the backward, before the gradient norm."""
    if not tokens_split_over_tp(pdims) or pdims.layout.etp > 1:
        return
    group = pdims.group("tp")
    for param in expert_parameters(chunks):
        if param.grad is not None:
            dist.all_reduce(param.grad.to_local() if isinstance(param.grad, DTensor) else param.grad, group=group)
