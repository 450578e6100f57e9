"""``plait validate``: predict published runs and report the error."""

from __future__ import annotations

import argparse
import csv
import json

from plait.atomic import atomic_output
from plait.cli.support.common import console, cost_params
from plait.errors import PlaitError

HELP = "predict published runs and report the error"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", required=True, help="CSV of runs (schema: shared/data/README.md)")
    parser.add_argument("--out", help="write per-run predictions to this CSV")
    parser.add_argument("--calibration", help="calibration JSON replacing the default cost parameters")
    parser.add_argument("--json", action="store_true", help="print the error summary as JSON")


def run(args) -> int:
    from plait.cli.support import tables as report
    from plait.measure.published import error_summary, predict_runs

    params, _ = cost_params(args.calibration)
    results = predict_runs(args.runs, params)
    summary = error_summary(results)
    if args.out:
        _write_predictions(args.out, results)
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    out = console()
    out.print(report.validation_table(results))
    completed = [(r.id, n) for r in results for n in r.notes if n.startswith("completed: ")]
    if completed:
        out.print(f"[dim]{len({i for i, _ in completed})} rows completed what their source left out "
                  "(all notes: --out FILE):[/dim]")
        for run_id, note in completed:
            out.print(f"[dim]  {run_id}: {note}[/dim]")
    out.print(report.summary_table(summary))
    if args.out:
        out.print(f"wrote {len(results)} rows to {args.out}")
    return 0


def _write_predictions(path: str, results) -> None:
    columns = ["id", "status", "predicted_step_time_s", "predicted_mfu", "predicted_mem_gb",
               "predicted_tokens_per_s_per_gpu", "reported_mfu", "reported_tokens_per_s_per_gpu",
               "reported_mem_gb", "mfu_error_points", "notes"]
    try:
        with atomic_output(path, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(columns)
            for r in results:
                values = {"id": r.id, "status": r.status, "notes": "; ".join(r.notes),
                          "mfu_error_points": r.mfu_error_points}
                for column in columns:
                    if column not in values:
                        values[column] = getattr(r, column)
                writer.writerow(["" if values[c] is None else (f"{values[c]:.6g}" if isinstance(values[c], float) else values[c])
                                 for c in columns])
    except OSError as exc:
        raise PlaitError(f"cannot write {path}: {exc}") from None
