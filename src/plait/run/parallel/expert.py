"""Expert parallelism: the routed experts of every MoE layer sharded over ``ep`` ranks carved out of
the data-parallel ranks, with all-to-all token dispatch and combine.

Mesh. The ``edp`` and ``ep`` axes of the run's one mesh (``plait.run.parallel.mesh``): the dp·cp
ranks of each (pp, tp) position, in the mesh's order, split into edp × ep, ep innermost
(Megatron-Core's order, ep carved out of data parallelism); no mesh of its own. A rank holds
experts [r·E/ep, (r+1)·E/ep) of each MoE layer (r: its ep index); the expert weights are
DTensors ``Shard(0)`` over the 1-D ep mesh, so the gradient norm sums their squares over ep
(``plait.run.optim``) and a checkpoint holds each expert's full tensor under its plain name
(``plait.run.checkpoint.dcp``): it loads under any other ep. Tensor-parallel ranks hold the same
experts (etp = 1; with sequence parallelism each routes its own tokens) or split each expert's ffn
(etp = tp: the weights are DTensors over the (ep, etp) mesh, ``Shard(0)`` and ``ETP_SHARD_DIM``):
``plait.run.parallel.moe_tensor``. Everything else (attention, router, shared experts, dense MLPs)
keeps the dense layout.

Dispatch (``AllToAllDispatcher``): the rows sorted by global expert are sent to the rank holding
their expert with ``all_to_all_single`` and variable split sizes (the per-expert counts are
exchanged first, one small all-to-all, and read on the host), regrouped by local expert for the
grouped GEMM, and the outputs sent back the same way (the backward runs the reverse exchanges).
With ``moe_overlap`` chunked or shared, ``plait.run.parallel.expert_overlap``'s dispatcher does it
with async all-to-alls overlapping the expert GEMMs or the shared experts.

Gradients. An expert's local gradient already sums the contributions of the tokens of all ep
ranks of its group (the all-to-all's backward brings them). With ZeRO (zero >= 1) and edp > 1,
each MoE layer's experts are an FSDP2 unit on the edp mesh (``plait.run.parallel.data``): their
weights, optimizer states and gradients are sharded over edp too (as the planner's
``expert_states`` assumes) and FSDP averages the gradients over edp; ``sync_gradients`` then
divides by ep. Otherwise (zero=0, or edp = 1) data parallelism (FSDP2 replication replaces DDP
when ep > 1) leaves the expert weights out (``ignored_params``) and ``sync_gradients`` sums each
expert's gradient over edp and divides by dp·cp. Either way the result is (1/(dp·cp)) Σ over all
ranks: the gradient of the global mean loss, as for every other parameter.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from plait.run.modules.experts import GroupedExperts
from plait.run.modules.moe import Dispatcher, MoEFeedForward
from plait.run.parallel.expert_overlap import OverlappedDispatcher
from plait.run.parallel.mesh import ParallelDims


ETP_SHARD_DIM = {"w1": 2, "w3": 2, "w2": 1}  # etp > 1: w1/w3 column-wise (ffn width), w2 row-wise


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` of rows with variable split sizes; the backward sends gradients back."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, out_splits: list[int], in_splits: list[int], group):
        ctx.splits, ctx.group = (out_splits, in_splits), group
        rows = rows.contiguous()
        out = rows.new_empty((sum(out_splits),) + tuple(rows.shape[1:]))
        dist.all_to_all_single(out, rows, out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        out_splits, in_splits = ctx.splits
        grad = grad.contiguous()  # a non-contiguous gradient would be read as if contiguous
        back = grad.new_empty((sum(in_splits),) + tuple(grad.shape[1:]))
        dist.all_to_all_single(back, grad, in_splits, out_splits, group=ctx.group)
        return back, None, None, None


class AllToAllDispatcher(Dispatcher):
    """Sends the rows of each expert to the ep rank holding it and the outputs back (module docstring)."""

    def __init__(self, group: dist.ProcessGroup, ep: int, n_experts: int):
        self.group, self.ep, self.local = group, ep, n_experts // ep

    def dispatch(self, rows: torch.Tensor, counts: torch.Tensor):
        """``rows`` sorted by global expert, ``counts`` (E,) rows per expert -> (rows grouped by
        local expert, rows per local expert, state for ``combine``)."""
        received = torch.empty_like(counts)
        dist.all_to_all_single(received, counts.contiguous(), group=self.group)  # [source rank, local expert]
        # the layer's one host read: the counts sent and received ([source rank][local expert])
        host = torch.cat([counts, received]).tolist()
        sent = [host[d * self.local:(d + 1) * self.local] for d in range(self.ep)]
        got = [host[(self.ep + s) * self.local:(self.ep + s + 1) * self.local] for s in range(self.ep)]
        in_splits, out_splits = [sum(row) for row in sent], [sum(row) for row in got]
        arrived = _AllToAll.apply(rows, out_splits, in_splits, self.group)
        expert_of_row = torch.arange(self.local, device=rows.device).repeat(self.ep).repeat_interleave(
            received, output_size=sum(out_splits))  # the size given: no second host sync
        regroup = expert_of_row.argsort(stable=True)
        per_expert = [sum(column) for column in zip(*got)]
        return arrived[regroup], per_expert, (regroup.argsort(), in_splits, out_splits)

    def combine(self, out: torch.Tensor, state) -> torch.Tensor:
        inverse, in_splits, out_splits = state
        return _AllToAll.apply(out[inverse], in_splits, out_splits, self.group)


class ExpertParallel:
    """What expert parallelism does to a model, on the run mesh's ep and edp axes (module docstring)."""

    def __init__(self, pdims: ParallelDims):
        layout = pdims.layout
        self.pdims = pdims
        self.overlap = layout.moe_overlap  # chunked or shared: plait.run.parallel.expert_overlap
        self.ep = pdims.size("ep")
        self.data_parallel = layout.dp * layout.cp  # dp·cp: the ranks whose gradients are averaged
        self.ep_mesh = pdims.axis("ep")
        self.etp = layout.etp  # > 1: the weights also split over the etp axis (plait.run.parallel.moe_tensor)
        self.weight_mesh = pdims.expert_mesh["ep", "etp"] if self.etp > 1 else self.ep_mesh
        self.edp = pdims.size("edp")
        # ZeRO (zero >= 1) over edp > 1 ranks: FSDP2 shards the experts over edp and averages their
        # gradients there (plait.run.parallel.data); else they are replicated and summed here
        self.sharded = layout.zero >= 1 and self.edp > 1
        self.edp_mesh = pdims.axis("edp") if self.sharded else None

    def apply(self, model: nn.Module) -> None:
        """Shard every MoE layer's experts of ``model`` (a model or stage, still on meta) over ep."""
        group = self.pdims.group("ep")
        for module in model.modules():
            if isinstance(module, MoEFeedForward):
                module.dispatcher = (AllToAllDispatcher(group, self.ep, module.n_experts) if self.overlap == "none"
                                     else OverlappedDispatcher(group, self.ep, module.n_experts, self.overlap))
                experts = module.experts
                for name, param in list(experts.named_parameters(recurse=False)):
                    placements = [Shard(0)] + ([Shard(ETP_SHARD_DIM[name])] if self.etp > 1 else [])
                    sharded = distribute_tensor(param.data, self.weight_mesh, placements, src_data_rank=None)
                    setattr(experts, name, nn.Parameter(sharded))

    @torch.no_grad()
    def sync_gradients(self, chunks: list[nn.Module]) -> None:
        """Sum the expert gradients over edp and divide by dp·cp (module docstring); after the backward."""
        group = self.pdims.group("edp") if self.edp > 1 and not self.sharded else None
        # FSDP already averaged over edp: what is left is 1/ep; else the sum over edp, 1/(dp·cp)
        divisor = self.ep if self.sharded else self.data_parallel
        for param in expert_parameters(chunks):
            if param.grad is None:
                continue
            local = param.grad.to_local() if isinstance(param.grad, DTensor) else param.grad
            if group is not None:
                dist.all_reduce(local, group=group)
            local.div_(divisor)


