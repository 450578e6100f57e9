"""The pipeline schedule of a plan as a timeline per rank: forward, backward and bubble intervals.

``pipeline_timeline`` is a pure function: given a schedule (GPipe, 1F1B, interleaved 1F1B),
the pipeline degree, the micro-batches per step and the time of one micro-batch's forward and
backward on one (virtual) stage, it orders each rank's work as the schedule does and lets every
operation start when its rank is free and its input is ready (the previous stage's forward,
the next stage's backward). Idle time between 0 and the end of the step is the bubble.
Times in seconds; no torch.

Dependency rules (stage s = chunk·pp + rank, S = pp·vpp stages): F(s, i) after F(s-1, i);
B(S-1, i) after F(S-1, i); B(s, i) after B(s+1, i).
"""

from __future__ import annotations

from typing import NamedTuple

from plait.errors import PlaitError
from plait.plan.cost import bubble_fraction
from plait.plan.terms.items import STAGE_WORK_ITEMS

FORWARD, BACKWARD, BUBBLE = "forward", "backward", "bubble"
DRAWN_SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")


class Interval(NamedTuple):
    """One interval of one rank's timeline; seconds from the start of the step."""

    rank: int
    start: float
    end: float
    kind: str  # forward | backward | bubble
    microbatch: int  # -1 for a bubble
    stage: int = -1  # virtual stage (chunk·pp + rank); -1 for a bubble


def _order_1f1b(rank: int, pp: int, m: int) -> list[tuple[str, int, int]]:
    warmup = min(pp - rank - 1, m)
    ops = [(FORWARD, 0, i) for i in range(warmup)]
    for i in range(m - warmup):
        ops += [(FORWARD, 0, warmup + i), (BACKWARD, 0, i)]
    ops += [(BACKWARD, 0, i) for i in range(m - warmup, m)]
    return ops


def _order_gpipe(m: int) -> list[tuple[str, int, int]]:
    return [(FORWARD, 0, i) for i in range(m)] + [(BACKWARD, 0, i) for i in range(m)]


