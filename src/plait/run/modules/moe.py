"""The mixture-of-experts MLP of an MoE layer (``plait.spec.moe.parts.MoESpec``): router, routed
experts as a grouped GEMM, shared experts, and the auxiliary load-balancing loss.

Forward of ``MoEFeedForward`` on the T = batch·seq tokens it is given (hidden h, E routed experts,
top-k):
  1. router: logits = x·W_r (+ b_r: GPT-OSS's ``router_bias``; h -> E, fp32), probabilities =
     softmax(logits); each token takes its top-k experts (with ``n_groups`` > 1, DeepSeek-V2's
     group-limited routing: within its best ``topk_groups`` groups, a group scored by its best
     probability), their weights renormalized to sum to one
     when ``norm_topk`` (GPT-OSS's softmax over the top-k logits is the same function). The sigmoid
     router (DeepSeek-V3) scores s = sigmoid(logits), chooses the top-k of s + b (b: the
     ``score_bias`` buffer, within each token's best ``topk_groups`` of ``n_groups`` expert groups,
     a group scored by its two best choices) and weighs them by s (renormalized with
     ``norm_topk``); the aux loss then uses s / Σs as probabilities. After every optimizer step b
     moves by ``BIAS_UPDATE_RATE`` towards balance (``update_score_bias``; the load is summed over
     the step's micro-batches and the data-parallel ranks: ``plait.run.parallel.expert``). Weights
     are multiplied by ``route_scale``.
  2. dispatch: the T·k (token, expert) pairs sorted by expert; the token rows gathered in that
     order, in the experts' compute dtype (``experts.compute_dtype``: bf16 under autocast, so the
     all-to-all moves 2 bytes per element, as the planner prices it). With expert parallelism (``plait.run.parallel.expert``) the ``dispatcher`` sends each
     rank the rows of the experts it holds (all-to-all) and brings the outputs back; without it
     the rows stay here. ``Dispatcher.exchange`` runs dispatch, experts, combine and then the
     shared experts; an overlapping dispatcher (``moe_overlap``: ``plait.run.parallel.expert_overlap``)
     interleaves them.
  3. experts: SwiGLU per expert, out = (silu(x·W1_e) ⊙ x·W3_e)·W2_e, or GPT-OSS's clamped SwiGLU
     with per-expert biases (``plait.run.modules.experts``), as a grouped GEMM over the rows of
     each expert (``torch._grouped_mm`` on CUDA in bf16, else one GEMM per expert).
     With ``capacity_factor`` c > 0 each expert first keeps only its ceil(c·T·k/E) pairs of
     highest router probability (per micro-batch, before any dispatch; T: this rank's tokens,
     a share of the micro-batch when tp with sp or cp split it, as Megatron drops); the dropped pairs add
     nothing (the token keeps its other experts and the residual).
  4. combine: the outputs back in (token, slot) order; each token's output is the sum over its k
     experts of weight·expert output (fp32 accumulation), plus the shared experts (one SwiGLU of width n_shared·shared_ffn: n_shared
     experts side by side are one wider MLP), times sigmoid(x·w_g) when ``shared_gate``.

Auxiliary loss (Switch Transformer's): aux = coef · E · Σ_e f_e · P_e, where f_e is the fraction
of the T·k routed pairs that chose expert e (no gradient) and P_e the mean router probability of
e over the T tokens. It is computed over the tokens of one whole micro-batch: when ranks split a
micro-batch's tokens (tp with sequence parallelism, cp: ``plait.run.parallel.moe_tensor``) each
routes only its own, and ``statistic_groups`` all-reduce the per-expert counts and probability
sums over those ranks (the sum's backward is the identity: each rank gets the aux gradient of its
own tokens), so every rank computes the one-process aux. Its gradient is injected in the backward (``AuxLossGradient``) scaled by ``aux_grad_scale``
(1/micro-batches, as the LM loss of each micro-batch is scaled): the total gradient is that of
mean LM loss + Σ_layers mean over micro-batches of aux. The reported loss is the LM loss alone.
Every layout splits the global batch into the same micro-batches (mbs sequences), so the sum is
the same under any dp/ep/tp/cp/pp split: parity holds (dropless; with a capacity factor the
tokens dropped depend on how tp and cp split a micro-batch).

Router health (``plait.run.observe.router``): every training forward (not a recomputation in the
backward) also adds, on the device and without a host read, its routed pairs per expert to
``expert_load`` (``route``), the pairs that capacity dropped to ``dropped``, and its aux loss (coef included,
without gradient) and one forward to ``aux_sum``; the step's logging collects and zeroes them.

Parameters (names in checkpoints): ``router.weight`` (E, h) and ``router.bias`` (E,) with
``router_bias``; ``experts.w1`` / ``experts.w3`` (E, h, f) and ``experts.w2`` (E, f, h), with
``expert_bias`` also ``experts.w1_bias`` / ``experts.w3_bias`` (E, f) and ``experts.w2_bias`` (E, h):
expert-major, so expert parallelism shards dim 0;
``shared.w1/w2/w3`` (nn.Linear); ``shared_gate.weight`` (1, h); the sigmoid router's ``score_bias``
(E,), a buffer that checkpoints save with the parameters.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from plait.run.modules.experts import GroupedExperts, compute_dtype
from plait.spec.model import ModelSpec

BIAS_UPDATE_RATE = 1e-3  # sigmoid router: bias step per optimizer step (DeepSeek-V3's gamma)



def count_ids(ids: torch.Tensor, n: int) -> torch.Tensor:
    """How many times each of 0 .. n-1 occurs in the int64 ``ids``, (n,) int64, on their device. As
    ``torch.bincount(ids, minlength=n)``, without its host sync on CUDA (it reads the largest id to
    size its output); integer sums are exact in any order."""
    return torch.zeros(n, dtype=torch.int64, device=ids.device).scatter_add_(0, ids, torch.ones_like(ids))

class AuxLossGradient(torch.autograd.Function):
    """Identity on ``output`` whose backward also gives ``aux`` the gradient ``scale`` (so the
    loss's gradient includes scale·∂aux without adding aux to the reported loss)."""

    @staticmethod
    def forward(ctx, output: torch.Tensor, aux: torch.Tensor, scale: float):
        ctx.scale = scale
        ctx.aux_shape, ctx.aux_dtype = aux.shape, aux.dtype
        return output.view_as(output)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, torch.full(ctx.aux_shape, ctx.scale, dtype=ctx.aux_dtype, device=grad.device), None


class SumOver(torch.autograd.Function):
    """All-reduce (sum) over each of ``groups``; the backward is the identity (each rank's part of
    a replicated result gets that result's gradient, as Megatron's reduce-from-region)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, groups: tuple):
        x = x.clone()
        for group in groups:
            dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


class Dispatcher:
    """Moves the routed rows to their experts and back: ``dispatch`` and ``combine`` (below), or all
    of one layer's exchange in ``exchange`` (an overlapping one: ``plait.run.parallel.expert_overlap``)."""

    def exchange(self, rows: torch.Tensor, counts: torch.Tensor, experts, side=None):
        """(``experts``' outputs of ``rows`` (sorted by expert, ``counts`` per expert) in ``rows``'
        order, ``side()``: the shared experts or None): dispatch, experts, combine, then ``side``."""
        grouped, local_counts, state = self.dispatch(rows, counts)
        out = self.combine(experts(grouped, local_counts), state)
        return out, (side() if side is not None else None)


class LocalDispatcher(Dispatcher):
    """No expert parallelism: the rows stay on this rank; every expert is local."""

    def dispatch(self, rows: torch.Tensor, counts: torch.Tensor):
        """(rows grouped by local expert, rows per local expert, state for ``combine``)."""
        return rows, counts.tolist(), None

    def combine(self, out: torch.Tensor, state) -> torch.Tensor:
        return out


class SharedExperts(nn.Module):
    """The shared experts as one SwiGLU MLP of width n_shared·shared_ffn."""

    def __init__(self, hidden: int, width: int):
        super().__init__()
        self.w1 = nn.Linear(hidden, width, bias=False)
        self.w2 = nn.Linear(width, hidden, bias=False)
        self.w3 = nn.Linear(hidden, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class MoEFeedForward(nn.Module):
    """The MLP of an MoE layer (module docstring); takes and returns (batch, seq, hidden)."""

    def __init__(self, spec: ModelSpec, layer: int = 0):
        super().__init__()
        moe = spec.moe
        self.layer = layer  # the block's index in the model (router health is reported per MoE layer)
        self.counted = True  # False: forwards that are no training step's (pipelining's shape inference)
        self.n_experts, self.top_k, self.norm_topk = moe.n_experts, moe.top_k, moe.norm_topk
        self.aux_coef = moe.aux_loss_coef
        self.capacity_factor = moe.capacity_factor  # 0: dropless
        self.router_type, self.route_scale = moe.router, moe.route_scale
        self.n_groups, self.topk_groups = moe.n_groups, moe.topk_groups
        if moe.router == "sigmoid":  # the balancing bias: checkpointed, moved by a rule, not by gradients
            self.register_buffer("score_bias", torch.zeros(moe.n_experts, dtype=torch.float32))
        # routed pairs per expert since the last optimizer step (training forwards; not checkpointed)
        self.register_buffer("expert_load", torch.zeros(moe.n_experts, dtype=torch.float32), persistent=False)
        # router health since the last step's logging: [pairs dropped, aux loss summed, training forwards]
        self.register_buffer("health", torch.zeros(3, dtype=torch.float32), persistent=False)
        self.router = nn.Linear(spec.hidden, moe.n_experts, bias=moe.router_bias)
        self.experts = GroupedExperts(moe.n_experts, spec.hidden, moe.expert_ffn, bias=moe.expert_bias,
                                      activation=moe.activation)
        self.shared = SharedExperts(spec.hidden, moe.n_shared * moe.shared_width) if moe.n_shared else None
        self.shared_gate = nn.Linear(spec.hidden, 1, bias=False) if moe.n_shared and moe.shared_gate else None
        self.dispatcher = LocalDispatcher()  # plait.run.parallel.expert sets an all-to-all one
        self.statistic_groups: tuple = ()  # ranks splitting the micro-batch's tokens (plait.run.parallel.moe_tensor)
        self.aux_grad_scale = 1.0  # 1/micro-batches without a pipeline (set by build_model_parts)

    def route(self, x: torch.Tensor):
        """(fp32 probabilities (T, E) for the aux loss, top-k weights (T, k), top-k expert ids (T, k),
        the routing scores (T, E) without gradient: what token dropping ranks pairs by)."""
        logits = self.router(x).float()
        if self.router_type == "softmax":  # within the best groups when n_groups > 1 (DeepSeek-V2)
            probs = F.softmax(logits, dim=-1)
            weights, ids = self.limit_groups(probs).topk(self.top_k, dim=-1)
            scores = probs.detach()
        else:  # sigmoid: choose on score + balancing bias (within the best groups), weigh by the score
            sig = torch.sigmoid(logits)
            scores = sig.detach()
            ids = self.limit_groups(scores + self.score_bias).topk(self.top_k, dim=-1).indices
            weights = sig.gather(1, ids)
            probs = sig / sig.sum(dim=-1, keepdim=True)
        if self.norm_topk:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        if self.route_scale != 1.0:
            weights = weights * self.route_scale
        if self.counting():
            with torch.no_grad():
                self.expert_load += count_ids(ids.reshape(-1), self.n_experts).to(self.expert_load)
        return probs, weights, ids, scores

    def counting(self) -> bool:
        """Whether this forward counts in the load and health buffers: training, ``counted``, not a
        recomputation in the backward."""
        return self.training and self.counted and torch._C._current_graph_task_id() == -1

    @torch.no_grad()
    def count(self, counts: torch.Tensor, kept: torch.Tensor, aux: torch.Tensor | None) -> None:
        """Add a training forward's dropped pairs and aux loss to ``health`` (``route`` counts the load)."""
        dropped = (counts - kept).sum() if self.capacity_factor else counts.new_zeros(())
        self.health += torch.stack([dropped.to(self.health), (aux.detach().to(self.health) if aux is not None
                                                              else self.health.new_zeros(())), self.health.new_ones(())])

    @torch.no_grad()
    def reset_buffers(self) -> None:
        """Zero the balancing bias, the load counts and the health sums (after ``to_empty`` off the meta device)."""
        for buffer in self.buffers(recurse=False):
            buffer.zero_()

    def limit_groups(self, choice: torch.Tensor) -> torch.Tensor:
        """``choice`` (T, E) with the experts outside each token's best ``topk_groups`` of ``n_groups``
        groups masked, as transformers 5.24's routers do: the sigmoid router (DeepSeek-V3's
        ``noaux_tc``) scores a group by the sum of its two best choices and masks with -inf; the
        softmax router (DeepSeek-V2's ``group_limited_greedy``) scores a group by its best
        probability and masks with 0 (a masked expert is chosen only when fewer than top_k remain,
        with weight 0)."""
        if self.n_groups == 1:
            return choice
        tokens = choice.shape[0]
        grouped = choice.view(tokens, self.n_groups, -1)
        if self.router_type == "softmax":
            best, fill = grouped.amax(dim=-1), 0.0
        else:
            best, fill = grouped.topk(min(2, grouped.shape[-1]), dim=-1).values.sum(dim=-1), float("-inf")
        keep = torch.zeros_like(best, dtype=torch.bool).scatter(1, best.topk(self.topk_groups, dim=-1).indices, True)
        return grouped.masked_fill(~keep.unsqueeze(-1), fill).view(tokens, -1)

    @torch.no_grad()
    def update_score_bias(self, load: torch.Tensor) -> None:
        """Sigmoid router's balancing step (after an optimizer step): each expert's bias moves by
        ``BIAS_UPDATE_RATE`` towards balance, ``+rate`` if its routed pairs ``load`` (summed over the
        step's micro-batches and data-parallel ranks) are below the mean, ``-rate`` if above."""
        self.score_bias += BIAS_UPDATE_RATE * torch.sign(load.mean() - load)

    def within_capacity(self, scores: torch.Tensor, flat: torch.Tensor, counts: torch.Tensor):
        """Token dropping (``capacity_factor`` c > 0): each expert keeps its ``ceil(c·T·k/E)`` pairs of
        highest router probability. Returns (the kept pairs' flat (token·k + slot) indices, grouped
        by expert, best first; kept pairs per expert)."""
        capacity = math.ceil(self.capacity_factor * flat.shape[0] / self.n_experts)
        by_score = scores.argsort(descending=True, stable=True)
        order = by_score[flat[by_score].argsort(stable=True)]  # by expert, then by descending score
        starts = counts.cumsum(0) - counts
        rank_in_expert = (torch.arange(flat.shape[0], device=flat.device)
                          - starts.repeat_interleave(counts, output_size=flat.shape[0]))  # sized: no host sync
        keep = rank_in_expert < capacity
        return order[keep], counts.clamp(max=capacity)

    def aux_loss(self, probs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """coef · E · Σ_e f_e · P_e over the whole micro-batch's tokens (module docstring)."""
        tokens, total = probs.shape[0], probs.sum(dim=0)
        if self.statistic_groups:
            counts, total = counts.clone(), SumOver.apply(total, self.statistic_groups)
            for group in self.statistic_groups:
                dist.all_reduce(counts, group=group)
                tokens *= dist.get_world_size(group)
        fraction = counts.to(probs.dtype) / (tokens * self.top_k)
        return self.aux_coef * self.n_experts * (fraction * total / tokens).sum()

    def shared_output(self, x: torch.Tensor) -> torch.Tensor:
        """The shared experts of tokens ``x`` (T, h), times their gate when ``shared_gate``."""
        shared = self.shared(x)
        if self.shared_gate is not None:
            shared = torch.sigmoid(self.shared_gate(x)) * shared
        return shared

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        probs, weights, ids, scores = self.route(x)
        flat = ids.reshape(-1)
        counts = count_ids(flat, self.n_experts)
        if self.capacity_factor:
            order, kept = self.within_capacity(scores.gather(1, ids).reshape(-1), flat, counts)
        else:
            order, kept = flat.argsort(stable=True), counts  # (token, slot) pairs grouped by expert
        token_of = order // self.top_k
        side = (lambda: self.shared_output(x)) if self.shared is not None else None
        # the rows in the experts' compute dtype before they are gathered and dispatched: under
        # autocast the residual stream is fp32, and the all-to-all would move twice the bytes
        rows = x.to(compute_dtype(x))[token_of]
        out, shared = self.dispatcher.exchange(rows, kept, self.experts, side)
        if self.capacity_factor:  # dropped pairs contribute zeros
            out = out.new_zeros((flat.shape[0], out.shape[-1])).index_copy(0, order, out)
        else:
            out = out[order.argsort()]
        out = out.view(x.shape[0], self.top_k, -1)  # back to (token, slot) order
        # Σ_slots weight·output, accumulated in fp32 (the weights are fp32); saves the expert outputs
        # and the weights, nothing of the fp32 product
        y = (out * weights.unsqueeze(-1)).sum(dim=1).to(x.dtype)
        if shared is not None:
            y = y + shared
        aux = self.aux_loss(probs, counts) if self.aux_coef and torch.is_grad_enabled() else None
        if self.counting():
            self.count(counts, kept, aux)
        if aux is not None:
            y = AuxLossGradient.apply(y, aux, self.aux_grad_scale)
        return y.reshape(shape)
