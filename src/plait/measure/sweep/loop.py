"""``plait sweep``: run layouts through ``plait train``, write predicted vs measured per layout to a
CSV as each layout finishes, and a summary JSON next to it.

Every layout runs ``spec.repeats`` times in round-robin order (layout 1..n, then 1..n again; never
the runs of one layout back to back), so a slow minute of the machine spreads over every layout
instead of landing on one. With ``spec.min_time_s`` the first round probes: a run whose
post-warm-up steps took less than that many seconds does not count; the layout's later runs get
enough steps to reach it at the probe's median step time (``timing.steps_for_min_time``). A layout
that fails, runs out of memory, is refused or times out is recorded as such (its remaining runs
are skipped) and the sweep goes on. Rows are written as layouts finish; at the end (also when
interrupted, then with the layouts that measured at least one run) the CSV is rewritten in the
layouts' order with the ``noisy`` flags (``timing.noisy_flags``) filled.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from plait.atomic import atomic_write_text
from plait.errors import PlaitError
from plait.measure.sweep.cases import SweepCase, SweepSpec
from plait.measure.sweep.csv_file import SweepRow, SweepWriter, rewrite_sweep, summary_path
from plait.measure.sweep.run_one import run_once, with_timing
from plait.measure.sweep.stats import summarize
from plait.measure.sweep.timing import LayoutTiming, RunTiming, noisy_flags, steps_for_min_time
from plait.progress import ProgressBar


def _row_line(done: int, total: int, row: SweepRow, note: str = "") -> str:
    """The line printed when a run finished: ``[2/5] dp=2,...: ok 0.123 s/step``."""
    measured = f" {row.measured_step_time_s:.3f} s/step" if row.measured_step_time_s is not None else ""
    return (f"[{done}/{total}] {row.layout}: {row.status}{measured}"
            + (f" ({row.reason[:120]})" if row.reason else "") + note)


@dataclass
class LayoutRuns:
    """What one layout has run so far."""

    case: SweepCase
    steps: int  # total steps (warm-up included) of its next run
    runs: list[tuple[SweepRow, RunTiming]] = field(default_factory=list)
    attempts: int = 0  # runs started, probes included
    probed: bool = False
    final: SweepRow | None = None  # its row once it is done


def run_sweep(spec: SweepSpec, cases: list[SweepCase], out: str | Path, progress: bool = True,
              top1_tolerance: float = 0.03, workdir: str | Path | None = None) -> tuple[list[SweepRow], dict]:
    """Run every case ``spec.repeats`` times (round-robin), writing its row to ``out`` when it is
    done; returns (rows in the cases' order, summary).

    The summary (``plait.measure.sweep.stats.summarize`` plus the sweep's settings and the noisy
    layouts) goes to ``summary_path(out)``, also when interrupted (with ``"interrupted": true``).
    ``workdir`` keeps each run's log, stdout and stderr (default: a temporary directory, removed
    afterwards): ``layout-NNN`` for a layout's first run, ``layout-NNN-K`` for its K-th later one.
    """
    warmup = spec.warmup  # from the steps asked for, also for runs the min-time extends
    layouts = [LayoutRuns(case, spec.steps) for case in cases]
    writer = SweepWriter(out)
    bar = ProgressBar("sweep", len(cases), progress, lines=False, clock="elapsed")
    owned = workdir is None
    base = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="plait-sweep-"))
    interrupted = True
    rows: list[SweepRow] = []
    try:
        while any(layout.final is None for layout in layouts):
            for index, layout in enumerate(layouts):
                if layout.final is not None:
                    continue
                bar.status(f"running {layout.case.label}" + (f" (run {len(layout.runs) + 1} of {spec.repeats})"
                                                              if spec.repeats > 1 else ""))
                name = f"layout-{index:03d}" + (f"-{layout.attempts}" if layout.attempts else "")
                run_spec = dataclasses.replace(spec, steps=layout.steps, warmup_steps=warmup)
                row, timing = run_once(run_spec, layout.case, base / name)
                layout.attempts += 1
                note = _record(layout, row, timing, spec)
                bar.message(_row_line(bar.done + (layout.final is not None), len(cases), row, note), markup=False)
                if layout.final is not None:
                    writer.write(layout.final)
                    bar.advance()
        interrupted = False
    finally:
        bar.close()
        writer.close()
        rows = final_rows(layouts, interrupted)
        if rows:
            try:
                rewrite_sweep(out, rows)
            except PlaitError as exc:
                print(f"plait: warning: cannot rewrite {out} with the noisy flags: {exc}", file=sys.stderr)
        summary = summarize(rows, top1_tolerance)
        summary.update(settings(spec), planned=len(cases), interrupted=interrupted, csv=str(out),
                       warmup_steps=warmup)
        _write_json(summary_path(out), summary)
        if owned:
            shutil.rmtree(base, ignore_errors=True)
    return rows, summary


def _record(layout: LayoutRuns, row: SweepRow, timing: RunTiming | None, spec: SweepSpec) -> str:
    """Take one run's result into ``layout`` (finishing it when done); a note for the printed line."""
    if row.status != "ok" or timing is None:
        repeat = len(layout.runs) + 1
        if repeat > 1:
            row = dataclasses.replace(row, reason=f"run {repeat} of {spec.repeats}: {row.reason}")
        layout.final = row
        return ""
    if spec.min_time_s > 0 and not layout.probed:
        layout.probed = True
        if timing.measured_seconds < spec.min_time_s:
            layout.steps = steps_for_min_time(timing, spec.min_time_s, layout.steps)
            return f" (probe: {timing.measured_seconds:.2f} s < --min-time {spec.min_time_s:g} s; next runs " \
                   f"take {layout.steps} steps)"
    layout.runs.append((row, timing))
    if len(layout.runs) >= spec.repeats:
        layout.final = combine(layout.runs)
    return f" (run {len(layout.runs)} of {spec.repeats})" if spec.repeats > 1 else ""


