"""``plait report``: a sweep, a saved plan or a train log (any of them; and optionally published runs)
as report.html and report.md with PNG plots next to them. No torch.

A plan alone: its prediction, memory per pipeline stage and step-time waterfall
(``plan_sections``), its pipeline schedule. A train log (``--train-log``): the loss curve, eval
loss and learning rate per step (``train_log``). A sweep: settings and summary (rank correlation,
errors, the planner's top-1), the per-layout table, predicted vs measured step time (whiskers: the
fastest and slowest steady-state step), MFU per layout, the planner's itemized memory per layout
against the GPU's capacity (the layouts re-evaluated with ``plait.plan.plan.evaluate``; per CPU
process, on an axis scaled to what is drawn, for a CPU sweep), with ``--plan`` the plan's memory
per stage and waterfall, the pipeline schedule of a plan per rank (``plait.measure.report.timeline``), and, with ``--runs``,
``plait validate``'s per-source error table.

The report reuses what the sweep recorded: the calibration file (its ``calibration`` column; a
warning when the file is gone or its sha256 changed since the sweep) for the re-evaluated
memory and predictions, and the top-1 tolerance of its summary JSON.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

from plait.atomic import atomic_write_text
from plait.errors import PlaitError
from plait.measure.report.render import Section, render_html, render_markdown, with_relative_paths
from plait.measure.sweep.csv_file import SweepRow, read_sweep, summary_path
from plait.measure.sweep.stats import summarize
from plait.plan.calibration import Calibration
from plait.plan.params import DEFAULT_PARAMS, CostParams
from plait.plan.plan import Plan, evaluate
from plait.spec.hardware import ClusterSpec, cluster_for_gpu, get_cluster
from plait.spec.layout import JobSpec, Layout
from plait.spec.serialize import parse_json
from plait.spec.units import DEFAULT_GPU

DEFAULT_TOP1_TOLERANCE = 0.03  # when the sweep's summary JSON is missing (plait sweep's default)
REPORT_IMAGES = ("step_time.png", "mfu.png", "memory.png", "plan.png", "timeline.png", "loss.png")


def saved_summary(csv_path: Path) -> dict:
    """The summary JSON ``plait sweep`` wrote next to the CSV, or {} when it is missing or unreadable."""
    try:
        data = parse_json(summary_path(csv_path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    kinds = {"planner_cluster": str, "calibration": str, "calibration_sha256": str, "top1_tolerance": (int, float)}
    return {key: value for key, value in data.items()  # a field of the wrong type counts as missing
            if key not in kinds or (isinstance(value, kinds[key]) and not isinstance(value, bool))}


def prediction_cluster(rows: list[SweepRow], saved: dict) -> tuple[ClusterSpec, str]:
    """The cluster the sweep's predictions are for (its ``gpu`` column, else the planner's cluster in
    the summary JSON, else an H100 node) and a note saying which."""
    n = rows[0].nproc_per_node or 1
    gpu = next((r.gpu for r in rows if r.gpu), "")
    if gpu:
        return dataclasses.replace(cluster_for_gpu(gpu, n, n), gpus_per_node=n), f"predictions for {gpu}"
    note = ("predictions for the CPU of the sweep's calibration; memory is the planner's for"  # a CPU profile
            if any(r.predicted_step_time_s for r in rows) else
            "no predictions were recorded (CPU sweep); memory is the planner's for")
    try:
        cluster = get_cluster(saved["planner_cluster"]) if saved.get("planner_cluster") else None
    except PlaitError:
        cluster = None
    if cluster is not None:
        cluster = dataclasses.replace(cluster.with_gpus(n), gpus_per_node=n)
        return cluster, f"{note} {cluster.gpu.name} (the cluster the sweep ranked for)"
    cluster = dataclasses.replace(cluster_for_gpu(DEFAULT_GPU, n, n), gpus_per_node=n)
    return cluster, f"{note} {DEFAULT_GPU} (default)"


def sweep_calibration(rows: list[SweepRow], saved: dict, cluster: ClusterSpec
                      ) -> tuple[CostParams, ClusterSpec, str, list[str], Calibration | None]:
    """(cost parameters, cluster with the calibration's overrides, a note, warnings, the calibration)
    of the calibration the sweep recorded; the defaults (and None) when it recorded none or the file is gone."""
    from plait.measure.sweep.cases import calibration_fingerprint
    from plait.plan.calibration import read_calibration

    path = next((r.calibration for r in rows if r.calibration), "") or saved.get("calibration") or ""
    recorded = next((r.calibration_sha256 for r in rows if r.calibration_sha256), "") or \
        saved.get("calibration_sha256") or ""
    if not path:
        return DEFAULT_PARAMS, cluster, "default cost parameters (the sweep used no calibration)", [], None
    if not Path(path).is_file():
        return DEFAULT_PARAMS, cluster, "default cost parameters", [
            f"the sweep's calibration {path} is missing: the report uses the default cost parameters"], None
    _, now = calibration_fingerprint(path)
    changed = (f"calibration {path} changed since the sweep (sha256 {recorded} then, {now} now): the report "
               "uses the file as it is now")
    warnings = [changed] if recorded and now != recorded else []
    calibration = read_calibration(path)
    cluster, apply_warnings = calibration.apply(cluster)
    model = _model_of(rows) if rows else None
    if model is not None and rows[0].seq_len:  # the swept model's GEMMs outside what the profile measured
        uncovered = calibration.coverage_warning(model, rows[0].seq_len, rows[0].global_batch, rows[0].model)
        apply_warnings += [uncovered] if uncovered else []
    from plait.measure.report.plan_pricing import calibration_device

    device = calibration_device(calibration) or "no device named"
    return (calibration.params, cluster, f"calibration {path} ({device}; sha256 {now})", warnings + apply_warnings,
            calibration)


def _model_of(rows: list[SweepRow]):
    from plait.spec.models import get_model

    try:
        return get_model(rows[0].model)
    except PlaitError:
        return None


def layout_plans(rows: list[SweepRow], cluster: ClusterSpec,
                 params: CostParams = DEFAULT_PARAMS) -> list[tuple[SweepRow, Plan]]:
    """Each swept layout that passes the planner's rules, re-evaluated on ``cluster`` as it ran (compiled
    or not: ``plait.plan.compiled.with_compile``)."""
    from plait.plan.compiled import with_compile

    model = _model_of(rows)
    if model is None or not rows[0].global_batch or not rows[0].seq_len:
        return []
    job = JobSpec(global_batch=rows[0].global_batch, seq_len=rows[0].seq_len)
    out = []
    for row in rows:
        if row.status == "invalid":
            continue
        try:
            priced = with_compile(params, None, row.compile, "cuda")  # the sweep ran --compile or --no-compile
            out.append((row, evaluate(model, cluster, job, Layout.parse(row.layout), priced, compile=row.compile)))
        except PlaitError:
            continue
    return out


def _timeline_plan(plan: Plan | None, plan_path: str | None, plans: list[tuple[SweepRow, Plan]]
                   ) -> tuple[Plan | None, str]:
    if plan is not None:
        return plan, f"the plan in {plan_path}"
    for row, swept in plans:
        if swept.layout.pp > 1:
            return swept, "the first swept layout with pp > 1"
    return None, "no swept layout has pp > 1 and no --plan was given: no pipeline to draw"


def _recorded_paths(rows: list[SweepRow]) -> list[str]:
    """The files a sweep's rows name: its calibrations, and its model when that is a file."""
    named = {r.calibration for r in rows if r.calibration} | {r.model for r in rows if r.model}
    return sorted(p for p in named if os.sep in p)


