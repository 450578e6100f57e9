"""``plait report`` on the command line: arguments and the call into ``plait.measure.report.build``."""

from __future__ import annotations

import argparse

HELP = "HTML and Markdown report with plots of a sweep"


def add_arguments(report: argparse.ArgumentParser) -> None:
    report.add_argument("--sweep", required=True, help="sweep CSV written by plait sweep --out")
    report.add_argument("--plan", help="plan file (plait plan --save) whose pipeline schedule is drawn per rank "
                                       "(default: the first swept layout with pp > 1)")
    report.add_argument("--runs", help="published-runs CSV: add plait validate's per-source error table")
    report.add_argument("--out", required=True, help="directory for report.html, report.md and the PNG plots")


def run(args) -> int:
    from plait.measure.report.build import write_report

    written = write_report(args.sweep, args.out, plan_path=args.plan, runs_path=args.runs)
    print(f"wrote {', '.join(str(p) for p in written)}")
    return 0
