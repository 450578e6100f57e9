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
    parser.add_argument("--runs", action="append", metavar="CSV",
                        help="CSV of runs (schema: plait/data/published/README.md; repeatable); default: the "
                             "published runs shipped with plait (dense and MoE, both calibration batches)")
    parser.add_argument("--cross-validate", choices=("source",),
                        help="'source': for each code base, fit the defaults on the other sources' runs and predict "
                             "its runs (leave-one-source-out); prints each source's held-out error beside its error "
                             "with the shipped defaults")
    parser.add_argument("--out", help="write per-run predictions to this CSV")
    parser.add_argument("--calibration", help="calibration JSON replacing the default cost parameters")
    parser.add_argument("--json", action="store_true", help="print the error summary as JSON")


def run(args) -> int:
    from plait.cli.support import tables as report
    from plait.measure.validate.runs import SHIPPED_RUNS, error_summary, predict_runs

    runs = args.runs or [str(p) for p in SHIPPED_RUNS]
    if args.cross_validate:
        return _cross_validate(args, runs)
    params, _ = cost_params(args.calibration)
    results = [r for path in runs for r in predict_runs(path, params)]
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


def _cross_validate(args, runs: list[str]) -> int:
    from plait.cli.support.tables import cross_validation_table
    from plait.measure.validate.cross import cross_validate

    if args.calibration or args.out:
        raise PlaitError("--cross-validate fits the defaults itself: drop --calibration and --out")
    out = console()

    def notify(text: str) -> None:
        if not args.json:
            out.print(f"[dim]{text}[/dim]")

    result = cross_validate(runs, progress=notify)
    if args.json:
        print(json.dumps({"record": result.record(), "fitted": list(result.names), "skipped": result.skipped,
                          "sources": [{"source": s.source, "rows": s.rows, "held_out": s.held_out,
                                       "in_sample": s.in_sample, "fitted": s.fitted} for s in result.sources]},
                         indent=2))
        return 0
    out.print(cross_validation_table(result))
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