def _require_matplotlib() -> None:
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise PlaitError("plait report draws its plots with matplotlib, which is not installed: "
                         "pip install matplotlib (or install plait with the [cpu] or [gpu] extra)")


def _sweep_sections(csv_path: Path, rows: list[SweepRow], out: Path, plan_path: str | None
                    ) -> tuple[list[Section], list[tuple[str, str]]]:
    """The sections of a sweep (and of the plan given beside it) and what the title names (``report_title``)."""
    from plait.measure.report import plots
    from plait.measure.report.sections import (
        memory_section,
        mfu_section,
        rows_section,
        summary_section,
        timeline_section,
    )

    saved = saved_summary(csv_path)
    cluster, cluster_note = prediction_cluster(rows, saved)
    params, cluster, calibration_note, warnings, calibration = sweep_calibration(rows, saved, cluster)
    for warning in warnings:
        print(f"plait: warning: {warning}", file=sys.stderr)
    plans = layout_plans(rows, cluster, params)
    summary = summarize(rows, saved.get("top1_tolerance", DEFAULT_TOP1_TOLERANCE))
    sections: list[Section] = [summary_section(rows, summary, csv_path, calibration_note, warnings),
                               rows_section(rows)]
    step_png = plots.step_time_plot(rows, out / "step_time.png")
    sections.append(Section("Step time: predicted vs measured", [], image=step_png,
                            missing="no layout ran" if step_png is None else "",
                            notes=["Whiskers: the fastest and the slowest steady-state step of a layout around "
                                   "its median."] if step_png is not None and plots.spread_errors(rows) else []))
    sections.append(mfu_section(rows, out / "mfu.png"))
    sections.append(memory_section(plans, cluster, cluster_note, out / "memory.png"))
    plan, pricing = None, ""
    if plan_path:
        from plait.measure.report.plan_pricing import price_saved_plan
        from plait.measure.report.plan_sections import plan_picture_section, plan_summary_section

        priced = price_saved_plan(plan_path, calibration, calibration.path if calibration is not None else "")
        plan, pricing = priced.plan, priced.label
        for note in priced.notes[:1]:  # the devices differ, or saved and shown disagree: also on stderr
            print(f"plait: note: {note}", file=sys.stderr)
        sections.append(plan_summary_section(plan, plan_path, pricing, priced.notes, priced.rows))
        sections.append(plan_picture_section(plan, priced.params, out / "plan.png", pricing))
    timeline_plan, why = _timeline_plan(plan, plan_path, plans)
    sections.append(timeline_section(timeline_plan, why, out / "timeline.png", pricing if plan is not None else ""))
    titles = [("sweep", f"{rows[0].model or 'model'} ({csv_path.name})")]
    if plan is not None:
        titles.append(("plan", f"{plan.model.name}, {plan.layout}"))
    return sections, titles


