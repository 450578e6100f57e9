"""One plan as a picture (``plait plan --plot``, ``plait report --plan``): the planner's itemized
memory of every pipeline stage against the GPU's capacity, and the step time as a waterfall of its
critical-path items (compute, exposed communication by kind, bubble, recompute, offload, ...).
matplotlib (Agg), imported only when a picture is drawn; no torch.
"""

from __future__ import annotations

from pathlib import Path

from plait.atomic import atomic_output
from plait.errors import PlaitError
from plait.measure.report.chart_data import memory_axis, waterfall_bars
from plait.plan.memory import OVERHEAD_ITEMS, MemoryBreakdown
from plait.plan.plan import Plan
from plait.spec.units import GIB

FORMATS = ("png", "svg", "pdf")
ITEM_COLORS = ("#4C72B0", "#55A868", "#C44E52", "#8172B2", "#CCB974", "#64B5CD", "#DD8452", "#937860",
               "#DA8BC3", "#8C8C8C", "#6B8E23")


def require_matplotlib(what: str):
    """matplotlib's pyplot on the Agg backend, or a PlaitError naming the pip command."""
    try:
        import matplotlib
    except ImportError:
        raise PlaitError(f"{what} draws with matplotlib, which is not installed: pip install matplotlib "
                         "(or install plait with the [cpu] or [gpu] extra)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def picture_format(path: str | Path) -> str:
    """The image format named by ``path``'s suffix; PlaitError for another suffix."""
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix not in FORMATS:
        raise PlaitError(f"--plot {path}: give a file name ending in " + ", ".join(f".{f}" for f in FORMATS))
    return suffix


def save_figure(fig, path: str | Path) -> Path:
    """Write ``fig`` atomically to ``path`` (format from the suffix) and close it."""
    import matplotlib.pyplot as plt

    try:
        with atomic_output(path, "wb") as handle:
            fig.savefig(handle, format=picture_format(path), dpi=110)
    except OSError as exc:
        raise PlaitError(f"cannot write the picture {path}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)
    return Path(path)


def draw_stage_memory(ax, stages: list[MemoryBreakdown], gpu_name: str) -> None:
    """Stacked bars of each stage's memory items (hatched: outside the allocator's count) against
    the capacity line, on an axis scaled by ``chart_data.memory_axis``."""
    items = [s.items() for s in stages]
    present = [n for n in items[0] if any(i.get(n, 0) > 0 for i in items)]
    names = [n for n in present if n not in OVERHEAD_ITEMS] + [n for n in present if n in OVERHEAD_ITEMS]
    capacity = stages[0].capacity
    axis = memory_axis([s.total for s in stages], capacity)
    x = list(range(len(stages)))
    bottom = [0.0] * len(stages)
    for index, name in enumerate(names):
        heights = [i.get(name, 0.0) / axis.unit_bytes for i in items]
        overhead = name in OVERHEAD_ITEMS
        color = ITEM_COLORS[index % len(ITEM_COLORS)]
        ax.bar(x, heights, bottom=bottom, width=0.7, label=name.replace("_", " "),
               color="white" if overhead else color, edgecolor=color, hatch="///" if overhead else None)
        bottom = [a + b for a, b in zip(bottom, heights)]
    cap = capacity / axis.unit_bytes
    if axis.show_capacity:
        ax.axhline(cap, color="black", linestyle="--", linewidth=1, label=f"capacity {cap:.0f} {axis.unit}")
    ax.set_ylim(0, axis.limit_bytes / axis.unit_bytes)
    label = "pipeline stage" if len(stages) > 1 else "(no pipeline: every GPU alike)"
    ax.set_xticks(x, [s.stage if len(stages) > 1 else "all" for s in stages],
                  fontsize=7 if len(stages) <= 32 else 5)
    ax.set_xlabel(label)
    ax.set_ylabel(f"{axis.unit} per GPU")
    title = f"Memory per GPU by stage ({gpu_name}, {capacity / GIB:.0f} GiB)"
    if not axis.show_capacity:
        title += f"\ncapacity {capacity / GIB:.0f} GiB is off the axis (the largest stage uses " \
                 f"{100 * max(s.total for s in stages) / capacity:.1f}%)"
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.grid(axis="y", alpha=0.3)


def time_unit(seconds: float) -> tuple[str, float]:
    """("s", 1), ("ms", 1e-3) or ("µs", 1e-6): the unit in which ``seconds`` reads as 1 to 999."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3)):
        if seconds >= scale:
            return unit, scale
    return "µs", 1e-6


def draw_waterfall(ax, plan: Plan) -> None:
    """Horizontal waterfall of the critical-path items, the whole step last."""
    step = plan.step.step_time
    bars = waterfall_bars(plan.step.items(), step)
    unit, scale = time_unit(step)
    y = list(range(len(bars)))
    colors = ["#333333" if b.label == "step time" else ITEM_COLORS[i % len(ITEM_COLORS)] for i, b in enumerate(bars)]
    ax.barh(y, [b.width / scale for b in bars], left=[b.start / scale for b in bars], color=colors, height=0.6)
    for yi, b in zip(y, bars):
        ax.text((b.start + max(b.width, 0)) / scale + 0.01 * step / scale, yi,
                f"{b.width / scale:.3g} {unit} ({100 * b.width / step:.1f}%)", va="center", fontsize=7)
    ax.set_yticks(y, [b.label for b in bars], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, step / scale * 1.4)
    ax.set_xlabel(f"{unit} per optimizer step (critical path)")
    ax.set_title(f"Step time {step / scale:.3g} {unit}: {plan.step.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, "
                 f"MFU {100 * plan.step.mfu:.1f}%, bottleneck {plan.step.bottleneck.replace('_', ' ')}", fontsize=9)
    ax.grid(axis="x", alpha=0.3)


def plan_plot(plan: Plan, stages: list[MemoryBreakdown], path: str | Path, pricing: str = "") -> Path:
    """The memory-by-stage and step-time-waterfall panels of one plan, written to ``path``;
    ``pricing`` (how the plan was priced, ``plait report``) is a second title line."""
    picture_format(path)
    plt = require_matplotlib("plait plan --plot")
    fig, (memory_ax, time_ax) = plt.subplots(1, 2, figsize=(14, 5.2), gridspec_kw={"width_ratios": [1.1, 1.0],
                                                                                     "wspace": 0.6})
    draw_stage_memory(memory_ax, stages, plan.cluster.gpu.name)
    draw_waterfall(time_ax, plan)
    m = plan.layout.micro_batches(plan.job.global_batch)
    fig.suptitle(f"{plan.model.name}: {plan.layout} on {plan.cluster.n_gpus} x {plan.cluster.gpu.name}, global batch "
                 f"{plan.job.global_batch} x {plan.job.seq_len} tokens, {m} micro-batch{'es' if m > 1 else ''}"
                 + ("" if plan.fits else "  -  DOES NOT FIT") + (f"\npriced with: {pricing}" if pricing else ""),
                 fontsize=10)
    fig.subplots_adjust(left=0.06, right=0.97, bottom=0.12, top=0.78 if pricing else 0.82)
    return save_figure(fig, path)
