"""The report's plots, as PNG files (matplotlib, Agg backend: no display needed). No torch.

Each function writes one figure and returns its path, or None when there is nothing to draw
(the report then says why instead of showing an empty plot).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from plait.measure.report.chart_data import measured_mfu, memory_axis, step_spread
from plait.measure.sweep.csv_file import SweepRow
from plait.measure.report.timeline import BACKWARD, BUBBLE, FORWARD, Interval
from plait.plan.memory import OVERHEAD_ITEMS, allocated_bytes
from plait.spec.units import GIB

COLORS = {FORWARD: "#4C72B0", BACKWARD: "#DD8452", BUBBLE: "#DDDDDD"}
ITEM_COLORS = ("#4C72B0", "#55A868", "#C44E52", "#8172B2", "#CCB974", "#64B5CD", "#DD8452", "#937860",
               "#DA8BC3", "#8C8C8C")


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _short(label: str) -> str:
    """Layout strings without the degrees that are 1, for axis labels."""
    parts = [p for p in label.split(",") if p not in ("tp=1", "pp=1", "cp=1", "dp=1")]
    return ",".join(parts) or label


def row_label(row: SweepRow) -> str:
    """A row's short layout, with " +compile" for a compiled run (its eager twin has the same layout)."""
    return _short(row.layout) + (" +compile" if row.compile else "")


def spread_errors(rows: list[SweepRow]) -> list[list[float]] | None:
    """matplotlib's ``yerr`` (below, above) of the rows' measured step times: median to the fastest
    and to the slowest steady-state step (0 where a row has no spread); None when no row has one."""
    spreads = [step_spread(r.measured_step_time_s, r.step_time_min_s, r.step_time_max_s)
               for r in rows]
    if all(s is None for s in spreads):
        return None
    return [[s[0] if s else 0.0 for s in spreads], [s[1] if s else 0.0 for s in spreads]]


def device_label(rows: list[SweepRow]) -> str:
    """What the rows' predictions are for: the GPU preset, else (a CPU sweep with a calibration) the CPU."""
    gpu = next((r.gpu for r in rows if r.gpu), "")
    if gpu:
        return gpu
    return "CPU, the calibration's prediction" if any(r.device == "cpu" for r in rows) else "device not recorded"


