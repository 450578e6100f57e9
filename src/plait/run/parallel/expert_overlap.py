"""Expert all-to-all overlapped with computation (``Layout.moe_overlap``): ``chunked`` and ``shared``.

``OverlappedDispatcher`` replaces ``plait.run.parallel.expert.AllToAllDispatcher`` when
``moe_overlap`` is not ``none``; it runs the whole exchange of one MoE layer and micro-batch
(dispatch -> routed experts -> combine, and the shared experts) through ``exchange``, so that it
can interleave them:

  chunked  the rows are split into ``MOE_CHUNKS`` chunks (``plait.plan.moe.timing``, the number the
           planner prices) *by tokens within each expert*: chunk c takes rows [ceil(c·n_e/C),
           ceil((c+1)·n_e/C)) of every expert e's n_e rows (rows arrive sorted by expert, tokens in
           order), so every chunk holds every expert's share and exchanges with every ep rank.
           One count exchange (all chunks' per-expert counts, one small all-to-all read on the
           host); then every chunk's dispatch is issued at once (async), and for each chunk in turn:
           wait for its dispatch, run its expert GEMMs (while the later chunks' dispatches and the
           earlier chunks' combines are in flight), issue its combine (async). The combines are
           waited last. The shared experts run after (as with ``none``). The chunks run inside one
           call of the experts module (``GroupedExperts.run_chunked``): FSDP gathers their weights
           once and reduces their gradients once, and the weights are cast to the compute dtype
           once for all chunks.
  shared   one dispatch issued async, the shared experts (and their gate) computed while it is in
           flight, then wait, the expert GEMMs, and the combine (waited at once: nothing of the
           layer is left to hide it behind).

Backward. Each exchange is a pair of autograd functions, ``_Issue`` (starts the all-to-all,
returns its not-yet-filled buffer) and ``_Wait`` (waits, returns the buffer); the backward of
``_Wait`` issues the reverse all-to-all of the gradient and the backward of ``_Issue`` waits for
it. PyTorch's autograd engine runs the ready node created last in the forward first, so the
backward mirrors the forward: chunked issues every reverse combine, then per chunk (last first)
waits for it, runs that chunk's expert backward GEMMs (the other chunks' reverse combines and
the later chunk's reverse dispatch in flight) and issues its reverse dispatch; the reverse
dispatches are waited last. With ``shared`` the reverse dispatch is in flight during the shared
experts' backward; the reverse combine is exposed, as the combine is in the forward (the
planner prices one of the two all-to-alls as hidden: ``plait.plan.moe.timing``).

Devices. On CUDA each all-to-all is issued on a side stream after it waits for the current
stream; its buffers are ``record_stream``-ed there and held until the wait, and the wait makes the
current stream wait for the side stream. The overlap comes from issuing early and waiting late:
NCCL (and gloo's CUDA path) already run the collective on a stream of their own, ordered after
the issuing stream, and make the waiting stream wait, so the side stream adds no overlap itself. On CPU the same code runs gloo's async work handles (gloo runs them on its
own threads while this thread computes). The numerics equal ``none``'s: every row meets the same
expert weights; only the order in which the expert weight gradients are summed changes.

At ep = 1 there is no all-to-all (``plait.run.modules.moe.LocalDispatcher``): every mode runs as
``none``, as the planner prices it (no all-to-all to hide).

``timeline``: when a list, every issue, wait and expert GEMM start and end (forward and
backward) is appended as (event, exchange, chunk, seconds of ``time.perf_counter``): what
tests/run/test_moe_overlap.py reads to show a collective in flight while an expert GEMM runs.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from plait.plan.moe.timing import MOE_CHUNKS
from plait.run.modules.moe import Dispatcher, count_ids


class _Exchange:
    """One all-to-all of rows in flight, forward and backward: group, splits, stream, work, buffers."""

    def __init__(self, group, out_splits: list[int], in_splits: list[int], name: str, chunk: int, owner):
        self.group, self.out_splits, self.in_splits = group, out_splits, in_splits
        self.name, self.chunk, self.owner = name, chunk, owner
        self.work, self.buffers, self.back = None, (), None

    def start(self, out: torch.Tensor, rows: torch.Tensor, out_splits, in_splits, what: str):
        """Issue ``all_to_all_single(out <- rows)`` async (on the side stream on CUDA)."""
        stream = self.owner.side_stream(rows)
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream(rows.device))
            with torch.cuda.stream(stream):
                self.work = dist.all_to_all_single(out, rows, out_splits, in_splits, group=self.group,
                                                   async_op=True)
            for tensor in (out, rows):
                tensor.record_stream(stream)
        else:
            self.work = dist.all_to_all_single(out, rows, out_splits, in_splits, group=self.group,
                                               async_op=True)
        self.buffers = (out, rows)  # alive until the wait
        self.owner.note("issue", what, self.chunk)

    def finish(self, what: str) -> None:
        """Wait for the all-to-all in flight (the current stream waits for the side stream)."""
        self.work.wait()
        stream = self.owner.side_stream(self.buffers[0])
        if stream is not None:
            torch.cuda.current_stream(self.buffers[0].device).wait_stream(stream)
        self.work, self.buffers = None, ()
        self.owner.note("wait", what, self.chunk)


class _Issue(torch.autograd.Function):
    """Starts ``exchange``'s all-to-all of ``rows``; returns the buffer it fills (valid after ``_Wait``).
    Backward: waits for the reverse all-to-all ``_Wait``'s backward issued; returns its result."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, exchange: _Exchange):
        ctx.exchange = exchange
        rows = rows.contiguous()
        out = rows.new_empty((sum(exchange.out_splits),) + tuple(rows.shape[1:]))
        exchange.start(out, rows, exchange.out_splits, exchange.in_splits, exchange.name)
        return out

    @staticmethod
    def backward(ctx, _placeholder: torch.Tensor):
        exchange = ctx.exchange
        exchange.finish(exchange.name + "-grad")
        back, exchange.back = exchange.back, None
        return back, None


