"""``plait sweep`` on the command line: arguments, the layout list, the result tables (``plait.cli.support.tables``)."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from plait.cli.support.common import console, cost_params, warn
from plait.errors import PlaitError
from plait.measure.sweep.cases import (
    SweepSpec,
    calibration_fingerprint,
    make_cases,
    parse_grid,
    top_k_entries,
)
from plait.measure.sweep.timing import CPU_MIN_TIME_S, CPU_REPEATS, default_min_time_s, default_repeats

HELP = "run layouts for a few steps each; CSV of predicted vs measured"
EXIT_ALL_FAILED = 1  # no layout of the sweep ran


def add_arguments(sweep: argparse.ArgumentParser) -> None:
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
    sweep.add_argument("--steps", type=int, default=5,
                       help="optimizer steps per run, warm-up included (default 5)")
    sweep.add_argument("--warmup-steps", type=int, default=None, metavar="N",
                       help="first steps of each run left out of its step time (default: as plait train's "
                            "summary, 1, or 2 when --steps is 6 or more)")
    sweep.add_argument("--repeats", type=int, default=None, metavar="R",
                       help="runs per layout, in round-robin order; the row reports the median of their "
                            f"medians and their spread (default: {CPU_REPEATS} for CPU runs, 1 on GPUs)")
    sweep.add_argument("--min-time", type=float, default=None, metavar="S",
                       help="seconds of post-warm-up steps each run should time: a first run shorter than S is "
                            "a probe (not counted) and the layout's runs get steps enough (default: "
                            f"{CPU_MIN_TIME_S:g} for CPU runs, 0 on GPUs: --steps as given)")
    sweep.add_argument("--threads-per-process", type=int, default=None, metavar="N",
                       help="OMP_NUM_THREADS of each CPU run's processes (default: $OMP_NUM_THREADS, else "
                            "cores // processes); recorded in the CSV")
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
    from plait.run.device import gpu_from_device_name, local_accelerator

    name = local_accelerator()
    if name is None:
        if args.device == "cuda":
            raise PlaitError("--device cuda but torch sees no GPU on this machine; use --device cpu")
        return args.gpu
    if args.gpu:
        return args.gpu
    preset = gpu_from_device_name(name)
    if preset is None:
        warn(f"GPU {name!r} is not a known spec: pass --gpu to record predictions")
    return preset


def _spec(args) -> SweepSpec:
    from plait.spec.hardware import cluster_for_gpu, get_cluster
    from plait.spec.models import get_model

    from plait.measure.sweep.timing import check_warmup, default_warmup_steps
    from plait.plan.calibration import read_calibration

    for name in ("nproc_per_node", "global_batch", "seq_len", "steps", "repeats"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise PlaitError(f"--{name.replace('_', '-')} must be at least 1")
    if args.timeout <= 0:
        raise PlaitError("--timeout must be positive (seconds per layout)")
    if args.min_time is not None and not args.min_time >= 0:
        raise PlaitError(f"--min-time {args.min_time}: must be 0 or more seconds")
    check_warmup(args.steps, default_warmup_steps(args.steps) if args.warmup_steps is None else args.warmup_steps)
    model = get_model(args.model)
    gpu = _prediction_gpu(args)
    n = args.nproc_per_node
    cluster = cluster_for_gpu(gpu, n, n) if gpu else get_cluster(args.cluster)
    cluster = dataclasses.replace(cluster.with_gpus(n), gpus_per_node=n)
    calibration_file = read_calibration(args.calibration) if args.calibration else None
    uncovered = calibration_file.coverage_warning(model, args.seq_len, args.global_batch, args.model) \
        if calibration_file is not None else ""
    if uncovered:  # one line: the model's GEMMs lie outside what the profile measured
        warn(uncovered)
    params, cluster = cost_params(calibration_file, cluster)  # a CPU profile's overrides describe the CPU
    cpu_calibration = calibration_file is not None and calibration_file.cpu_profile
    threads = _threads(args)  # None: GPU runs
    repeats = default_repeats(threads is not None) if args.repeats is None else args.repeats
    min_time_s = default_min_time_s(threads is not None) if args.min_time is None else args.min_time
    if cpu_calibration and calibration_file.process_mismatch(n, threads):
        warn(calibration_file.process_mismatch(n, threads))
    if args.data != "synthetic":
        from pathlib import Path

        if not Path(args.data).is_file():
            raise PlaitError(f"token file {args.data} not found; write one with plait data prepare --out {args.data}")
    calibration, calibration_sha256 = calibration_fingerprint(args.calibration) if args.calibration else ("", "")
    return SweepSpec(model=model, model_arg=args.model, cluster=cluster, global_batch=args.global_batch,
                     seq_len=args.seq_len, steps=args.steps, nproc_per_node=n, device=args.device,
                     prediction_gpu=gpu, params=params, data=args.data, seed=args.seed, timeout_s=args.timeout,
                     allow_oom=args.allow_oom, compile=args.compile, calibration=calibration,
                     calibration_sha256=calibration_sha256, warmup_steps=args.warmup_steps, repeats=repeats,
                     min_time_s=min_time_s, threads_per_process=threads,
                     cpu_calibration=cpu_calibration)


def _threads(args) -> int | None:
    """OMP_NUM_THREADS of the runs' processes on CPU (None: GPU runs, left to plait train)."""
    import os

    from plait.measure.sweep.threads import available_cores, threads_per_process

    if args.device != "cpu":
        from plait.run.device import uses_gpu

        if uses_gpu(args.device):
            return None
    return threads_per_process(args.threads_per_process, args.nproc_per_node, os.environ, available_cores())


