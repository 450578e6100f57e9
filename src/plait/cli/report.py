"""``plait report`` on the command line: arguments and the call into ``plait.measure.report.build``."""

from __future__ import annotations

import argparse


def register(sub) -> None:
    """Add ``plait report`` to the CLI's subparsers; ``plait.cli.main`` calls ``args.handler``."""
    report = sub.add_parser("report", help="HTML and Markdown report with plots of a sweep")
    add_report_args(report)
    report.set_defaults(handler=cmd_report)


def add_report_args(report: argparse.ArgumentParser) -> None:
    report.add_argument("--sweep", required=True, help="sweep CSV written by plait sweep --out")
    report.add_argument("--plan", help="plan file (plait plan --save) whose pipeline schedule is drawn per rank "
                                       "(default: the first swept layout with pp > 1)")
    report.add_argument("--runs", help="published-runs CSV: add plait validate's per-source error table")
    report.add_argument("--out", required=True, help="directory for report.html, report.md and the PNG plots")


def cmd_report(args) -> int:
    from plait.measure.report.build import write_report

    written = write_report(args.sweep, args.out, plan_path=args.plan, runs_path=args.runs)
    print(f"wrote {', '.join(str(p) for p in written)}")
    return 0
