"""``plait sweep``: run layouts through ``plait train`` one after another, write predicted vs
measured per layout to a CSV as each finishes, and a summary JSON next to it.

A layout that fails, runs out of memory, is refused or times out is recorded as such and the
sweep goes on; an interrupted sweep keeps the rows written so far (and writes its summary).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

from plait.atomic import atomic_write_text
from plait.errors import PlaitError
from plait.measure.sweep.cases import SweepCase, SweepSpec
from plait.measure.sweep.csv_file import SweepRow, SweepWriter, summary_path
from plait.measure.sweep.run_one import run_case
from plait.measure.sweep.stats import summarize
from plait.progress import ProgressBar


def _row_line(done: int, total: int, row: SweepRow) -> str:
    """The line printed when a layout finished: ``[2/5] dp=2,...: ok 0.123 s/step``."""
    measured = f" {row.measured_step_time_s:.3f} s/step" if row.measured_step_time_s is not None else ""
    return f"[{done}/{total}] {row.layout}: {row.status}{measured}" + (f" ({row.reason[:120]})" if row.reason else "")


def run_sweep(spec: SweepSpec, cases: list[SweepCase], out: str | Path, progress: bool = True,
              top1_tolerance: float = 0.03, workdir: str | Path | None = None) -> tuple[list[SweepRow], dict]:
    """Run every case, writing its row to ``out`` as it finishes; returns (rows, summary).

    The summary (``plait.measure.sweep.stats.summarize`` plus the sweep's settings) goes to ``summary_path(out)``,
    also when interrupted (with ``"interrupted": true``). ``workdir`` keeps each run's log, stdout
    and stderr (default: a temporary directory, removed afterwards).
    """
    rows: list[SweepRow] = []
    writer = SweepWriter(out)
    bar = ProgressBar("sweep", len(cases), progress, lines=False, clock="elapsed")
    owned = workdir is None
    base = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="plait-sweep-"))
    interrupted = True
    try:
        for index, case in enumerate(cases):
            bar.status(f"running {case.label}")
            row = run_case(spec, case, base / f"layout-{index:03d}")
            writer.write(row)
            rows.append(row)
            bar.message(_row_line(bar.done + 1, len(cases), row), markup=False)
            bar.advance()
        interrupted = False
    finally:
        bar.close()
        writer.close()
        summary = summarize(rows, top1_tolerance)
        summary.update(settings(spec), planned=len(cases), interrupted=interrupted, csv=str(out))
        _write_json(summary_path(out), summary)
        if owned:
            shutil.rmtree(base, ignore_errors=True)
    return rows, summary


def settings(spec: SweepSpec) -> dict:
    return {"model": spec.model.name, "global_batch": spec.global_batch, "seq_len": spec.seq_len,
            "steps": spec.steps, "nproc_per_node": spec.nproc_per_node, "device": spec.device,
            "planner_cluster": spec.cluster.name, "planner_gpu": spec.cluster.gpu.name,
            "predictions_recorded_for": spec.prediction_gpu, "calibration": spec.calibration,
            "calibration_sha256": spec.calibration_sha256}


def _write_json(path: Path, data: dict) -> None:
    try:
        atomic_write_text(path, json.dumps(data, indent=2) + "\n", "sweep summary")
    except PlaitError as exc:
        print(f"plait: warning: cannot write {path}: {exc}", file=sys.stderr)