def run(args) -> int:
    from plait.cli.support import tables
    from plait.measure.sweep.csv_file import summary_path
    from plait.measure.sweep.loop import run_sweep
    from plait.measure.sweep.stats import failure_reasons

    spec = _spec(args)
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
    if spec.threads_per_process:  # after every input check: a refused sweep prints one line
        from plait.measure.sweep.threads import available_cores, oversubscription

        warning = oversubscription(spec.nproc_per_node, spec.threads_per_process, available_cores())
        if warning:
            warn(warning)
    out = console()
    basis = (f"predictions for {spec.prediction_gpu}" if spec.prediction_gpu else
             "predictions for the CPU of the calibration file" if spec.cpu_calibration else
             f"no predictions recorded (CPU run; the planner ranks for {spec.cluster.gpu.name})")
    basis += (f", calibration {spec.calibration} (sha256 {spec.calibration_sha256})" if spec.calibration
              else ", default cost parameters")
    out.print(f"plait sweep: {len(cases)} layouts of {spec.model.name}, global batch {spec.global_batch} × "
              f"{spec.seq_len}, {spec.steps} steps per run ({spec.warmup} warm-up), {spec.repeats} run(s) per "
              f"layout{f', at least {spec.min_time_s:g} s timed' if spec.min_time_s else ''}, "
              f"{spec.nproc_per_node} processes"
              f"{f' x {spec.threads_per_process} threads' if spec.threads_per_process else ''}; {basis}"
              + (f"; skipped {skipped} faster layouts plait train does not run yet" if skipped else ""))
    rows, summary = run_sweep(spec, cases, args.out, top1_tolerance=args.top1_tolerance, workdir=args.keep_runs)
    out.print(tables.sweep_table(rows))
    out.print(tables.sweep_summary_table(summary))
    if summary["note"]:
        out.print(f"[dim]{summary['note']}[/dim]")
    if summary["noisy"]:
        warn(f"noisy: {', '.join(summary['noisy'])}: spread above the gap to the nearest layout in the measured "
             "ranking; their order is not settled (more --repeats or --min-time)")
    out.print(f"wrote {len(rows)} rows to {args.out} and the summary to {summary_path(args.out)}")
    if summary["ok"] == 0:
        why = "; ".join(f"{n} × {reason}" for reason, n in failure_reasons(rows).items())
        print(f"plait: error: no layout of the sweep ran: {why}", file=sys.stderr)
        return EXIT_ALL_FAILED
    return 0