def _plan_sections(plan_path: str, out: Path) -> tuple[list[Section], list[tuple[str, str]]]:
    """A report of one saved plan without a sweep: its prediction, memory per stage, waterfall, timeline."""
    from plait.measure.report.plan_pricing import price_saved_plan
    from plait.measure.report.plan_sections import plan_picture_section, plan_summary_section
    from plait.measure.report.sections import timeline_section

    priced = price_saved_plan(plan_path)
    plan = priced.plan
    sections = [plan_summary_section(plan, plan_path, priced.label, priced.notes, priced.rows),
                plan_picture_section(plan, DEFAULT_PARAMS, out / "plan.png")]
    why = f"the plan in {plan_path}" if plan.layout.pp > 1 else "the plan has no pipeline (pp = 1): nothing to draw"
    sections.append(timeline_section(plan if plan.layout.pp > 1 else None, why, out / "timeline.png"))
    return sections, [("plan", f"{plan.model.name}, {plan.layout}")]


def report_title(parts: list[tuple[str, str]]) -> str:
    """The report's title from what it shows, in order ((kind, what) pairs: sweep, plan, training,
    published runs): ``plait sweep report: tiny (s.csv)`` for one kind, ``plait report: sweep tiny
    (s.csv) + training run.jsonl`` for several."""
    if len(parts) == 1:
        return f"plait {parts[0][0]} report: {parts[0][1]}"
    return "plait report: " + " + ".join(f"{kind} {what}" for kind, what in parts)


def write_report(sweep_path: str | None, out_dir: str, plan_path: str | None = None,
                 runs_path: str | None = None, train_log: str | None = None) -> list[Path]:
    """Write report.html, report.md and the PNGs into ``out_dir``; returns the paths written.

    Any of a sweep CSV, a plan file and a train JSONL makes a report: a sweep's sections (with the
    plan's beside them), or the plan's alone, then the loss curve of the train log."""
    _require_matplotlib()
    if not (sweep_path or plan_path or train_log):
        raise PlaitError("plait report needs something to report: --sweep CSV, --plan FILE or --train-log JSONL")
    for flag, path in (("--plan", plan_path), ("--runs", runs_path)):
        if path and not Path(path).is_file():
            raise PlaitError(f"{flag} {path}: file not found")
    curves = None
    if train_log:
        from plait.measure.report.train_log import read_train_log

        curves = read_train_log(train_log)
    rows = read_sweep(sweep_path) if sweep_path else []  # a bad sweep is refused before the directory is made
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PlaitError(f"cannot create the report directory {out}: {exc}") from None
    for name in REPORT_IMAGES:  # a reused --out directory must not show another report's plots
        (out / name).unlink(missing_ok=True)
    sections: list[Section] = []
    parts: list[tuple[str, str]] = []
    if sweep_path:
        sections, parts = _sweep_sections(Path(sweep_path), rows, out, plan_path)
    elif plan_path:
        sections, parts = _plan_sections(plan_path, out)
    if curves is not None:
        from plait.measure.report.train_log import loss_plot, loss_summary

        image = loss_plot(curves, out / "loss.png", f"Loss per step: {Path(train_log).name}")
        sections.append(Section("Training loss", [f"{Path(train_log).name}: {loss_summary(curves)}"], image=image))
        parts.append(("training", Path(train_log).name))
    if runs_path:
        from plait.measure.report.sections import validation_section

        sections.append(validation_section(runs_path))
        parts.append(("published runs", Path(runs_path).name))
    inputs = [sweep_path, plan_path, runs_path, train_log, *_recorded_paths(rows)]
    title, sections = with_relative_paths(report_title(parts), sections, inputs, out)
    written = [out / "report.html", out / "report.md"]
    atomic_write_text(written[0], render_html(title, sections), "report")
    atomic_write_text(written[1], render_markdown(title, sections), "report")
    images = [s.image for s in sections if s.image is not None]
    return written + images
