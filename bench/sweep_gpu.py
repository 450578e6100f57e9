"""Benchmark (issue 6): sweep single-GPU layouts of a ~1B Llama and record measured vs predicted.

Runs ``plait sweep`` (every layout through ``plait train`` for a few steps) and ``plait report``,
then writes ``bench/results/sweep_gpu.md`` (replacing it): date, machine, versions, the command,
the per-layout table and the summary, all generated - do not edit the file by hand. The layouts are single-GPU ones: micro-batch size,
activation checkpointing, activation offload and ``torch.compile``:

    python bench/sweep_gpu.py --gpu h100-sxm          # or --gpu h200; 36 layouts, ~1 min each

Defaults: ``--model llama3.2-1b --global-batch 16 --seq-len 2048 --steps 10`` and
``--grid "mbs=1,2,4;ckpt=none,selective,full;offload=0,1;compile=0,1"`` (offload with compile is
refused by plait train and recorded as such). Pass ``--calibration cal.json`` (``plait profile``)
to sweep a calibrated cost model. The issue's goals: median step-time error <= 5% after
calibration, and the planner's top-1 within 3% of the measured best (checked per compile
setting: compiled and eager twins share one prediction); the file says whether they were met.

CPU mode (what this session could run; CPU step times are NOT comparable with GPU
predictions, and memory is host RSS):

    python bench/sweep_gpu.py --cpu                   # tiny model, 2 processes, planner's top 3, 3 steps

writes ``bench/results/sweep_cpu.md`` the same way. The report (HTML, Markdown, PNGs) goes to
``--report-dir`` (default: ``$TMPDIR/plait-sweep_gpu`` or ``plait-sweep_cpu``, outside the repository).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from plait.cli import main as plait_main
from plait.measure.report.render import render_markdown
from plait.measure.report.sections import rows_section, summary_section
from plait.measure.sweep.loop import summary_path
from plait.measure.sweep.csv_file import read_sweep
from plait.measure.sweep.stats import top1_text

RESULTS = REPO / "bench" / "results"
GPU_GRID = "mbs=1,2,4;ckpt=none,selective,full;offload=0,1;compile=0,1"
GOAL_STEP_ERROR, GOAL_TOP1 = 0.05, 0.03


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="small CPU sweep of the tiny model -> sweep_cpu.md")
    parser.add_argument("--gpu", help="GPU spec (h100-sxm, h200); default: from the device name")
    parser.add_argument("--model", help="model preset or JSON (default llama3.2-1b; tiny with --cpu)")
    parser.add_argument("--global-batch", type=int)
    parser.add_argument("--seq-len", type=int)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--grid", help=f"layout grid (default {GPU_GRID!r}; --cpu: the planner's top 3)")
    parser.add_argument("--top", type=int, help="the planner's top K instead of a grid")
    parser.add_argument("--layout", action="append", help="a layout to run instead of a grid (repeatable)")
    parser.add_argument("--nproc-per-node", type=int, help="processes (default 1; --cpu: 2)")
    parser.add_argument("--repeats", type=int, help="plait sweep --repeats (default: plait sweep's)")
    parser.add_argument("--min-time", type=float, help="plait sweep --min-time (default: plait sweep's)")
    parser.add_argument("--results", type=Path, help="markdown file to write (default bench/results/"
                        "sweep_gpu.md, or sweep_cpu.md with --cpu)")
    parser.add_argument("--calibration", help="calibration JSON for the predictions")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per layout")
    parser.add_argument("--report-dir", help="where the CSV and plait report go (default: $TMPDIR/plait-<name>)")
    return parser.parse_args(argv)


def sweep_argv(args, csv_path: Path) -> list[str]:
    if args.cpu:
        model, batch, seq, steps = args.model or "tiny", args.global_batch or 8, args.seq_len or 64, \
            args.steps or 3
        which = ["--grid", args.grid] if args.grid else ["--top", str(args.top or 3)]
        nproc = str(args.nproc_per_node or 2)
        where = ["--device", "cpu"]
    else:
        model, batch, seq, steps = args.model or "llama3.2-1b", args.global_batch or 16, \
            args.seq_len or 2048, args.steps or 10
        which = ["--top", str(args.top)] if args.top else ["--grid", args.grid or GPU_GRID]
        nproc = str(args.nproc_per_node or 1)
        where = ["--device", "cuda"] + (["--gpu", args.gpu] if args.gpu else [])
    if args.layout:
        which = [item for layout in args.layout for item in ("--layout", layout)]
    argv = ["sweep", "--model", model, "--nproc-per-node", nproc, "--global-batch", str(batch), "--seq-len",
            str(seq), "--steps", str(steps), *which, *where, "--timeout", str(args.timeout)]
    argv += ["--calibration", args.calibration] if args.calibration else []
    argv += ["--repeats", str(args.repeats)] if args.repeats else []
    argv += ["--min-time", str(args.min_time)] if args.min_time is not None else []
    return [*argv, "--out", str(csv_path)]


def machine() -> str:
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (f"{platform.node() or 'unknown host'}, {platform.processor() or platform.machine()}, "
            f"{os.cpu_count()} CPU cores, {gpu}; Python {platform.python_version()}, torch {torch.__version__}")


def goals(summary: dict) -> str:
    error = summary["step_time_error"]["median_abs"]
    parts = [f"median step-time error {100 * error:.1f}% (goal <= {100 * GOAL_STEP_ERROR:.0f}%: "
             f"{'met' if error <= GOAL_STEP_ERROR else 'NOT met'})" if error is not None else
             "median step-time error: n/a (no predictions recorded)"]
    for check in summary.get("top1_checks", []):
        setting = "compiled" if check["compile"] else "eager"
        met = "met" if check["top1_within_tolerance"] else "NOT met"
        parts.append(f"planner's top-1 ({setting}): {top1_text(check, summary['top1_tolerance'])} "
                     f"(goal <= {100 * GOAL_TOP1:.0f}%: {met})")
    return "; ".join(parts)


def write_results(md_path: Path, args, csv_path: Path, command: list[str]) -> None:
    """Write ``md_path`` from the sweep's CSV and summary JSON (the whole file, generated)."""
    rows = read_sweep(csv_path)
    summary = json.loads(summary_path(csv_path).read_text())
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    body = render_markdown("x", [summary_section(rows, summary, csv_path), rows_section(rows)])
    body = ("\n" + body.split("\n", 4)[4]).replace("\n## ", "\n### ").lstrip()  # drop the title and stamp
    label = ("**CPU run, noisy, not comparable with GPU predictions.** No step-time, memory or MFU "
             "predictions are recorded on CPU; measured memory is host RSS. The rank correlation compares the "
             f"planner's order for {summary.get('planner_gpu', 'a GPU')} with CPU step times of a few steps on "
             f"a shared machine ({os.cpu_count()} cores), so it is no test of the GPU cost model."
             if args.cpu else goals(summary))
    text = (f"# {md_path.stem}\n\nGenerated by `python bench/sweep_gpu.py{' --cpu' if args.cpu else ''}` on "
            f"{stamp}; do not edit by hand.\n\nMachine: {machine()}.\n\nCommand: `plait "
            f"{' '.join(command[:-2])} --out {csv_path.name}`\n\n{label}\n\n{body}\n")
    md_path.write_text(text.rstrip() + "\n")


def run(argv=None) -> int:
    args = parse_args(argv)
    name = "sweep_cpu" if args.cpu else "sweep_gpu"
    RESULTS.mkdir(parents=True, exist_ok=True)
    report_dir = Path(args.report_dir) if args.report_dir else Path(tempfile.gettempdir()) / f"plait-{name}"
    csv_path = report_dir / f"{name}.csv"
    report_dir.mkdir(parents=True, exist_ok=True)
    command = sweep_argv(args, csv_path)
    code = plait_main(command)
    if not csv_path.is_file():
        return code or 2
    plait_main(["report", "--sweep", str(csv_path), "--out", str(report_dir)])
    md_path = args.results or RESULTS / f"{name}.md"
    md_path.parent.mkdir(parents=True, exist_ok=True)
    write_results(md_path, args, csv_path, command)
    print(f"wrote {md_path}; report in {report_dir}")
    return code


if __name__ == "__main__":
    sys.exit(run())
