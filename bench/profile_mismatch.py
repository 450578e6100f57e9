"""Benchmark (issue 34): a CPU profile of *another* model against the tiny model's own profile.

The issue's case: ``plait profile --nproc-per-node 2 --device cpu`` (default model llama3-8b), then
``plait sweep --model tiny --calibration`` that profile. Here:

  1. profile this CPU with the default model (llama3-8b) and with ``--model tiny --seq-len 128``;
  2. sweep the tiny model's layouts once (``plait sweep``, 2 processes, with the first profile);
  3. predict each swept layout with each profile (``cpu_loop.predictions_with``, as ``plait report``
     re-evaluates a sweep; ``--old FILE``: also a profile written before the GEMM roofline) and
     report the median |measured / predicted - 1| per profile, and whether ``plait sweep`` printed
     the coverage warning.

Bars (issue 34): other model's profile <= 30%, the model's own <= 10%. Results are appended to
``bench/results/cpu_loop.md``.

    nice python bench/profile_mismatch.py --steps 6 --repeats 1
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_loop import ROOT, plait, predictions_with  # noqa: E402
from results_file import append_result  # noqa: E402

LAYOUTS = ["dp=2,mbs=4", "dp=2,mbs=1", "dp=2,mbs=4,zero=3", "tp=2,mbs=8", "pp=2,mbs=2", "cp=2,mbs=4",
           "dp=2,mbs=4,ckpt=full"]
BARS = {"other model": 0.30, "own model": 0.10}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs per layout (0: plait sweep's CPU defaults, 3 runs of at least 1 s, interleaved)")
    parser.add_argument("--work", help="keep files here (default: a temp dir)")
    parser.add_argument("--old", help="a calibration written before the roofline, predicted with too")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="plait-mismatch-"))
    work.mkdir(parents=True, exist_ok=True)
    log = work / "mismatch.log"
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    profiles = {"other model": work / "default-llama3-8b.json", "own model": work / "tiny.json"}
    if not profiles["other model"].is_file():
        plait("profile", "--device", "cpu", "--nproc-per-node", "2", "--out", str(profiles["other model"]), log=log)
    if not profiles["own model"].is_file():
        plait("profile", "--device", "cpu", "--nproc-per-node", "2", "--model", "tiny", "--seq-len", "128",
              "--out", str(profiles["own model"]), log=log)
    if args.old:
        profiles["other model, before the roofline"] = Path(args.old)
    out = work / "tiny-2proc.csv"
    start = log.stat().st_size
    plait("sweep", "--model", "tiny", "--nproc-per-node", "2", "--global-batch", "8", "--seq-len", "128",
          "--device", "cpu", "--calibration", str(profiles["other model"]), "--steps", str(args.steps),
          *(["--repeats", str(args.repeats), "--min-time", "0"] if args.repeats else []), "--out", str(out),
          *[a for layout in LAYOUTS for a in ("--layout", layout)], log=log)
    warned = [line for line in log.read_text()[start:].splitlines() if "did not measure GEMMs" in line]
    with out.open() as handle:
        rows = [r for r in csv.DictReader(handle) if r["status"] == "ok" and r["measured_step_time_s"]]
    predicted = {name: predictions_with(out, path) for name, path in profiles.items()}
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"## {now} - {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
             f"python {platform.python_version()} - issue 34: a profile of another model", "",
             f"`python bench/profile_mismatch.py --steps {args.steps} --repeats {args.repeats}`: tiny (seq 128, "
             "global batch 8, 2 processes) swept once, predicted with the default profile (llama3-8b shapes and "
             "the tiny..8B reference set) and with `--model tiny`'s.", "",
             f"coverage warning printed by the sweep with the default profile: {'yes' if warned else 'no'}; "
             f"load average (1 min) at the start {load_before if load_before is None else f'{load_before:.1f}'}, "
             f"at the end {os.getloadavg()[0] if hasattr(os, 'getloadavg') else None:.1f} (2 cores, shared)", "",
             "| profile | median abs step-time error | signed median (measured / predicted - 1) | bar |",
             "|---|---|---|---|"]
    errors = {}
    for name in profiles:
        errors[name] = [float(r["measured_step_time_s"]) / predicted[name][r["layout"]] - 1 for r in rows
                        if predicted[name].get(r["layout"])]
        median = statistics.median(abs(e) for e in errors[name])
        bar = BARS.get(name)
        verdict = "" if bar is None else f"<= {bar:.0%} ({'met' if median <= bar else 'NOT met'})"
        lines.append(f"| {name} | {median:.1%} | {statistics.median(errors[name]):+.1%} | {verdict} |")
    # how far the other model's profile moves the predictions from the model's own (no measurement in it)
    both = [predicted["other model"][r["layout"]] / predicted["own model"][r["layout"]] - 1 for r in rows
            if predicted["other model"].get(r["layout"]) and predicted["own model"].get(r["layout"])]
    if both:
        lines += ["", f"other model's profile against the own model's, predictions: median |other / own - 1| "
                      f"{statistics.median(abs(b) for b in both):.1%} (range {min(both):+.0%} .. {max(both):+.0%})"]
    lines += ["", "| layout | measured s | " + " | ".join(f"predicted s ({n})" for n in profiles) + " |",
              "|---|---|" + "---|" * len(profiles)]
    for r in rows:
        lines.append(f"| `{r['layout']}` | {float(r['measured_step_time_s']):.4f} | "
                     + " | ".join(f"{predicted[n].get(r['layout'], 0):.4f}" for n in profiles) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_record:
        append_result("cpu_loop.md", "CPU loop: the planner against plait's own runs on this machine (issue 12)",
                      "cpu_loop.py", text)
    print(f"work files: {work} ({ROOT})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