def step_time_plot(rows: list[SweepRow], path: Path) -> Path | None:
    """Predicted vs measured step time with the y = x line; without predictions (a CPU sweep),
    the measured step time of each layout in the planner's order. Whiskers: the fastest and the
    slowest steady-state step around the median (when the sweep recorded them)."""
    ok = [r for r in rows if r.status == "ok" and r.measured_step_time_s is not None]
    pairs = [r for r in ok if r.predicted_step_time_s is not None]
    if not ok:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4.8))
    if pairs:
        x = [r.predicted_step_time_s for r in pairs]
        y = [r.measured_step_time_s for r in pairs]
        errors = spread_errors(pairs)
        ax.scatter(x, y, color=COLORS[FORWARD], zorder=3)
        extent = x + y
        if errors:
            ax.errorbar(x, y, yerr=errors, fmt="none", ecolor="black", capsize=3, linewidth=1, zorder=4,
                        label="fastest to slowest step")
            extent += [m + e for m, e in zip(y, errors[1])] + [m - e for m, e in zip(y, errors[0])]
        for r, xi, yi in zip(pairs, x, y):
            ax.annotate(row_label(r), (xi, yi), fontsize=7, xytext=(3, 3), textcoords="offset points")
        low, high = min(extent) * 0.9, max(extent) * 1.1
        ax.plot([low, high], [low, high], color="gray", linestyle="--", label="y = x (perfect prediction)")
        ax.set_xlim(low, high)
        ax.set_ylim(low, high)
        ax.set_xlabel("predicted step time (s)")
        ax.set_ylabel("measured step time (s)")
        ax.set_title(f"Step time: predicted vs measured ({device_label(pairs)})")
        ax.legend(loc="upper left", fontsize=8)
    else:
        ordered = sorted(ok, key=lambda r: (r.planner_rank is None, r.planner_rank or 0))
        labels = [f"#{r.planner_rank} {row_label(r)}" if r.planner_rank else row_label(r) for r in ordered]
        errors = spread_errors(ordered)
        ax.bar(range(len(ordered)), [r.measured_step_time_s for r in ordered], color=COLORS[FORWARD],
               yerr=errors, capsize=4, error_kw={"linewidth": 1})
        ax.set_xticks(range(len(ordered)), labels, rotation=30, ha="right", fontsize=7)
        ax.set_ylabel("measured step time (s)")
        ax.set_title("Measured step time in the planner's order" + (": median, whiskers fastest to slowest step"
                                                                     if errors else "")
                     + "\n(no predictions recorded: CPU sweep, not comparable with GPU predictions)", fontsize=9)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def mfu_plot(rows: list[SweepRow], path: Path) -> Path | None:
    """Predicted and measured MFU per layout (grouped bars; a CPU run's measured MFU against the
    calibration's peak: ``chart_data.measured_mfu``); None when no MFU is known."""
    measured = {id(r): measured_mfu(r) for r in rows}
    shown = [r for r in rows if r.predicted_mfu is not None or measured[id(r)] is not None]
    if not shown:
        return None
    fig, ax = plt.subplots(figsize=(max(6.4, 0.8 * len(shown)), 4.4))
    positions = range(len(shown))
    width = 0.4
    ax.bar([p - width / 2 for p in positions], [100 * (r.predicted_mfu or 0) for r in shown], width,
           label="predicted", color="#AAAAAA")
    ax.bar([p + width / 2 for p in positions], [100 * (measured[id(r)] or 0) for r in shown], width,
           label="measured", color=COLORS[FORWARD])
    ax.set_xticks(list(positions), [row_label(r) for r in shown], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("MFU (%)")
    cpu = all(r.device == "cpu" for r in shown)
    ax.set_title("MFU per layout (a missing bar: not known)"
                 + ("\nCPU: against the calibration's measured FLOP/s per process, not a GPU's peak" if cpu else ""),
                 fontsize=9 if cpu else None)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def memory_plot(entries: list[tuple[str, dict[str, float], float | None, float | None, str]], path: Path,
                title: str, per: str = "GPU (most loaded)") -> Path | None:
    """Stacked bars of the planner's itemized memory per layout against the capacity line.

    ``entries``: (label, items in bytes, capacity bytes or None, measured bytes or None, memory kind).
    The items the allocator does not count (``OVERHEAD_ITEMS``: CUDA context, NCCL buffers,
    fragmentation) are hatched and drawn last; a black tick marks the predicted allocated level,
    the one to compare with a measured ``max_memory_allocated`` (diamond). Host RSS of a CPU run
    (circle) is a different quantity, drawn for reference. The axis (unit, end, whether the
    capacity is on it) is ``chart_data.memory_axis`` of everything drawn.
    """
    if not entries:
        return None
    present = [n for n in entries[0][1] if any(e[1].get(n, 0) > 0 for e in entries)]
    names = [n for n in present if n not in OVERHEAD_ITEMS] + [n for n in present if n in OVERHEAD_ITEMS]
    capacity = entries[0][2]
    axis = memory_axis([sum(e[1].values()) for e in entries] + [e[3] for e in entries], capacity)
    unit = axis.unit_bytes
    fig, ax = plt.subplots(figsize=(8.0, max(3.0, 0.5 * len(entries) + 1.8)))
    y = list(range(len(entries)))
    left = [0.0] * len(entries)
    for index, name in enumerate(names):
        widths = [e[1].get(name, 0.0) / unit for e in entries]
        overhead = name in OVERHEAD_ITEMS
        ax.barh(y, widths, left=left, label=name.replace("_", " ") + (" (not allocated)" if overhead else ""),
                color="white" if overhead else ITEM_COLORS[index % len(ITEM_COLORS)],
                edgecolor=ITEM_COLORS[index % len(ITEM_COLORS)], hatch="///" if overhead else None)
        left = [a + b for a, b in zip(left, widths)]
    if any(n in OVERHEAD_ITEMS for n in names):
        ax.scatter([allocated_bytes(e[1]) / unit for e in entries], y, marker="|", s=400, color="black", zorder=4,
                   label="predicted allocated")
    if capacity and axis.show_capacity:
        ax.axvline(capacity / unit, color="black", linestyle="--", label=f"capacity {capacity / GIB:.0f} GiB")
    elif capacity:
        title += f"\n(capacity {capacity / GIB:.0f} GiB is off the axis: the largest bar is " \
                 f"{100 * max(sum(e[1].values()) for e in entries) / capacity:.1f}% of it)"
    for kind, marker, face, label in (("cuda_allocated", "D", "black", "measured max_memory_allocated"),
                                      ("host_tensors", "s", "black", "counted peak tensor bytes per process"),
                                      ("host_rss", "o", "none", "measured peak host RSS per process")):
        points = [(i, e[3] / unit) for i, e in enumerate(entries) if e[3] is not None and e[4] == kind]
        if points:
            ax.scatter([m for _, m in points], [i for i, _ in points], marker=marker, facecolors=face,
                       edgecolors="black", zorder=5, label=label)
    ax.set_yticks(y, [_short(e[0].replace(" +compile", "")) + (" +compile" if e[0].endswith(" +compile") else "")
                      for e in entries], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, axis.limit_bytes / unit)
    ax.set_xlabel(f"{axis.unit} per {per}")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return _save(fig, path)


def timeline_plot(intervals: list[Interval], path: Path, title: str,
                  windows: list[tuple[float, float]] | None = None) -> Path:
    """One row per rank: forward, backward and bubble intervals, micro-batch numbers on the bars.

    ``windows``: the parts of the step to draw (``timeline.timeline_windows``; default: all of it),
    side by side on a broken time axis with a break mark (//) where a stretch is left out.
    """
    ranks = sorted({i.rank for i in intervals})
    windows = windows or [(0.0, max(i.end for i in intervals))]
    shown = [i for i in intervals if any(i.start < b and i.end > a for a, b in windows)]
    label_bars = sum(i.kind != BUBBLE for i in shown) <= 160
    fig, axes = plt.subplots(1, len(windows), sharey=True, squeeze=False, figsize=(10, 0.6 * len(ranks) + 1.8),
                             gridspec_kw={"width_ratios": [b - a for a, b in windows], "wspace": 0.04})
    axes = list(axes[0])
    for ax, (low, high) in zip(axes, windows):
        for kind in (BUBBLE, FORWARD, BACKWARD):
            for rank in ranks:
                spans = [(i.start, i.end - i.start) for i in shown
                         if i.rank == rank and i.kind == kind and i.start < high and i.end > low]
                if spans:
                    ax.broken_barh(spans, (rank - 0.4, 0.8), facecolors=COLORS[kind], edgecolor="white",
                                   linewidth=0.5)
        if label_bars:
            for i in shown:
                middle = (i.start + i.end) / 2
                if i.kind != BUBBLE and low <= i.start + 1e-12 and i.end <= high + 1e-12:  # whole bars only
                    ax.text(middle, i.rank, str(i.microbatch), ha="center", va="center", fontsize=6, color="white")
        ax.set_xlim(low, high)
    for left, right in zip(axes, axes[1:]):  # break marks: the time axis jumps here
        left.spines["right"].set_visible(False)
        right.spines["left"].set_visible(False)
        right.tick_params(axis="y", left=False)
        for ax, x in ((left, 1.0), (right, 0.0)):  # a slash of fixed size in points, whatever the panel's width
            ax.plot([x, x], [0.0, 1.0], transform=ax.transAxes, marker=[(-0.5, -1), (0.5, 1)], markersize=10,
                    linestyle="none", color="black", mec="black", mew=1, clip_on=False)
    for kind in (FORWARD, BACKWARD, BUBBLE):
        axes[0].bar(0, 0, color=COLORS[kind], label=kind)
    axes[0].set_yticks(ranks, [f"rank {r}" for r in ranks])
    axes[0].invert_yaxis()
    height = fig.get_figheight()  # margins in inches, whatever the number of ranks
    fig.suptitle(title, fontsize=9, y=1 - 0.1 / height, va="top")
    fig.legend(*axes[0].get_legend_handles_labels(), fontsize=7, loc="upper center", ncol=3, frameon=False,
               bbox_to_anchor=(0.5, 1 - 0.35 / height))
    fig.supxlabel("time in the step (s)" + ("; // marks a stretch of steady state left out" if len(axes) > 1 else ""),
                  fontsize=8, y=0.08 / height, va="bottom")
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.65 / height, top=1 - 0.7 / height)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
