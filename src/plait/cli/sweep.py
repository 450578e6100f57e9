"""``plait sweep`` on the command line: arguments, the layout list, the result tables."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from rich.table import Table

from plait.errors import PlaitError
from plait.measure.sweep.cases import (
    SweepSpec,
    calibration_fingerprint,
    make_cases,
    parse_grid,
    top_k_entries,
)
from plait.measure.sweep.csv_file import SweepRow
from plait.measure.sweep.stats import top1_text

EXIT_ALL_FAILED = 1


def register(sub) -> None:
    """Add ``plait sweep`` to the CLI's subparsers; ``plait.cli.main`` calls ``args.handler``."""
    sweep = sub.add_parser("sweep", help="run layouts for a few steps each; CSV of predicted vs measured")
    add_sweep_args(sweep)
    sweep.set_defaults(handler=cmd_sweep)


def add_sweep_args(sweep: argparse.ArgumentParser) -> None:
    sweep.add_argument("--model", required=True, help="model preset, config.json or model JSON")
    sweep.add_argument("--nproc-per-node", "--nproc", type=int, required=True,
                       help="processes (GPUs) of every run, on this machine")
    sweep.add_argument("--global-batch", type=int, required=True, help="sequences per optimizer step")
    sweep.add_argument("--seq-len", type=int, required=True, help="tokens per sequence")
    which = sweep.add_mutually_exclusive_group(required=True)
    which.add_argument("--top", type=int, help="the planner's K fastest layouts that plait train runs")
    which.add_argument("--grid", help='cartesian product, e.g. "dp=1,2;tp=1,2;mbs=1,2" (dp fills the rest '
                                      'when omitted; compile=0,1 sweeps --compile)')
    which.add_argument("--layout", action="append", help="a layout to run (repeatable)")
    sweep.add_argument("--steps", type=int, default=5, help="optimizer steps per layout (default 5)")
    sweep.add_argument("--out", required=True, help="CSV to write (a summary JSON goes next to it)")
    sweep.add_argument("--cluster", default="dgx-h100",
                       help="cluster the planner ranks for when no GPU spec is known (default dgx-h100)")
    sweep.add_argument("--gpu", help="GPU spec to predict for and record (default: this machine's GPU, if known)")
    sweep.add_argument("--calibration", help="calibration JSON replacing the default cost parameters")
    sweep.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="plait train --device")
    sweep.add_argument("--data", default="synthetic", help="synthetic, or a token file (plait data prepare)")
    sweep.add_argument("--seed", type=int, default=0)
    sweep.add_argument("--timeout", type=float, default=600.0, help="seconds one layout may run (default 600)")
    sweep.add_argument("--allow-oom", action="store_true", help="run layouts the planner predicts out of memory")
    sweep.add_argument("--compile", action="store_true", help="plait train --compile for every layout")
    sweep.add_argument("--top1-tolerance", type=float, default=0.03,
                       help="the planner's top-1 passes when within this fraction of the measured best (default 0.03)")
    sweep.add_argument("--keep-runs", metavar="DIR", help="keep each run's log, stdout and stderr under DIR")


def _prediction_gpu(args) -> str | None:
    """--gpu, else the spec of this machine's GPU when plait train will use it and knows its name."""
    from plait.spec.hardware import get_gpu

    if args.gpu:
        get_gpu(args.gpu)  # validates the name
    if args.device == "cpu":
        return args.gpu
    from plait.run.launcher.device import gpu_from_device_name, local_accelerator

    name = local_accelerator()
    if name is None:
        if args.device == "cuda":
            raise PlaitError("--device cuda but torch sees no GPU on this machine; use --device cpu")
        return args.gpu
    if args.gpu:
        return args.gpu
    preset = gpu_from_device_name(name)
    if preset is None:
        print(f"plait: warning: GPU {name!r} is not a known spec: pass --gpu to record predictions", file=sys.stderr)
    return preset


def build_spec(args) -> SweepSpec:
    from plait.spec.hardware import cluster_for_gpu, get_cluster
    from plait.spec.models import get_model

    for name in ("nproc_per_node", "global_batch", "seq_len", "steps"):
        if getattr(args, name) < 1:
            raise PlaitError(f"--{name.replace('_', '-')} must be at least 1")
    if args.timeout <= 0:
        raise PlaitError("--timeout must be positive (seconds per layout)")
    model = get_model(args.model)
    gpu = _prediction_gpu(args)
    n = args.nproc_per_node
    cluster = cluster_for_gpu(gpu, n, n) if gpu else get_cluster(args.cluster)
    cluster = dataclasses.replace(cluster.with_gpus(n), gpus_per_node=n)
    params, cluster = calibrated(args.calibration, cluster)
    if args.data != "synthetic":
        from pathlib import Path

        if not Path(args.data).is_file():
            raise PlaitError(f"token file {args.data} not found; write one with plait data prepare --out {args.data}")
    calibration, calibration_sha256 = calibration_fingerprint(args.calibration) if args.calibration else ("", "")
    return SweepSpec(model=model, model_arg=args.model, cluster=cluster, global_batch=args.global_batch,
                     seq_len=args.seq_len, steps=args.steps, nproc_per_node=n, device=args.device,
                     prediction_gpu=gpu, params=params, data=args.data, seed=args.seed, timeout_s=args.timeout,
                     allow_oom=args.allow_oom, compile=args.compile, calibration=calibration,
                     calibration_sha256=calibration_sha256)


