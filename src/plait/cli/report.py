"""``plait report`` on the command line: arguments and the call into ``plait.measure.report.build``."""

from __future__ import annotations

import argparse

HELP = "HTML and Markdown report with plots of a sweep, a plan or a training log"


def add_arguments(report: argparse.ArgumentParser) -> None:
    report.add_argument("--sweep", help="sweep CSV written by plait sweep --out")
    report.add_argument("--plan", help="plan file (plait plan --save): its memory per stage, step-time waterfall and "
                                       "pipeline schedule per rank; alone, a report of the plan without a sweep "
                                       "(with --sweep, the timeline default is the first swept layout with pp > 1)")
    report.add_argument("--train-log", metavar="JSONL",
                        help="plait train --log file: the loss (and eval loss) curve and the learning rate per step")
    report.add_argument("--runs", help="published-runs CSV: add plait validate's per-source error table")
    report.add_argument("--out", required=True, help="directory for report.html, report.md and the PNG plots")


def run(args) -> int:
    from plait.measure.report.build import write_report

    written = write_report(args.sweep, args.out, plan_path=args.plan, runs_path=args.runs, train_log=args.train_log)
    print(f"wrote {', '.join(str(p) for p in written)}")
    return 0
