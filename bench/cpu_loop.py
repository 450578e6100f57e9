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
     the measured best (regret), and the memory columns;
  4. the machine-state check: each case is profiled again right after its sweep and the sweep's
     layouts predicted with that profile too. If the second profile moves every prediction by
     about the same amount, the machine changed between profile and sweep (an offset shared by
     all layouts, also seen as a signed median error far from 0); the bars use the first profile.

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
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from results_file import append_result  # noqa: E402
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
# memory_error: the worst |predicted / measured - 1| over the layouts (the bar is for every layout)


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
    """Profile this CPU for each process count of the case, then sweep its layouts with that profile."""
    model, seq_len, batch, two, one = CASES[name]
    log = work / f"{name}.log"
    rows = []
    for nproc, layouts in ((2, two), (1, one)):
        if not layouts:
            continue
        # a profile describes N processes sharing the cores (threads per process = cores / N)
        calibration = work / f"{name}-cpu-{nproc}proc.json"
        plait("profile", "--device", "cpu", "--nproc-per-node", str(nproc), "--model", model,
              "--seq-len", str(seq_len), "--out", str(calibration), log=log)
        out = work / f"{name}-{nproc}proc.csv"
        plait("sweep", "--model", model, "--nproc-per-node", str(nproc), "--global-batch", str(batch),
              "--seq-len", str(seq_len), "--device", "cpu", "--calibration", str(calibration),
              "--steps", str(steps), "--repeats", str(repeats), "--min-time", "0", "--out", str(out),
              *[arg for layout in layouts for arg in ("--layout", layout)], log=log)
        # the machine-state check: the same profile again, right after the sweep
        after = work / f"{name}-cpu-{nproc}proc-after.json"
        plait("profile", "--device", "cpu", "--nproc-per-node", str(nproc), "--model", model,
              "--seq-len", str(seq_len), "--out", str(after), log=log)
        predicted_after = predictions_with(out, after)
        with out.open() as handle:
            rows += [dict(row, case=name, nproc=nproc, calibration_file=str(calibration),
                          predicted_after_s=predicted_after.get(row["layout"]))
                     for row in csv.DictReader(handle)]
    return rows


def predictions_with(csv_path: Path, calibration: Path) -> dict[str, float]:
    """The planner's step time of each layout of a sweep, predicted with another profile of this CPU
    (the one taken after the sweep), as ``plait report`` re-evaluates a sweep: {layout: seconds}."""
    from plait.measure.report.build import layout_plans, prediction_cluster, saved_summary
    from plait.measure.sweep.csv_file import read_sweep
    from plait.plan.calibration import read_calibration

    rows = read_sweep(csv_path)
    cluster, _ = prediction_cluster(rows, saved_summary(csv_path))
    profile = read_calibration(str(calibration))
    cluster, _ = profile.apply(cluster)
    return {row.layout: plan.step.step_time for row, plan in layout_plans(rows, cluster, profile.params)}


FIT_PARAMS = "dp_overlap,step_overhead_s,layer_overhead_s,tp_layer_overhead_s"


def refit(name: str, work: Path) -> list[dict]:
    """``plait calibrate fit`` on each two-process sweep of the case (step time, FIT_PARAMS, starting
    from its profile): in-sample and leave-one-layout-family-out median errors."""
    results = []
    for csv_path in sorted(work.glob(f"{name}-2proc.csv")):
        calibration = work / f"{name}-cpu-2proc.json"
        out = work / f"{name}-2proc-fit.json"
        log = work / f"{name}.log"
        plait("calibrate", "fit", "--runs", str(csv_path), "--calibration", str(calibration), "--metric",
              "step_time", "--params", FIT_PARAMS, "--out", str(out), log=log)
        record = json.loads(out.read_text())
        results.append({"case": name, "record": record})
    return results


def same_code(layout: str) -> str:
    """The layout with the knobs that do not change the code plait's runtime runs made equal: zero=1
    runs as zero=2 (FSDP2 without resharding after forward, ``plait.run.parallel.data``)."""
    return re.sub(r"\bzero=1\b", "zero=2", layout)