def calibrated(path: str | None, cluster):
    """(CostParams, cluster with the file's GPU and link overrides) of a calibration file, else the
    defaults; the overrides' warnings go to stderr."""
    from plait.plan.params import DEFAULT_PARAMS, read_calibration

    if not path:
        return DEFAULT_PARAMS, cluster
    calibration = read_calibration(path)
    cluster, warnings = calibration.apply(cluster)
    for warning in warnings:
        print(f"plait: warning: {warning}", file=sys.stderr)
    return calibration.params, cluster


def cmd_sweep(args) -> int:
    from plait.measure.sweep.loop import run_sweep, summary_path
    from plait.measure.sweep.stats import failure_reasons

    spec = build_spec(args)
    skipped = 0
    if args.top is not None:
        entries, skipped = top_k_entries(spec, args.top)
    elif args.grid is not None:
        entries = parse_grid(args.grid, spec.nproc_per_node)
    else:
        entries = [(text, False) for text in args.layout]
    cases = make_cases(spec, entries)
    if not cases:
        raise PlaitError("the sweep has no layouts; give --top K, --grid or --layout")
    console = _console()
    basis = (f"predictions for {spec.prediction_gpu}" if spec.prediction_gpu else
             f"no predictions recorded (CPU run; the planner ranks for {spec.cluster.gpu.name})")
    basis += (f", calibration {spec.calibration} (sha256 {spec.calibration_sha256})" if spec.calibration
              else ", default cost parameters")
    console.print(f"plait sweep: {len(cases)} layouts of {spec.model.name}, global batch {spec.global_batch} × "
                  f"{spec.seq_len}, {spec.steps} steps each, {spec.nproc_per_node} processes; {basis}"
                  + (f"; skipped {skipped} faster layouts plait train does not run yet" if skipped else ""))
    rows, summary = run_sweep(spec, cases, args.out, top1_tolerance=args.top1_tolerance, workdir=args.keep_runs)
    console.print(rows_table(rows))
    console.print(summary_table(summary))
    if summary["note"]:
        console.print(f"[dim]{summary['note']}[/dim]")
    console.print(f"wrote {len(rows)} rows to {args.out} and the summary to {summary_path(args.out)}")
    if summary["ok"] == 0:
        why = "; ".join(f"{n} × {reason}" for reason, n in failure_reasons(rows).items())
        print(f"plait: error: no layout of the sweep ran: {why}", file=sys.stderr)
        return EXIT_ALL_FAILED
    return 0


def _console():
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=200)


def _num(value: float | None, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


def _pct(value: float | None) -> str:
    return "" if value is None else f"{100 * value:+.1f}%"


def rows_table(rows: list[SweepRow]) -> Table:
    table = Table(title="Sweep: predicted vs measured per layout", title_justify="left")
    for column in ("layout", "status", "rank", "pred s/step", "meas s/step", "err", "pred mem GiB",
                   "meas mem GiB", "pred MFU", "meas MFU", "tokens/s", "reason"):
        table.add_column(column, justify="left" if column in ("layout", "status", "reason") else "right")
    for r in rows:
        kind = " (RSS)" if r.memory_kind == "host_rss" else ""
        table.add_row(
            r.layout + (" +compile" if r.compile else ""), r.status,
            "pred OOM" if r.predicted_fits is False else _num(r.planner_rank, "d"),
            _num(r.predicted_step_time_s, ".4f"), _num(r.measured_step_time_s, ".4f"), _pct(r.step_time_error),
            _num(r.predicted_memory_bytes and r.predicted_memory_bytes / 2**30, ".2f"),
            (_num(r.measured_memory_bytes / 2**30, ".2f") + kind) if r.measured_memory_bytes is not None else "",
            _pct(r.predicted_mfu).lstrip("+"), _pct(r.measured_mfu).lstrip("+"), _num(r.tokens_per_s, ",.0f"),
            (r.reason[:70] + "...") if len(r.reason) > 73 else r.reason)
    return table


def summary_table(summary: dict) -> Table:
    table = Table(title="Sweep summary", title_justify="left", show_header=False)
    table.add_column("what")
    table.add_column("value")
    counts = ", ".join(f"{n} {s}" for s, n in summary["by_status"].items() if n)
    table.add_row("layouts", f"{summary['rows']} ({counts})")
    rho = summary["rank_correlation"]
    table.add_row("Spearman rank correlation",
                  (f"{rho['spearman']:+.3f}" if rho["spearman"] is not None else "n/a (fewer than 2 ranked runs "
                   "or a constant order)") + f" over {rho['n']} layouts: {rho['basis']}")
    for key, label in (("step_time_error", "step-time error"), ("memory_error", "memory error"),
                       ("mfu_error", "MFU error")):
        e = summary[key]
        table.add_row(label, f"median |err| {100 * e['median_abs']:.1f}%, mean |err| {100 * e['mean_abs']:.1f}% "
                             f"over {e['n']}" if e["n"] else "n/a (no predictions recorded or nothing comparable)")
    for check in summary.get("top1_checks", []):
        table.add_row("planner's top-1" + (" (compiled)" if check["compile"] else ""),
                      top1_text(check, summary["top1_tolerance"]))
    if summary.get("calibration"):
        table.add_row("calibration", f"{summary['calibration']} (sha256 {summary['calibration_sha256']})")
    return table