def expert_parameters(chunks: list[nn.Module]) -> list[nn.Parameter]:
    """The routed experts' parameters of ``chunks``."""
    return [p for chunk in chunks for m in chunk.modules() if isinstance(m, GroupedExperts) for p in m.parameters()]


def set_aux_grad_scale(chunks: list[nn.Module], scale: float) -> None:
    """The factor of every MoE layer's auxiliary-loss gradient (1/micro-batches without a pipeline)."""
    for chunk in chunks:
        for module in chunk.modules():
            if isinstance(module, MoEFeedForward):
                module.aux_grad_scale = scale


@torch.no_grad()
def balance_routers(chunks: list[nn.Module], pdims: ParallelDims, update: bool = True) -> None:
    """After an optimizer step: sum the sigmoid routers' loads over the data-parallel ranks and the
    ranks that split a micro-batch's tokens (one all-reduce per dp/cp/tp mesh dimension for all
    layers; tp under sequence parallelism), move their biases (``update``: False for a skipped step),
    and zero every MoE layer's load."""
    layers = [m for chunk in chunks for m in chunk.modules() if isinstance(m, MoEFeedForward)]
    sigmoid = [m for m in layers if m.router_type == "sigmoid"]
    if sigmoid and update:
        loads = torch.stack([m.expert_load for m in sigmoid])
        split = ("tp",) if pdims.layout.sequence_parallel else ()  # the tp ranks route their own tokens
        for name in ("dp_replicate", "dp_shard", "cp") + split:
            if pdims.size(name) > 1:
                dist.all_reduce(loads, group=pdims.group(name))
        for module, load in zip(sigmoid, loads):
            module.update_score_bias(load)
    for module in layers:
        module.expert_load.zero_()