class _Wait(torch.autograd.Function):
    """Waits for ``exchange``'s all-to-all; returns ``out``. Backward: issues the reverse all-to-all
    of the gradient (async) and passes a placeholder to ``_Issue``'s backward, which waits."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, exchange: _Exchange):
        ctx.exchange = exchange
        exchange.finish(exchange.name)
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        exchange = ctx.exchange
        grad = grad.contiguous()  # a non-contiguous gradient would be read as if contiguous
        exchange.back = grad.new_empty((sum(exchange.in_splits),) + tuple(grad.shape[1:]))
        exchange.start(exchange.back, grad, exchange.in_splits, exchange.out_splits, exchange.name + "-grad")
        return grad, None


class _Mark(torch.autograd.Function):
    """Identity that notes ``event`` in the backward (the expert backward GEMMs' start or end)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, owner, event: str, chunk: int):
        ctx.owner, ctx.event, ctx.chunk = owner, event, chunk
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        ctx.owner.note(ctx.event, "experts-grad", ctx.chunk)
        return grad, None, None, None


class OverlappedDispatcher(Dispatcher):
    """The expert all-to-all of one MoE layer with ``mode`` ``chunked`` or ``shared`` (module docstring)."""

    def __init__(self, group: dist.ProcessGroup, ep: int, n_experts: int, mode: str, chunks: int = MOE_CHUNKS):
        if mode not in ("chunked", "shared"):
            raise ValueError(f"moe_overlap={mode} is not an overlapping mode")
        self.group, self.ep, self.local, self.mode = group, ep, n_experts // ep, mode
        self.chunks = chunks if mode == "chunked" else 1
        self.timeline: list | None = None  # a list: issue/wait/GEMM events are appended (module docstring)
        self._stream = None

    def side_stream(self, tensor: torch.Tensor):
        """The CUDA side stream the all-to-alls run on (None on CPU)."""
        if not tensor.is_cuda:
            return None
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=tensor.device)
        return self._stream

    def note(self, event: str, what: str, chunk: int) -> None:
        if self.timeline is not None:
            self.timeline.append((event, what, chunk, time.perf_counter()))

    def exchange(self, rows: torch.Tensor, counts: torch.Tensor, experts, side=None):
        """``rows`` sorted by global expert, ``counts`` (E,) rows per expert, ``experts`` (rows grouped
        by local expert, counts per local expert) -> expert outputs, ``side()`` (the shared experts,
        or None): (the outputs in ``rows``' order, what ``side`` returned)."""
        if self.mode == "shared":
            return self._exchange(rows, counts, experts, side)
        run_chunked = getattr(experts, "run_chunked", None)  # the chunks inside one call of the experts
        if run_chunked is not None:
            done = run_chunked(rows, lambda rows, chunk_experts: self._exchange(rows, counts, chunk_experts)[0])
        else:
            done = self._exchange(rows, counts, experts)[0]
        return done, self._side(side)  # after the exchange, as with moe_overlap=none

    def _exchange(self, rows: torch.Tensor, counts: torch.Tensor, experts, side=None):
        """``exchange``'s chunks: (the outputs in ``rows``' order, ``side()`` run while the dispatch
        is in flight, or None)."""
        n = self.chunks
        order, chunk_counts = self._chunk_rows(counts, rows.shape[0])
        received, sent = self._exchange_counts(chunk_counts)  # on the host: [source][chunk][local], [chunk][dest]
        mine = rows[order] if n > 1 else rows
        # one split: its backward concatenates the chunks' gradients once (a slice per chunk would
        # build and sum a zero-padded gradient of every row per chunk)
        pieces = mine.split([sum(sent[c]) for c in range(n)])
        in_flight = []
        for c in range(n):  # every dispatch issued at once
            out_splits = [sum(received[src][c]) for src in range(self.ep)]
            exchange = _Exchange(self.group, out_splits, sent[c], "dispatch", c, self)
            in_flight.append((_Issue.apply(pieces[c], exchange), exchange))
        extra = self._side(side)  # while the dispatch is in flight
        combines = []
        for c, (buffer, exchange) in enumerate(in_flight):
            arrived = _Wait.apply(buffer, exchange)
            per_source = [received[src][c] for src in range(self.ep)]
            outputs = self._experts(arrived, per_source, experts, c)
            back = _Exchange(self.group, exchange.in_splits, exchange.out_splits, "combine", c, self)
            combines.append((_Issue.apply(outputs, back), back))
        done = torch.cat([_Wait.apply(buffer, exchange) for buffer, exchange in combines])
        return (done[order.argsort()] if n > 1 else done), extra

    def _side(self, side):
        """``side()`` (None without one), its start and end noted."""
        if side is None:
            return None
        self.note("shared-start", "shared", 0)
        extra = side()
        self.note("shared-end", "shared", 0)
        return extra

    def _chunk_rows(self, counts: torch.Tensor, total: int):
        """(the permutation that orders the ``total`` rows by chunk, then expert; (chunks, E) rows per
        chunk and expert): chunk c holds rows [ceil(c·n_e/C), ceil((c+1)·n_e/C)) of expert e."""
        n, experts = self.chunks, counts.shape[0]
        if n == 1:
            return None, counts.view(1, experts)
        expert_of_row = torch.arange(experts, device=counts.device).repeat_interleave(counts, output_size=total)
        position = torch.arange(expert_of_row.shape[0], device=counts.device) - (counts.cumsum(0) - counts)[expert_of_row]
        chunk_of_row = position * n // counts[expert_of_row]
        order = chunk_of_row.argsort(stable=True)
        per_chunk = count_ids(chunk_of_row * experts + expert_of_row, n * experts)
        return order, per_chunk.view(n, experts)

    def _exchange_counts(self, chunk_counts: torch.Tensor) -> tuple[list, list]:
        """Every chunk's per-expert counts to the ranks holding the experts (one small all-to-all,
        synchronous), read on the host with the counts this rank sends in one copy: ([source
        rank][chunk][local expert] received, [chunk][destination rank] rows sent)."""
        n = chunk_counts.shape[0]
        send = chunk_counts.view(n, self.ep, self.local).transpose(0, 1).contiguous()  # [destination][chunk][local]
        received = torch.empty_like(send)
        dist.all_to_all_single(received, send, group=self.group)
        host = torch.cat([received.reshape(-1), send.sum(2).t().reshape(-1)]).tolist()
        size = self.ep * n * self.local
        got = [[host[(s * n + c) * self.local:(s * n + c + 1) * self.local] for c in range(n)] for s in range(self.ep)]
        sent = [host[size + c * self.ep:size + (c + 1) * self.ep] for c in range(n)]
        return got, sent

    def _experts(self, arrived: torch.Tensor, per_source: list[list[int]], experts, chunk: int) -> torch.Tensor:
        """The expert GEMMs of one chunk: rows from [source][local expert] to [local expert][source]
        order, the experts, and back."""
        # (ep, local), built on the host and copied without a stream sync (the counts were read on the host)
        counts = torch.tensor(per_source).to(arrived.device, non_blocking=True)
        expert_of_row = torch.arange(self.local, device=arrived.device).repeat(self.ep).repeat_interleave(
            counts.reshape(-1), output_size=arrived.shape[0])
        regroup = expert_of_row.argsort(stable=True)
        grouped = arrived[regroup]
        if self.timeline is not None:
            grouped = _Mark.apply(grouped, self, "gemm-end", chunk)
        self.note("gemm-start", "experts", chunk)
        out = experts(grouped, [sum(column) for column in zip(*per_source)])
        self.note("gemm-end", "experts", chunk)
        if self.timeline is not None:
            out = _Mark.apply(out, self, "gemm-start", chunk)
        return out[regroup.argsort()]