def spread_check(work: Path, repeats: int | None) -> list[dict]:
    """``plait sweep --top 3 --steps 3`` on the tiny model (the sweep's default timing for CPU runs,
    or ``repeats`` runs per layout when given): how far apart runs of identical code land, both the
    repeats of one layout (repeat_max_s / repeat_min_s - 1) and the step times the sweep reports for
    layouts that run the same code (``same_code``); bar: <= 25%."""
    out = work / "spread-top3.csv"
    plait("sweep", "--model", "tiny", "--nproc-per-node", "2", "--global-batch", "8", "--seq-len", "128",
          "--device", "cpu", "--top", "3", "--steps", "3", *(["--repeats", str(repeats)] if repeats else []),
          "--out", str(out), log=work / "spread.log")
    with out.open() as handle:
        rows = [r for r in csv.DictReader(handle) if r["status"] == "ok"]
    settings = json.loads((work / "spread-top3.summary.json").read_text())
    return [{"layout": r["layout"], "median_s": number(r, "measured_step_time_s"),
             "repeats": settings.get("repeats"), "min_time_s": settings.get("min_time_s"),
             "repeat_min_s": number(r, "repeat_min_s"), "repeat_max_s": number(r, "repeat_max_s"),
             "spread": number(r, "repeat_max_s") / number(r, "repeat_min_s") - 1
             if number(r, "repeat_min_s") else None} for r in rows]


def same_code_groups(spread: list[dict]) -> list[dict]:
    """Layouts of the spread check that run identical code, with how far apart their reported
    (median) step times are: [{"layouts", "medians", "apart"}], groups of two or more only."""
    groups: dict[str, list[dict]] = {}
    for row in spread:
        if row["median_s"]:
            groups.setdefault(same_code(row["layout"]), []).append(row)
    return [{"layouts": [r["layout"] for r in group], "medians": [r["median_s"] for r in group],
             "apart": max(r["median_s"] for r in group) / min(r["median_s"] for r in group) - 1}
            for group in groups.values() if len(group) > 1]


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
    # the bar is for every layout: the worst |memory error| over the rows with a like-for-like
    # measurement (counted tensor bytes, not the peak RSS of older sweeps)
    memory = [number(r, "memory_error") for r in ok if number(r, "memory_error") is not None
              and r.get("memory_kind") != "host_rss"]
    regrets = []
    for key in {(r["case"], r["nproc"]) for r in ok}:
        group = [r for r in ok if (r["case"], r["nproc"]) == key]
        top1 = min(group, key=lambda r: number(r, "predicted_step_time_s"))
        best = min(number(r, "measured_step_time_s") for r in group)
        regrets.append(number(top1, "measured_step_time_s") / best - 1)
    after = [(number(r, "measured_step_time_s"), number(r, "predicted_step_time_s"), number(r, "predicted_after_s"))
             for r in ok if number(r, "predicted_after_s")]
    return {
        "median_abs_error_after": statistics.median(abs(m / a - 1) for m, _, a in after) if after else None,
        "profile_moved": statistics.median(a / p - 1 for _, p, a in after) if after else None,
        "profile_moved_range": (min(a / p - 1 for _, p, a in after), max(a / p - 1 for _, p, a in after)) if after else None,
        "signed_median_error": statistics.median(errors) if errors else None,
        "layouts": len(rows), "ok": len(ok),
        "median_abs_step_time_error": statistics.median(abs(e) for e in errors) if errors else None,
        "spearman": spearman([number(r, "predicted_step_time_s") for r in ok],
                             [number(r, "measured_step_time_s") for r in ok]) if len(ok) > 1 else None,
        "top1_regret": max(regrets) if regrets else None,
        "memory_error": max(abs(m) for m in memory) if memory else None,
    }


def verdict(name: str, value: float | None) -> str:
    if value is None:
        return "n/a"
    bar = BARS[name]
    met = value >= bar if name == "spearman" else value <= bar
    return f"{value:.3f} ({'met' if met else 'NOT met'}: {'>=' if name == 'spearman' else '<='} {bar})"


def fit_lines(fits: list[dict]) -> list[str]:
    """The calibrate-fit table: per case, in-sample and held-out errors overall and per family."""
    if not fits:
        return []
    lines = ["", f"`plait calibrate fit --metric step_time --params {FIT_PARAMS}` on each two-process sweep "
             "(median |step-time error|; held out: leave-one-layout-family-out):", "",
             "| case | family | rows | profile | in-sample | held out |", "|---|---|---|---|---|---|"]
    for fit in fits:
        record = fit["record"]["fit"]
        errors = record["errors"]
        lines.append(f"| {fit['case']} | all | {record['rows_used']} | {_pct(errors['default'])} | "
                     f"{_pct(errors['in_sample'])} | {_pct(errors['held_out'])} |")
        lines += [f"| {fit['case']} | {f['family']} | {f['rows']} | {_pct(f['start'])} | {_pct(f['in_sample'])} | "
                  f"{_pct(f['held_out'])} |" for f in record["families"]]
    return lines


def _pct(value) -> str:
    return "" if value is None else f"{value:.1%}"


