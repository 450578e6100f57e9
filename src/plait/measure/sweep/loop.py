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

from plait.measure.sweep.cases import SweepCase, SweepSpec
from plait.measure.sweep.csv_file import SweepRow, SweepWriter, summary_path
from plait.measure.sweep.run_one import run_case
from plait.measure.sweep.stats import summarize


class _Progress:
    """A rich progress bar on a terminal, one plain line per layout otherwise."""

    def __init__(self, total: int, enabled: bool):
        self.enabled, self.total, self.done, self.bar = enabled, total, 0, None
        if enabled and sys.stdout.isatty():
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self.bar = Progress(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[status]}"), TimeElapsedColumn())
            self.task = self.bar.add_task("sweep", total=total, status="")
            self.bar.start()

    def starting(self, case: SweepCase) -> None:
        if self.bar is not None:
            self.bar.update(self.task, status=f"running {case.label}")

    def finished(self, row: SweepRow) -> None:
        self.done += 1
        if not self.enabled:
            return
        measured = f" {row.measured_step_time_s:.3f} s/step" if row.measured_step_time_s is not None else ""
        text = f"[{self.done}/{self.total}] {row.layout}: {row.status}{measured}" + (
            f" ({row.reason[:120]})" if row.reason else "")
        if self.bar is not None:
            self.bar.console.print(text, markup=False, highlight=False)
            self.bar.update(self.task, advance=1, status="")
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def run_sweep(spec: SweepSpec, cases: list[SweepCase], out: str | Path, progress: bool = True,
              top1_tolerance: float = 0.03, workdir: str | Path | None = None) -> tuple[list[SweepRow], dict]:
    """Run every case, writing its row to ``out`` as it finishes; returns (rows, summary).

    The summary (``plait.measure.sweep.stats.summarize`` plus the sweep's settings) goes to ``summary_path(out)``,
    also when interrupted (with ``"interrupted": true``). ``workdir`` keeps each run's log, stdout
    and stderr (default: a temporary directory, removed afterwards).
    """
    rows: list[SweepRow] = []
    writer = SweepWriter(out)
    bar = _Progress(len(cases), progress)
    owned = workdir is None
    base = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="plait-sweep-"))
    interrupted = True
    try:
        for index, case in enumerate(cases):
            bar.starting(case)
            row = run_case(spec, case, base / f"layout-{index:03d}")
            writer.write(row)
            rows.append(row)
            bar.finished(row)
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
        path.write_text(json.dumps(data, indent=2) + "\n")
    except OSError as exc:
        print(f"plait: warning: cannot write {path}: {exc}", file=sys.stderr)

