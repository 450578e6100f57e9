"""Benchmark (issue 12): the whole measure loop on this CPU - profile, predict, sweep, compare.

For each model (``tiny`` and a 60M-parameter Llama-shaped model, ``bench/models/llama-60m.json``):

  1. ``plait profile --device cpu --nproc-per-node 2 --model M --seq-len S`` describes this CPU
     (GEMM curve, attention, copies, gloo collectives as alpha-beta) in a calibration file;
  2. ``plait sweep --calibration FILE`` runs every layout of the model's list through
     ``plait train`` (2 processes, and the 1-process layouts separately), repeats interleaved,
     warm-up steps excluded, and records the planner's predicted step time and memory beside
     the measured ones;
  3. the rows of all sweeps are pooled: per-layout step-time error (measured / predicted - 1),
     median |error|, Spearman of predicted vs measured step time, the planner's top-1 against
     the measured best (regret), and the memory columns.

Results (machine, date, every row) are appended to ``bench/results/cpu_loop.md``; the sweep CSVs
and calibration files go under ``--work`` (default: a fresh temporary directory).

    python bench/cpu_loop.py                      # both models, 2 repeats
    python bench/cpu_loop.py --models tiny --repeats 1 --no-record   # a quick look

The issue's bars (median |step-time error| <= 15%, Spearman >= 0.85, top-1 within 10% of the best,
memory within 15%) are printed as met or not; nothing here tunes the model to them.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from plait.measure.sweep.stats import spearman  # noqa: E402

# (model argument, sequence length, global batch, two-process layouts, one-process layouts)
CASES = {
    "tiny": ("tiny", 128, 8, [
        "dp=2,mbs=4", "dp=2,mbs=2", "dp=2,mbs=1", "dp=2,mbs=4,zero=2", "dp=2,mbs=4,zero=3",
        "dp=2,mbs=4,zero=3,reshard=0", "tp=2,mbs=8", "tp=2,mbs=8,sp=0", "pp=2,mbs=1",
        "pp=2,mbs=2", "pp=2,mbs=2,schedule=gpipe", "pp=2,vpp=2,mbs=1", "pp=2,mbs=1,schedule=zero-bubble",
        "cp=2,mbs=4", "cp=2,mbs=4,cp_impl=allgather", "cp=2,mbs=4,cp_impl=ulysses", "cp=2,mbs=4,cp_impl=torch",
        "dp=2,mbs=4,ckpt=selective", "dp=2,mbs=4,ckpt=balanced", "dp=2,mbs=4,ckpt=full",
        "dp=2,mbs=4,ckpt=full,offload=cpu:0.5", "dp=2,mbs=4,ckpt=full,offload=disk:0.5",
    ], ["dp=1,mbs=8", "dp=1,mbs=2", "dp=1,mbs=8,ckpt=full"]),
    "tiny-long": ("tiny", 256, 8, ["dp=2,mbs=4", "tp=2,mbs=8", "pp=2,mbs=1", "cp=2,mbs=4"], []),
    "llama-60m": (str(ROOT / "bench" / "models" / "llama-60m.json"), 128, 4, [
        "dp=2,mbs=2", "dp=2,mbs=2,zero=3", "tp=2,mbs=4", "pp=2,mbs=1", "dp=2,mbs=2,ckpt=full",
    ], ["dp=1,mbs=4"]),
}
BARS = {"median_abs_step_time_error": 0.15, "spearman": 0.85, "top1_regret": 0.10, "memory_error": 0.15}


def plait(*args: str, log: Path) -> None:
    """Run ``python -m plait.cli ARGS`` (this checkout's source), its output appended to ``log``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    with log.open("a") as out:
        out.write(f"\n$ plait {' '.join(args)}\n")
        out.flush()
        done = subprocess.run([sys.executable, "-m", "plait.cli", *args], stdout=out, stderr=subprocess.STDOUT,
                              env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"plait {args[0]} failed (exit {done.returncode}); see {log}")


def run_case(name: str, work: Path, repeats: int, steps: int) -> list[dict]:
    model, seq_len, batch, two, one = CASES[name]
    log = work / f"{name}.log"
    calibration = work / f"{name}-cpu.json"
    plait("profile", "--device", "cpu", "--nproc-per-node", "2", "--model", model, "--seq-len", str(seq_len),
          "--out", str(calibration), log=log)
    rows = []
    for nproc, layouts in ((2, two), (1, one)):
        if not layouts:
            continue
        out = work / f"{name}-{nproc}proc.csv"
        plait("sweep", "--model", model, "--nproc-per-node", str(nproc), "--global-batch", str(batch),
              "--seq-len", str(seq_len), "--device", "cpu", "--calibration", str(calibration),
              "--steps", str(steps), "--repeats", str(repeats), "--out", str(out),
              *[arg for layout in layouts for arg in ("--layout", layout)], log=log)
        with out.open() as handle:
            rows += [dict(row, case=name, nproc=nproc) for row in csv.DictReader(handle)]
    return rows


def number(row: dict, key: str) -> float | None:
    try:
        return float(row[key]) if row.get(key) not in (None, "") else None
    except ValueError:
        return None


def summarize(rows: list[dict]) -> dict:
    """Pooled errors over the rows that ran ok with both a prediction and a measurement."""
    ok = [r for r in rows if r["status"] == "ok" and number(r, "predicted_step_time_s")
          and number(r, "measured_step_time_s")]
    errors = [number(r, "measured_step_time_s") / number(r, "predicted_step_time_s") - 1 for r in ok]
    memory = [number(r, "memory_error") for r in ok if number(r, "memory_error") is not None]
    regrets = []
    for key in {(r["case"], r["nproc"]) for r in ok}:
        group = [r for r in ok if (r["case"], r["nproc"]) == key]
        top1 = min(group, key=lambda r: number(r, "predicted_step_time_s"))
        best = min(number(r, "measured_step_time_s") for r in group)
        regrets.append(number(top1, "measured_step_time_s") / best - 1)
    return {
        "layouts": len(rows), "ok": len(ok),
        "median_abs_step_time_error": statistics.median(abs(e) for e in errors) if errors else None,
        "spearman": spearman([number(r, "predicted_step_time_s") for r in ok],
                             [number(r, "measured_step_time_s") for r in ok]) if len(ok) > 1 else None,
        "top1_regret": max(regrets) if regrets else None,
        "memory_error": statistics.median(abs(m) for m in memory) if memory else None,
    }


def verdict(name: str, value: float | None) -> str:
    if value is None:
        return "n/a"
    bar = BARS[name]
    met = value >= bar if name == "spearman" else value <= bar
    return f"{value:.3f} ({'met' if met else 'NOT met'}: {'>=' if name == 'spearman' else '<='} {bar})"


def markdown(rows: list[dict], summary: dict, args) -> str:
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"## {now} - {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
             f"python {platform.python_version()}",
             "",
             f"`python bench/cpu_loop.py --models {' '.join(args.models)} --repeats {args.repeats} --steps {args.steps}`",
             "",
             "| summary | value |", "|---|---|"]
    lines += [f"| {name} | {verdict(name, summary[name])} |" for name in BARS]
    lines += [f"| layouts (ok) | {summary['layouts']} ({summary['ok']}) |", "",
              "| case | procs | layout | status | predicted s | measured s | error | spread s | noisy |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        predicted, measured = number(r, "predicted_step_time_s"), number(r, "measured_step_time_s")
        error = f"{measured / predicted - 1:+.0%}" if predicted and measured else ""
        lines.append(f"| {r['case']} | {r['nproc']} | `{r['layout']}` | {r['status']} | "
                     f"{predicted or 0:.4f} | {measured or 0:.4f} | {error} | {r.get('spread_s') or ''} | "
                     f"{r.get('noisy') or ''} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--work", help="keep calibrations, sweep CSVs and logs here (default: a temp dir)")
    parser.add_argument("--no-record", action="store_true", help="do not append to bench/results/cpu_loop.md")
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="plait-cpu-loop-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.models:
        rows += run_case(name, work, args.repeats, args.steps)
    summary = summarize(rows)
    text = markdown(rows, summary, args)
    print(text)
    if not args.no_record:
        results = ROOT / "bench" / "results" / "cpu_loop.md"
        if not results.exists():
            results.write_text("# CPU loop: the planner against plait's own runs on this machine (issue 12)\n\n"
                               "Written by `python bench/cpu_loop.py`; newest run last.\n\n")
        with results.open("a") as out:
            out.write("\n" + text)
    print(f"work files: {work}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
