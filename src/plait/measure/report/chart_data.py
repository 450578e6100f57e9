"""What the report's and ``plait plan --plot``'s charts draw, computed apart from the drawing (no
matplotlib, no torch) so that tests check the numbers behind a picture, not its pixels.

  memory_axis     the unit and the end of a memory axis, scaled to what is plotted
  waterfall_bars  a step time's items as a waterfall: each bar starts where the previous ended
  step_spread     min and max of a measured step time, as error-bar lengths
  duration        seconds as text in s, ms or µs
  measured_mfu    a swept layout's measured MFU; on a CPU, against the calibration's measured peak
"""

from __future__ import annotations

from typing import NamedTuple

from plait.spec.units import GIB, MIB

CAPACITY_SHOWN_ABOVE = 0.25  # draw the capacity line when the largest bar reaches this fraction of it
AXIS_MARGIN = 1.1  # the axis ends this factor beyond the largest value drawn


class MemoryAxis(NamedTuple):
    unit: str  # "GiB" or "MiB"
    unit_bytes: int
    limit_bytes: float  # where the axis ends
    show_capacity: bool  # whether the capacity line lies on the axis


def memory_axis(values_bytes: list[float], capacity_bytes: float | None) -> MemoryAxis:
    """The axis for bars and markers of ``values_bytes`` against ``capacity_bytes`` (None: no capacity).

    The capacity line is drawn, and the axis reaches it, when the largest value is at least
    ``CAPACITY_SHOWN_ABOVE`` of it (a layout near or over its memory); otherwise the axis ends
    ``AXIS_MARGIN`` beyond the largest value and the capacity is only named, so that a 1 MiB model
    is not drawn as a hairline against an 80 GiB axis. MiB below 1 GiB, else GiB.
    """
    largest = max([v for v in values_bytes if v is not None and v > 0], default=0.0)
    show = bool(capacity_bytes) and largest >= CAPACITY_SHOWN_ABOVE * capacity_bytes
    limit = AXIS_MARGIN * max(largest, capacity_bytes if show else 0.0) or MIB
    unit, unit_bytes = ("GiB", GIB) if limit >= GIB else ("MiB", MIB)
    return MemoryAxis(unit, unit_bytes, limit, show)


class WaterfallBar(NamedTuple):
    label: str
    start: float  # seconds
    width: float  # seconds (negative only for an "overlap" bar taking time back)


def waterfall_bars(items: dict[str, float], step_time: float) -> list[WaterfallBar]:
    """The non-zero ``items`` (seconds on the critical path) in order, each starting where the
    previous one ended, then a bar for the whole step from 0. When the items do not add up to
    ``step_time`` (a cost model that overlaps some of them), a bar "not itemized" (or "overlap",
    negative) of the difference precedes the total, so the last item bar always ends at the step time."""
    bars, cursor = [], 0.0
    for name, seconds in items.items():
        if seconds > 0:
            bars.append(WaterfallBar(name.replace("_", " "), cursor, seconds))
            cursor += seconds
    rest = step_time - cursor
    if abs(rest) > 1e-9 * max(step_time, 1e-30):
        bars.append(WaterfallBar("not itemized" if rest > 0 else "overlap", cursor, rest))
    bars.append(WaterfallBar("step time", 0.0, step_time))
    return bars


def step_spread(median_s: float | None, low_s: float | None, high_s: float | None) -> tuple[float, float] | None:
    """(below, above): the lengths of an error bar from the median to the min and to the max step
    time (seconds), or None when the sweep recorded no spread for the layout."""
    if median_s is None or low_s is None or high_s is None:
        return None
    return max(0.0, median_s - low_s), max(0.0, high_s - median_s)


def duration(seconds: float) -> str:
    """``seconds`` as "17.62 s", "23.50 ms" or "412.0 µs" (the unit in which it reads 1 to 999)."""
    if seconds >= 1.0:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} µs"


def measured_mfu(row) -> float | None:
    """The measured MFU of sweep row ``row`` (a fraction): the run's own; for a CPU run, which has no
    GPU peak, the predicted MFU times predicted over measured step time. Both MFUs divide the same
    model FLOPs per step by the same peak - the FLOP/s of the sweep's calibration, a CPU profile's
    measured rate - so MFU_measured = FLOPs / (t_measured · peak) = MFU_predicted · t_predicted / t_measured.
    None when the row has neither (a CPU sweep without a calibration records no prediction)."""
    if row.measured_mfu is not None:
        return row.measured_mfu
    if row.device == "cpu" and row.predicted_mfu and row.predicted_step_time_s and row.measured_step_time_s:
        return row.predicted_mfu * row.predicted_step_time_s / row.measured_step_time_s
    return None