def spread_lines(spread: list[dict]) -> list[str]:
    if not spread:
        return []
    worst = max((r["spread"] for r in spread if r["spread"] is not None), default=None)
    groups = same_code_groups(spread)
    timing = f"{spread[0]['repeats']} runs per layout, at least {spread[0]['min_time_s'] or 0:g} s timed per run"
    lines = ["", f"`plait sweep --top 3 --steps 3` on the tiny model ({timing}), runs of identical code "
             "(bar: <= 25% apart):", "",
             f"- repeats of one layout: worst {_pct(worst)} apart (fastest against slowest run);"]
    lines += [f"- layouts that run the same code, as reported (median of their runs): "
              f"{' and '.join(f'`{name}` {median:.4f} s' for name, median in zip(g['layouts'], g['medians']))}, "
              f"{_pct(g['apart'])} apart;" for g in groups]
    if not groups:
        lines.append("- no two of the three layouts run the same code;")
    lines += ["", "| layout | reported s | fastest run s | slowest run s | apart |", "|---|---|---|---|---|"]
    lines += [f"| `{r['layout']}` | {r['median_s'] or 0:.4f} | {r['repeat_min_s'] or 0:.4f} | {r['repeat_max_s'] or 0:.4f} "
              f"| {_pct(r['spread'])} |" for r in spread]
    return lines


def drift_lines(summary: dict) -> list[str]:
    """The machine-state check in the summary table: the signed median error (an offset shared by every
    layout is the machine, not a layout's term), and each case profiled again after its sweep - how far
    that moved the predictions, and the median error with it (not a bar: the bars use the profile
    taken before)."""
    lines = []
    if summary.get("signed_median_error") is not None:
        lines.append(f"| signed median error (measured / predicted - 1) | {summary['signed_median_error']:+.1%} |")
    if summary.get("profile_moved") is not None:
        low, high = summary["profile_moved_range"]
        lines += [f"| profile after the sweep: predictions moved (median, range) | "
                  f"{summary['profile_moved']:+.1%} ({low:+.1%} .. {high:+.1%}) |",
                  f"| profile after the sweep: median abs step-time error | {summary['median_abs_error_after']:.3f} |"]
    return lines


def markdown(rows: list[dict], summary: dict, args, fits: list[dict] = (), spread: list[dict] = ()) -> str:
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"## {now} - {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
             f"python {platform.python_version()}",
             "",
             f"`python bench/cpu_loop.py --models {' '.join(args.models)} --repeats {args.repeats} --steps {args.steps}`",
             "",
             "| summary | value |", "|---|---|"]
    lines += [f"| {name} | {verdict(name, summary[name])} |" for name in BARS]
    lines += [f"| layouts (ok) | {summary['layouts']} ({summary['ok']}) |"]
    lines += drift_lines(summary)
    lines += ["", "| case | procs | layout | status | predicted s | measured s | error | spread s | noisy | "
              "predicted MiB | measured MiB | memory error | predicted after s |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        predicted, measured = number(r, "predicted_step_time_s"), number(r, "measured_step_time_s")
        error = f"{measured / predicted - 1:+.0%}" if predicted and measured else ""
        spread_s = number(r, "spread_s")
        memory = [number(r, k) for k in ("predicted_memory_bytes", "measured_memory_bytes", "memory_error")]
        mib = [f"{v / 2**20:.1f}" if v is not None else "" for v in memory[:2]]
        lines.append(f"| {r['case']} | {r['nproc']} | `{r['layout']}` | {r['status']} | "
                     f"{predicted or 0:.4f} | {measured or 0:.4f} | {error} | "
                     f"{'' if spread_s is None else f'{spread_s:.4f}'} | {r.get('noisy') or ''} | "
                     f"{mib[0]} | {mib[1]} | {'' if memory[2] is None else f'{memory[2]:+.0%}'} | "
                     f"{number(r, 'predicted_after_s') or 0:.4f} |")
    lines += fit_lines(list(fits)) + spread_lines(list(spread))
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--work", help="keep calibrations, sweep CSVs and logs here (default: a temp dir)")
    parser.add_argument("--no-record", action="store_true", help="do not append to bench/results/cpu_loop.md")
    parser.add_argument("--spread-repeats", type=int, default=None,
                        help="runs per layout of the --top 3 --steps 3 spread check (default: the sweep's "
                             "default for CPU runs; 0: skip it)")
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="plait-cpu-loop-"))
    work.mkdir(parents=True, exist_ok=True)
    rows, fits = [], []
    for name in args.models:
        rows += run_case(name, work, args.repeats, args.steps)
        fits += refit(name, work)
    spread = spread_check(work, args.spread_repeats) if args.spread_repeats != 0 else []
    summary = summarize(rows)
    text = markdown(rows, summary, args, fits, spread)
    print(text)
    if not args.no_record:
        append_result("cpu_loop.md", "CPU loop: the planner against plait's own runs on this machine (issue 12)", "cpu_loop.py", text)
    print(f"work files: {work}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