def _order_interleaved(rank: int, pp: int, m: int, vpp: int) -> list[tuple[str, int, int]]:
    """Megatron's interleaved 1F1B: groups of pp micro-batches go through chunk 0, 1, ...; the
    backward visits the chunks in reverse."""
    total = m * vpp

    def microbatch(k: int) -> int:
        return (k // (pp * vpp)) * pp + k % pp

    def forward(k: int) -> tuple[str, int, int]:
        return FORWARD, (k // pp) % vpp, microbatch(k)

    def backward(k: int) -> tuple[str, int, int]:
        return BACKWARD, vpp - 1 - (k // pp) % vpp, microbatch(k)

    warmup = total if m == pp else min((pp - rank - 1) * 2 + (vpp - 1) * pp, total)
    ops = [forward(k) for k in range(warmup)]
    for k in range(total - warmup):
        ops += [forward(warmup + k), backward(k)]
    ops += [backward(k) for k in range(total - warmup, total)]
    return ops


def rank_orders(schedule: str, pp: int, micro_batches: int, vpp: int = 1) -> list[list[tuple[str, int, int]]]:
    """Each rank's operations in schedule order, as (kind, chunk, micro-batch)."""
    if schedule not in DRAWN_SCHEDULES:
        raise PlaitError(f"the timeline draws {', '.join(DRAWN_SCHEDULES)}; schedule {schedule!r} is not drawn")
    if pp < 1 or micro_batches < 1 or vpp < 1:
        raise PlaitError(f"timeline needs pp, micro-batches and vpp >= 1 (got {pp}, {micro_batches}, {vpp})")
    if schedule == "interleaved-1f1b":
        if micro_batches % pp:
            raise PlaitError(f"interleaved-1f1b needs micro-batches ({micro_batches}) to be a multiple of pp={pp}")
        return [_order_interleaved(r, pp, micro_batches, vpp) for r in range(pp)]
    if vpp != 1:
        raise PlaitError(f"schedule {schedule} has one stage per rank (vpp=1), got vpp={vpp}")
    if schedule == "gpipe":
        return [_order_gpipe(micro_batches) for _ in range(pp)]
    return [_order_1f1b(r, pp, micro_batches) for r in range(pp)]


def pipeline_timeline(schedule: str, pp: int, micro_batches: int, forward_s: float, backward_s: float,
                      vpp: int = 1) -> list[Interval]:
    """Forward, backward and bubble intervals of every rank for one optimizer step.

    ``forward_s`` / ``backward_s``: seconds of one micro-batch on one virtual stage.
    """
    if forward_s <= 0 or backward_s <= 0:
        raise PlaitError(f"timeline needs positive forward and backward times (got {forward_s}, {backward_s})")
    orders = rank_orders(schedule, pp, micro_batches, vpp)
    n_stages = pp * vpp
    done: dict[tuple[str, int, int], float] = {}  # (kind, stage, micro-batch) -> end time
    free = [0.0] * pp
    position = [0] * pp
    busy: list[Interval] = []
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for rank, order in enumerate(orders):
            while position[rank] < len(order):
                kind, chunk, mb = order[position[rank]]
                stage = chunk * pp + rank
                if kind == FORWARD:
                    dep = (FORWARD, stage - 1, mb) if stage > 0 else None
                else:
                    dep = (BACKWARD, stage + 1, mb) if stage < n_stages - 1 else (FORWARD, stage, mb)
                if dep is not None and dep not in done:
                    break
                start = max(free[rank], done[dep] if dep is not None else 0.0)
                end = start + (forward_s if kind == FORWARD else backward_s)
                done[(kind, stage, mb)] = end
                busy.append(Interval(rank, start, end, kind, mb, stage))
                free[rank] = end
                position[rank] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # an order that waits on itself: a bug in the orders above
            raise RuntimeError(f"schedule {schedule} deadlocks for pp={pp}, m={micro_batches}, vpp={vpp}")
    return busy + _bubbles(busy, pp)


def _bubbles(busy: list[Interval], pp: int) -> list[Interval]:
    makespan = max(i.end for i in busy)
    out = []
    for rank in range(pp):
        cursor = 0.0
        for interval in sorted((i for i in busy if i.rank == rank), key=lambda i: i.start):
            if interval.start > cursor + 1e-12:
                out.append(Interval(rank, cursor, interval.start, BUBBLE, -1))
            cursor = max(cursor, interval.end)
        if makespan > cursor + 1e-12:
            out.append(Interval(rank, cursor, makespan, BUBBLE, -1))
    return out


def timeline_bubble_fraction(intervals: list[Interval]) -> float:
    """Bubble time over busy time, summed over ranks (the planner's (p-1)/m for 1F1B and GPipe)."""
    bubble = sum(i.end - i.start for i in intervals if i.kind == BUBBLE)
    work = sum(i.end - i.start for i in intervals if i.kind != BUBBLE)
    return bubble / work


def plan_microbatch_times(plan) -> tuple[float, float]:
    """(forward, backward) seconds of one micro-batch on one virtual stage, from the planner.

    The planner's pipeline time per micro-batch is its bubble over (bubble fraction · m) when
    pp > 1 (the stage average it uses), else the per-micro-batch share of the critical-path
    items. Forward:backward = 1:2 (the FLOP ratio of a layer); recomputation goes to backward.
    """
    step, layout = plan.step, plan.layout
    m = layout.micro_batches(plan.job.global_batch)
    fraction = bubble_fraction(layout.schedule, layout.pp, m, layout.vpp) if layout.pp > 1 else 0.0
    if fraction > 0 and step.bubble > 0:
        per_mb = step.bubble / (fraction * m)
    else:
        per_mb = sum(getattr(step, name) for name in STAGE_WORK_ITEMS) / m
    recompute = step.recompute / m
    base = max(per_mb - recompute, 1e-12)
    chunk = 1.0 / layout.vpp
    return base / 3 * chunk, (2 * base / 3 + recompute) * chunk


def plan_timeline(plan) -> list[Interval]:
    """The timeline of a plan's pipeline schedule with the planner's per-micro-batch times."""
    layout = plan.layout
    forward_s, backward_s = plan_microbatch_times(plan)
    schedule = layout.schedule if layout.pp > 1 else "1f1b"
    return pipeline_timeline(schedule, layout.pp, layout.micro_batches(plan.job.global_batch),
                             forward_s, backward_s, layout.vpp if layout.pp > 1 else 1)


def busy_spans(intervals: list[Interval]) -> list[tuple[float, float]]:
    """Maximal spans (seconds) in which no rank idles: the schedule's steady state, bubble-free."""
    makespan = max(i.end for i in intervals)
    spans, cursor = [], 0.0
    for start, end in sorted((i.start, i.end) for i in intervals if i.kind == BUBBLE):
        if start > cursor + 1e-12:
            spans.append((cursor, start))
        cursor = max(cursor, end)
    if makespan > cursor + 1e-12:
        spans.append((cursor, makespan))
    return spans


MAX_UNBROKEN_OPS = 48  # forward and backward operations per rank drawn without a break


def timeline_windows(intervals: list[Interval], keep_cycles: float = 2.0,
                     max_unbroken_ops: int = MAX_UNBROKEN_OPS) -> list[tuple[float, float]]:
    """The parts of the step to draw (seconds from its start), in order: the whole step, or, when
    a rank has more than ``max_unbroken_ops`` operations (many micro-batches) and a bubble-free
    stretch is long, everything but the middle of that stretch.

    Each busy span (``busy_spans``) keeps ``keep_cycles`` cycles (one forward and one backward of
    the longest operations) after its start and before its end; what lies between is hidden when
    it is longer than three such margins. 1F1B then shows warm-up, the start and end of the steady
    state, and cool-down with one break; GPipe's forward and backward phases get one break each.
    """
    forward = max((i.end - i.start for i in intervals if i.kind == FORWARD), default=0.0)
    backward = max((i.end - i.start for i in intervals if i.kind == BACKWARD), default=0.0)
    margin = keep_cycles * (forward + backward)
    makespan = max(i.end for i in intervals)
    ops = max(sum(1 for i in intervals if i.rank == rank and i.kind != BUBBLE) for rank in {i.rank for i in intervals})
    if ops <= max_unbroken_ops:
        return [(0.0, makespan)]
    windows, cursor = [], 0.0
    for start, end in busy_spans(intervals):
        if end - start - 2 * margin > 3 * margin > 0:
            windows.append((cursor, start + margin))
            cursor = end - margin
    windows.append((cursor, makespan))
    return windows


def hidden_spans(windows: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The breaks between consecutive windows (seconds)."""
    return [(a[1], b[0]) for a, b in zip(windows, windows[1:])]
