"""Benchmark: full layout search, dense and mixture-of-experts, cold caches.

Bars on a 2-core machine: Llama-3 405B on 16,384 H100 (global batch 2048 x 8192) <= 2 s; Mixtral-8x7B
on 64 H100 <= 2 s and DeepSeek-V3 on 2,048 H100 <= 5 s (every layout, runnable by plait train or not),
for the top 5 plans as ``plait plan`` asks (``search(keep=5)``: layouts whose step-time lower bound is
slower are skipped); ``--exhaustive`` evaluates every layout (``plait plan --exhaustive``). Prints a
table and appends the result, with machine and date, to bench/results/search_speed.md.

    python bench/search_speed.py [--repeats 3] [--only MODEL] [--exhaustive]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
from pathlib import Path

from rich.console import Console
from rich.table import Table

from plait.plan import kernels, memo
from plait.plan.search import search
from plait.spec.hardware import get_cluster
from plait.spec.layout import JobSpec
from plait.spec.models import get_model

CASES = [
    ("llama3-405b", "dgx-h100", 16384, 2048, 8192),
    ("llama3-70b", "dgx-h100", 1024, 1024, 8192),
    ("llama2-13b", "dgx-a100", 64, 1024, 2048),
    ("mixtral-8x7b", "dgx-h100", 64, 512, 4096),
    ("deepseek-v3", "dgx-h100", 2048, 15360, 4096),
]


def run_case(name, cluster_name, gpus, batch, seq, repeats, keep):
    model, cluster, job = get_model(name), get_cluster(cluster_name, gpus), JobSpec(batch, seq)
    times, result = [], None
    for _ in range(repeats):
        kernels.layer_times.cache_clear()  # every repeat starts cold
        kernels.head_time.cache_clear()
        memo.clear_caches()
        result = search(model, cluster, job, keep=keep)
        times.append(result.seconds)
    return result, times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", action="append", help="model name(s) to run (default: all cases)")
    parser.add_argument("--exhaustive", action="store_true", help="evaluate every layout (default: the top 5's search)")
    args = parser.parse_args()
    keep = None if args.exhaustive else 5
    mode = "exhaustive" if keep is None else f"top {keep}"
    table = Table(title=f"plait plan: search time, {mode} (cold caches)", title_justify="left")
    for column in ("model", "GPUs", "batch x seq", "mode", "layouts", "evaluated", "skipped", "fitting found",
                   "median s", "max s", "best layout", "MFU"):
        table.add_column(column)
    rows = []
    for case in CASES:
        if args.only and case[0] not in args.only:
            continue
        result, times = run_case(*case, args.repeats, keep)
        best = result.plans[0]
        row = (case[0], f"{case[2]:,}", f"{case[3]} x {case[4]}", mode, f"{result.candidates:,}",
               f"{result.evaluated:,}", f"{result.skipped:,}", f"{len(result.plans):,}",
               f"{statistics.median(times):.2f}", f"{max(times):.2f}", str(best.layout), f"{100 * best.step.mfu:.1f}%")
        table.add_row(*row)
        rows.append(row)
    console = Console(width=220)
    console.print(table)
    machine = f"{platform.node()} - {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    out = Path(__file__).parent / "results" / "search_speed.md"
    out.parent.mkdir(exist_ok=True)
    new = not out.exists()
    with out.open("a") as handle:
        if new:
            handle.write("# Layout search speed\n\nBars: see bench/search_speed.py.\n")
        handle.write(f"\n## {datetime.date.today().isoformat()} - {machine}\n\n")
        handle.write("| " + " | ".join(table.columns[i].header for i in range(len(table.columns))) + " |\n")
        handle.write("|" + "---|" * len(table.columns) + "\n")
        for row in rows:
            handle.write("| " + " | ".join(row) + " |\n")
    console.print(f"recorded in {out}")


if __name__ == "__main__":
    main()
