"""Task bodies of tests/run/test_moe_overlap.py, run on every rank of a DistPool.

``exchange_timelines`` runs one MoE exchange (forward and backward) of random rows through the
plain ``AllToAllDispatcher`` and through ``OverlappedDispatcher`` in each mode, on the pool's
world group as the ep group, and returns the overlapped results' largest differences from the
plain one and the overlapped dispatchers' timelines (event order only).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

HIDDEN, FFN, EXPERTS = 64, 96, 8
ROWS = 96  # per rank, before routing: every expert gets some rows, a chunk of every expert too


class _Note(torch.autograd.Function):
    """Identity whose backward appends (event, 'shared-grad', 0, seconds) to ``timeline``."""

    @staticmethod
    def forward(ctx, x, timeline, event):
        ctx.timeline, ctx.event = timeline, event
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.timeline.append((ctx.event, "shared-grad", 0, time.perf_counter()))
        return grad, None, None


def _inputs(rank: int, ep: int):
    """This rank's rows sorted by expert and their per-expert counts, the full expert weights (the
    same on every rank), the shared MLP's input and weights, and the loss's output weights."""
    torch.manual_seed(100 + rank)
    counts = torch.bincount(torch.randint(0, EXPERTS, (ROWS,)), minlength=EXPERTS)
    rows = torch.randn(int(counts.sum()), HIDDEN)
    side_in, probe = torch.randn(ROWS, HIDDEN), torch.randn(int(counts.sum()), HIDDEN)
    torch.manual_seed(7)
    weights = [torch.randn(EXPERTS, HIDDEN, FFN) / HIDDEN ** 0.5, torch.randn(EXPERTS, HIDDEN, FFN) / HIDDEN ** 0.5,
               torch.randn(EXPERTS, FFN, HIDDEN) / FFN ** 0.5]
    shared = torch.randn(HIDDEN, HIDDEN) / HIDDEN ** 0.5
    local = EXPERTS // ep
    mine = [w[rank * local:(rank + 1) * local].clone().requires_grad_() for w in weights]
    return rows.requires_grad_(), counts, mine, side_in.requires_grad_(), shared, probe


def _run(dispatcher, timeline: list | None) -> tuple[dict, dict]:
    """One exchange and its backward: (the output and every gradient, what its ops did: the
    backward's ops that built a zero-padded whole-size gradient (``op_record.PADDED_GRADIENT_OPS``),
    the GEMMs of the forward and backward, and the bytes the backward's additions of expert-weight-
    sized tensors moved)."""
    from op_record import OpRecord

    from plait.run.modules.experts import expert_forward

    rank, ep = dist.get_rank(), dist.get_world_size()
    rows, counts, weights, side_in, shared_w, probe = _inputs(rank, ep)

    def experts(x, local_counts):
        return expert_forward(x, local_counts, *weights)

    def side():
        x = side_in if timeline is None else _Note.apply(side_in, timeline, "gemm-end")
        y = torch.tanh(x @ shared_w) @ shared_w
        return y if timeline is None else _Note.apply(y, timeline, "gemm-start")

    with OpRecord() as forward:
        out, extra = dispatcher.exchange(rows, counts, experts, side)
        loss = (out * probe).sum() + extra.square().sum()
    with OpRecord() as record:
        loss.backward()
    ops = {"padded": record.padded(), "gemms": forward.count("aten.mm.default") + record.count("aten.mm.default"),
           "weight_sum_bytes": record.bytes_of_adds({tuple(w.shape) for w in weights})}
    return {"out": out.detach(), "shared": extra.detach(), "rows": rows.grad, "side": side_in.grad,
            **{f"w{i}": w.grad for i, w in enumerate(weights)}}, ops


def exchange_timelines(modes: list[str]) -> dict:
    """Per mode: the largest absolute difference of output and every gradient from the plain
    dispatcher's, the timeline's (event, exchange, chunk) in order, and what the ops of its run and
    of the plain one did (``_run``)."""
    from plait.run.parallel.expert import AllToAllDispatcher
    from plait.run.parallel.expert_overlap import OverlappedDispatcher

    group, ep = dist.group.WORLD, dist.get_world_size()
    plain, plain_ops = _run(AllToAllDispatcher(group, ep, EXPERTS), None)
    out = {}
    for mode in modes:
        dispatcher = OverlappedDispatcher(group, ep, EXPERTS, mode)
        dispatcher.timeline = []
        got, ops = _run(dispatcher, dispatcher.timeline)
        out[mode] = {"diff": {key: (got[key] - value).abs().max().item() for key, value in plain.items()},
                     "scale": {key: value.abs().max().item() for key, value in plain.items()},
                     "timeline": [event[:3] for event in dispatcher.timeline], "chunks": dispatcher.chunks,
                     "ops": ops, "plain_ops": plain_ops}
    return out


def autocast_chunk_casts() -> dict:
    """moe_overlap=chunked under CPU bf16 autocast with a ``GroupedExperts`` of fp32 weights (the
    master copy): how often the forward cast each weight, and the bytes the backward's additions of
    expert-weight-sized tensors moved, and in which dtypes."""
    from op_record import OpRecord

    from plait.run.modules.experts import GroupedExperts
    from plait.run.parallel.expert_overlap import OverlappedDispatcher

    rank, ep = dist.get_rank(), dist.get_world_size()
    rows, counts, weights, _, _, _ = _inputs(rank, ep)
    experts = GroupedExperts(EXPERTS // ep, HIDDEN, FFN)
    with torch.no_grad():
        for name, value in zip(("w1", "w3", "w2"), weights):
            getattr(experts, name).copy_(value)
    shapes = {tuple(w.shape) for w in weights}
    dispatcher = OverlappedDispatcher(dist.group.WORLD, ep, EXPERTS, "chunked")
    with torch.autocast("cpu", dtype=torch.bfloat16), OpRecord() as forward:
        out, _ = dispatcher.exchange(rows, counts, experts, None)
    with OpRecord() as backward:
        out.float().square().sum().backward()
    casts = [shape for name, shape, _ in forward.outputs if name == "aten._to_copy.default" and shape in shapes]
    adds = {size for name, shape, size in backward.outputs
            if name.startswith(("aten.add.", "aten.add_.")) and shape in shapes}
    return {"weight_casts": len(casts), "weight_sum_bytes": backward.bytes_of_adds(shapes),
            "add_element_bytes": sorted(adds), "chunks": dispatcher.chunks,
            "grads_fp32": all(getattr(experts, n).grad.dtype == torch.float32 for n in ("w1", "w3", "w2"))}
