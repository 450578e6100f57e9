"""The sections of ``plait report``: text, tables and plots built from sweep rows, plans and
published runs."""

from __future__ import annotations

from pathlib import Path

from plait.measure.report.chart_data import duration, measured_mfu
from plait.measure.report.render import Section, Table
from plait.measure.sweep.csv_file import SweepRow
from plait.measure.sweep.stats import top1_text
from plait.plan.memory import OVERHEAD_ITEMS, allocated_bytes
from plait.plan.plan import Plan
from plait.spec.hardware import ClusterSpec
from plait.spec.units import GIB


def _num(value, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


def _pct(value: float | None, sign: bool = True) -> str:
    return "" if value is None else (f"{100 * value:+.1f}%" if sign else f"{100 * value:.1f}%")


def summary_section(rows: list[SweepRow], summary: dict, csv_path: Path, calibration_note: str = "",
                    warnings: list[str] | tuple[str, ...] = ()) -> Section:
    first = rows[0]
    counts = ", ".join(f"{n} {s}" for s, n in summary["by_status"].items() if n)
    paragraphs = [(f"Sweep {csv_path.name}: model {first.model}, global batch {first.global_batch} × "
                   f"{first.seq_len} tokens, {first.nproc_per_node} processes, {first.steps} steps per layout; "
                   f"{len(rows)} layouts ({counts}).")]
    rho = summary["rank_correlation"]
    rows_out = [("Spearman rank correlation", (f"{rho['spearman']:+.3f}" if rho["spearman"] is not None else "n/a")
                 + f" over {rho['n']} layouts ({rho['basis']})")]
    for key, label in (("step_time_error", "step-time error"), ("memory_error", "memory error"),
                       ("mfu_error", "MFU error")):
        e = summary[key]
        rows_out.append((label, f"median |err| {100 * e['median_abs']:.1f}%, mean |err| {100 * e['mean_abs']:.1f}% "
                                f"over {e['n']} layouts" if e["n"] else "n/a (nothing comparable)"))
    for check in summary.get("top1_checks", []):
        rows_out.append(("planner's top-1" + (" (compiled)" if check["compile"] else ""),
                         top1_text(check, summary["top1_tolerance"])))
    if calibration_note:
        rows_out.append(("cost parameters", calibration_note))
    if summary.get("why_none_ran"):
        rows_out.append(("why no layout ran", "; ".join(f"{n} × {r}" for r, n in summary["why_none_ran"].items())))
    notes = [f"warning: {w}" for w in warnings] + ([summary["note"]] if summary["note"] else [])
    return Section("Summary", paragraphs, Table(("what", "value"), tuple(rows_out), (0, 1)), notes=notes)


def mfu_section(rows: list[SweepRow], path: Path) -> Section:
    """Predicted and measured MFU per layout; on a CPU, measured against the calibration's FLOP/s, and
    without one, why there is no MFU (instead of an empty chart)."""
    from plait.measure.report import plots

    image = plots.mfu_plot(rows, path)
    cpu = [r for r in rows if r.device == "cpu" and r.status == "ok"]
    notes = []
    if image is not None and cpu and any(measured_mfu(r) is not None for r in cpu):
        notes.append("CPU runs: measured MFU = the model's FLOPs per step / (measured step time × the FLOP/s of the "
                     "sweep's calibration, a CPU profile), the peak the predictions use; not comparable with a GPU's "
                     "MFU.")
    missing = ""
    if image is None:
        missing = ("no MFU: a CPU run has no peak FLOP/s to measure MFU against until a CPU profile measures one "
                   "(plait profile --device cpu --out cal.json, then plait sweep --calibration cal.json)"
                   if cpu else "no MFU known: no layout recorded a predicted or measured MFU")
    return Section("MFU per layout", [], image=image, missing=missing, notes=notes)


def rows_section(rows: list[SweepRow]) -> Section:
    header = ("layout", "status", "planner rank", "pred s/step", "meas s/step", "meas range s", "step err",
              "pred mem GiB",
              "meas mem GiB", "memory kind", "pred MFU", "meas MFU", "tokens/s", "reason")
    body = []
    for r in rows:
        body.append((
            r.layout + (" +compile" if r.compile else ""), r.status,
            "predicted OOM" if r.predicted_fits is False else _num(r.planner_rank, "d"),
            _num(r.predicted_step_time_s, ".4f"), _num(r.measured_step_time_s, ".4f"),
            f"{r.step_time_min_s:.4f}-{r.step_time_max_s:.4f}"
            if r.step_time_min_s is not None and r.step_time_max_s is not None else "",
            _pct(r.step_time_error),
            _num(r.predicted_memory_bytes / GIB if r.predicted_memory_bytes is not None else None, ".2f"),
            _num(r.measured_memory_bytes / GIB if r.measured_memory_bytes is not None else None, ".2f"),
            r.memory_kind, _pct(r.predicted_mfu, False), _pct(measured_mfu(r), False), _num(r.tokens_per_s, ",.0f"),
            r.reason))
    return Section("Layouts", [("Errors are measured / predicted - 1; meas s/step is the median of the steady-state "
                                "steps, meas range their fastest and slowest. Planner ranks cover the layouts the "
                                "planner predicts fit (a layout with and without compile is priced and "
                                "ranked apart: compiled blocks' fused element-wise work). Memory kind host_tensors is a CPU process's counted peak of tensor "
                                "bytes, comparable with a prediction for the CPU of a CPU profile; host_rss "
                                "(older sweeps) is its peak resident memory, not comparable with the prediction.")],
                   Table(header, tuple(body), (0, 1, 9, 13)))


def memory_section(plans: list[tuple[SweepRow, Plan]], cluster: ClusterSpec, cluster_note: str,
                   path: Path) -> Section:
    from plait.measure.report import plots

    title = "Memory per GPU: the planner's items against capacity"
    if not plans:
        return Section(title, [], missing="no swept layout could be re-evaluated (unknown model or no valid layout)")
    entries = [(row.layout + (" +compile" if row.compile else ""), plan.memory.items(), plan.memory.capacity,
                row.measured_memory_bytes, row.memory_kind) for row, plan in plans]
    cpu = all(row.memory_kind in ("host_rss", "host_tensors") or row.device == "cpu" for row, _ in plans)
    kinds = {row.memory_kind for row, _ in plans if row.measured_memory_bytes is not None}
    if cpu:  # host memory per process: no GPU capacity, no CUDA context or NCCL buffers on a CPU run
        drawn = [(label, {k: v for k, v in items.items() if k not in OVERHEAD_ITEMS}, None, measured, kind)
                 for label, items, _, measured, kind in entries]
        what = "the counted peak tensor bytes" if kinds == {"host_tensors"} else "the measured peak host RSS"
        image = plots.memory_plot(drawn, path, f"CPU sweep: the planner's tensors per process ({cluster.gpu.element_bytes:g}"
                                               f"-byte elements)\nand {what}", per="process")
    else:
        image = plots.memory_plot(entries, path, f"Planner's itemized memory on {cluster.gpu.name} "
                                                 f"({cluster.gpu.hbm_bytes / GIB:.0f} GiB)")
    names = [n for n in entries[0][1] if any(e[1].get(n, 0) > 0 for e in entries)]
    body = tuple((label, *(f"{items[n] / GIB:.3f}" for n in names), f"{plan.memory.total / GIB:.3f}",
                  f"{allocated_bytes(items) / GIB:.3f}", "yes" if plan.fits else "NO")
                 for (label, items, *_), (_, plan) in zip(entries, plans))
    table = Table(("layout", *(n.replace("_", " ") for n in names), "total", "allocated", "fits"), body)
    measured = ("Measured (diamonds): torch.cuda.max_memory_allocated, max over ranks - compare it with the "
                "predicted allocated level (the bar's end without the hatched items)."
                if kinds == {"cuda_allocated"} else
                "Measured (circles): the peak host RSS of a CPU process (CPU sweep) - a different quantity from "
                "the GPU prediction, shown for reference only." if kinds == {"host_rss"} else
                "Measured (squares): the counted peak of torch tensor bytes of a CPU process (max over ranks, "
                "plait.run.memory.counted) - the quantity the planner's items predict when the plan is for the "
                "CPU of a CPU profile (4-byte elements)." if kinds == {"host_tensors"} else
                "Measured: diamonds are torch.cuda.max_memory_allocated, squares a CPU process's counted tensor "
                "bytes, circles its host RSS."
                if kinds else "Nothing measured is drawn (no layout ran).")
    if cpu and kinds == {"host_tensors"}:
        return Section(title, [f"{cluster_note}. The picture is per CPU process: the planner's tensors (its items "
                               "without the CUDA context, NCCL buffers and fragmentation, which a CPU run does not "
                               f"have) beside each process's counted tensor bytes. {measured}"], table, image=image)
    if cpu:
        return Section(title, [f"{cluster_note}. The picture is per CPU process, on an axis scaled to what is "
                               "drawn: the planner's tensors (its GPU items without the CUDA context, NCCL buffers "
                               "and fragmentation, which a CPU run does not have) beside each process's measured "
                               "peak resident memory, which also holds the Python interpreter and torch itself - "
                               "compare how they change from layout to layout, not their values. The table has the "
                               f"planner's full GPU items. {measured}"], table, image=image)
    caption = (f"{cluster_note}. GiB per GPU, most loaded stage. Solid items are what the allocator hands out; "
               f"the hatched items ({', '.join(n.replace('_', ' ') for n in OVERHEAD_ITEMS)}) are the rest of the "
               f"planner's total (not in max_memory_allocated); the black tick marks the predicted allocated "
               f"level. {measured}")
    return Section(title, [caption], table, image=image)


def timeline_section(plan: Plan | None, why: str, path: Path, pricing: str = "") -> Section:
    """The pipeline schedule per rank of ``plan`` (``why``: which plan it is); ``pricing``: how the
    plan was priced, in the picture's title and the text."""
    from plait.errors import PlaitError
    from plait.measure.report import plots
    from plait.measure.report.timeline import hidden_spans, plan_timeline, timeline_bubble_fraction, timeline_windows

    title = "Pipeline schedule per rank"
    if plan is None:
        return Section(title, [], missing=why)
    layout = plan.layout
    try:
        intervals = plan_timeline(plan)
    except PlaitError as exc:
        return Section(title, [f"{layout} ({why})"], missing=f"not drawn: {exc}")
    m = layout.micro_batches(plan.job.global_batch)
    fraction = timeline_bubble_fraction(intervals)
    schedule = layout.schedule if layout.pp > 1 else "no pipeline"
    windows = timeline_windows(intervals)
    text = (f"{layout} ({why}): {schedule}, pp={layout.pp}, vpp={layout.vpp}, {m} micro-batches; per micro-batch "
            f"and stage times from the planner (forward:backward = 1:2, recomputation in backward). Bubble "
            f"{100 * fraction:.1f}% of the busy time; the planner's step time has "
            f"{duration(plan.step.bubble)} of bubble in {duration(plan.step.step_time)}.")
    if pricing:
        text += f" Priced with: {pricing}."
    hidden = hidden_spans(windows)
    if hidden:
        left_out = sum(b - a for a, b in hidden)
        makespan = windows[-1][1]
        text += (f" Not drawn: {duration(left_out)} of the {duration(makespan)} schedule ("
                 + ", ".join(f"{duration(a)} to {duration(b)}" for a, b in hidden)
                 + "), where every rank is busy (steady state, no bubble); the picture shows the warm-up, "
                 "the edges of the steady state and the cool-down, so its share of bubble is larger than the "
                 "step's.")
    image = plots.timeline_plot(intervals, path, f"{layout}: {schedule}, {m} micro-batches"
                                + (f"\npriced with: {pricing}" if pricing else ""), windows)
    return Section(title, [text], image=image)


def validation_section(runs_path: str) -> Section:
    from plait.measure.validate.runs import error_summary, predict_runs

    summary = error_summary(predict_runs(runs_path))
    body = []
    for source, s in [*summary["per_source"].items(), ("all", summary["overall"])]:
        if s["n"]:
            body.append((source, str(s["n"]), f"{s['median_abs_error']:.1f}", f"{s['mean_abs_error']:.1f}",
                         f"{100 * s['within_4_points']:.0f}%"))
    text = (f"plait validate on {Path(runs_path).name}: {summary['rows']} rows, {summary['complete']} complete, "
            f"{summary['compared']} compared (coverage {100 * summary['coverage']:.0f}%). MFU error in points.")
    return Section("Published runs: per-source MFU error (plait validate)", [text],
                   Table(("source", "runs", "median |err|", "mean |err|", "within 4 pts"), tuple(body)))
