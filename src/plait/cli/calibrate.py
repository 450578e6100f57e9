"""``plait calibrate fit``: its flags; read a runs CSV, fit, print the tables, write the calibration file."""

from __future__ import annotations

import argparse
import json

from plait.cli.support import common
from plait.errors import PlaitError


HELP = "fit cost-model parameters to measured or published runs"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    calibrate_sub = parser.add_subparsers(dest="calibrate_command", required=True)
    fit = calibrate_sub.add_parser("fit", help="fit a few cost parameters to a runs CSV; write a calibration file")
    _add_fit_args(fit)


def run(args) -> int:
    """``fit``, the only ``calibrate`` command so far."""
    return _fit(args, common.console())


def _add_fit_args(fit: argparse.ArgumentParser) -> None:
    """The flags of ``plait calibrate fit``."""
    fit.add_argument("--runs", required=True, help="CSV of runs: published-runs schema (plait/data/published/README.md) "
                     "or a plait sweep CSV")
    fit.add_argument("--params", help="comma-separated parameters to fit (default: elementwise_passes,"
                     "tp_comm_overlap,dp_overlap,microbatch_overhead_s)")
    fit.add_argument("--out", required=True, help="calibration JSON to write")
    fit.add_argument("--metric", default="mfu", choices=("mfu", "step_time"),
                     help="|predicted / measured - 1| of MFU or of step time (default mfu)")
    fit.add_argument("--objective", default="median", choices=("median", "mean"), help="aggregate of the errors")
    fit.add_argument("--rounds", type=int, default=6, help="coordinate-search rounds (default 6)")
    fit.add_argument("--points", type=int, default=9, help="values tried per parameter and round (default 9)")
    fit.add_argument("--no-leave-out", action="store_true",
                     help="skip the held-out refits (leave-one-source-out, or by layout for one source; "
                          "leave-one-layout-family-out)")
    fit.add_argument("--gpu", help="GPU preset the runs were measured on (written to the file)")
    fit.add_argument("--calibration", help="start from this calibration (e.g. plait profile's); sweep rows are "
                     "predicted on its GPU and links, and its overrides are carried into --out (default for a "
                     "sweep CSV: the calibration its predictions recorded)")
    fit.add_argument("--json", action="store_true", help="print the fit record as JSON")


def _starting_calibration(args, console):
    """The calibration the fit starts from: --calibration, else the one a sweep CSV recorded, else None."""
    from plait.measure.calibrate.from_sweep import is_sweep_csv, recorded_calibration
    from plait.plan.calibration import read_calibration

    recorded, warnings = recorded_calibration(args.runs) if is_sweep_csv(args.runs) else (None, [])
    if args.calibration:
        if recorded and not _same_file(recorded, args.calibration):
            common.warn(f"--calibration {args.calibration} replaces the calibration the sweep's predictions used "
                        f"({recorded})")
        return read_calibration(args.calibration)
    for warning in warnings:
        common.warn(warning)
    if recorded is None:
        return None
    if not args.json:
        console.print(f"[dim]starting from the calibration the sweep recorded: {recorded}[/dim]")
    return read_calibration(recorded)


def _same_file(a: str, b: str) -> bool:
    from pathlib import Path

    return Path(a).resolve() == Path(b).resolve()


def _fit(args, console) -> int:
    from plait.measure.calibrate.fit import fit_runs, parse_param_names
    from plait.measure.calibrate.output import family_table, fit_tables, fit_to_dict
    from plait.plan.calibration import write_calibration as write_json

    names = parse_param_names(args.params)
    if args.gpu:
        from plait.spec.hardware import get_gpu

        gpu = get_gpu(args.gpu).name
    else:
        gpu = None
    if not str(args.out).endswith(".json"):
        raise PlaitError(f"--out {args.out}: a calibration file is JSON; name it *.json")
    quiet = args.json

    def progress(text: str) -> None:
        if not quiet:
            console.print(f"[dim]{text}[/dim]")

    calibration = _starting_calibration(args, console)
    if calibration is not None:
        if calibration.cpu_profile and gpu:
            raise PlaitError(f"--gpu {gpu} with the CPU profile {calibration.path}: the written file would carry the "
                             "CPU's hardware numbers under a GPU name; drop --gpu, or start from a GPU profile")
        gpu = gpu or calibration.gpu
    result = fit_runs(args.runs, names, metric=args.metric, objective=args.objective, rounds=args.rounds,
                      points=args.points, leave_out=not args.no_leave_out, progress=progress, calibration=calibration)
    for warning in result.warnings:
        common.warn(warning)
    data = fit_to_dict(result, args.runs, gpu, calibration)
    write_json(args.out, data)
    if args.json:
        print(json.dumps(data["fit"], indent=2))
        return 0
    params_table, errors_table = fit_tables(result)
    console.print(params_table)
    console.print(errors_table)
    families = family_table(result)
    if families is not None:
        console.print(families)
    elif not args.no_leave_out:
        console.print("[dim]leave-one-family-out: the rows are of one family, nothing to hold out[/dim]")
    skipped = ", ".join(f"{n} {why}" for why, n in sorted(result.rows_skipped.items()))
    if skipped:
        console.print(f"[dim]rows not used: {skipped}[/dim]")
    if result.leave_out_error > result.default_error:
        console.print(f"[yellow]the held-out error ({result.holdout}) is above the starting parameters' error: the "
                      "fit does not generalize; keep the starting parameters or fit fewer[/yellow]")
    console.print(f"wrote {args.out} (use: plait plan ... --calibration {args.out})")
    return 0