def combine(runs: list[tuple[SweepRow, RunTiming]]) -> SweepRow:
    """One row for a layout's ok runs: the median of their medians, the spreads, the largest memory
    peak, the summed elapsed time; MFU rescaled from the last run's."""
    last = runs[-1][0]
    memory = [r.measured_memory_bytes for r, _ in runs if r.measured_memory_bytes is not None]
    row = dataclasses.replace(last, measured_memory_bytes=max(memory) if memory else None,
                              elapsed_s=sum(r.elapsed_s or 0.0 for r, _ in runs))
    return with_timing(row, LayoutTiming.of([t for _, t in runs]), last.measured_step_time_s)


def final_rows(layouts: list[LayoutRuns], interrupted: bool) -> list[SweepRow]:
    """The rows in the layouts' order with the noisy flags; when interrupted, a layout that measured
    at least one run gets a row from those runs."""
    rows = []
    for layout in layouts:
        if layout.final is None and interrupted and layout.runs:
            layout.final = combine(layout.runs)
        if layout.final is not None:
            rows.append(layout.final)
    measured = [i for i, r in enumerate(rows) if r.status == "ok" and r.measured_step_time_s and r.spread_s is not None]
    flags = noisy_flags([rows[i].measured_step_time_s for i in measured], [rows[i].spread_s for i in measured])
    for i, flag in zip(measured, flags):
        rows[i] = dataclasses.replace(rows[i], noisy=flag)
    return rows


def settings(spec: SweepSpec) -> dict:
    return {"model": spec.model.name, "global_batch": spec.global_batch, "seq_len": spec.seq_len,
            "steps": spec.steps, "nproc_per_node": spec.nproc_per_node, "device": spec.device,
            "planner_cluster": spec.cluster.name, "planner_gpu": spec.cluster.gpu.name,
            "predictions_recorded_for": spec.prediction_gpu or ("cpu (calibration)" if spec.cpu_calibration else None),
            "calibration": spec.calibration, "calibration_sha256": spec.calibration_sha256,
            "repeats": spec.repeats, "min_time_s": spec.min_time_s, "threads_per_process": spec.threads_per_process}


def _write_json(path: Path, data: dict) -> None:
    try:
        atomic_write_text(path, json.dumps(data, indent=2) + "\n", "sweep summary")
    except PlaitError as exc:
        print(f"plait: warning: cannot write {path}: {exc}", file=sys.stderr)
