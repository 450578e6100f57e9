"""plait command line: one module per subcommand, all of one shape.

Each module of ``COMMANDS`` has ``HELP`` (its line in ``plait --help``), ``add_arguments(parser)``
(its flags) and ``run(args) -> int`` (the exit status). ``argparse`` stops here: what the
commands call below ``plait.cli`` takes typed values. Every user error ends with one line on
stderr and exit status 2, never a traceback (``plait.cli.common.exit_status``).
"""

from __future__ import annotations

import argparse

from plait.cli import (
    calibrate,
    clusters,
    common,
    data,
    export,
    models,
    plan,
    profile,
    report,
    sweep,
    train,
    validate,
)

# name -> module, in the order of ``plait --help``
COMMANDS = {"plan": plan, "validate": validate, "train": train, "profile": profile, "calibrate": calibrate,
            "data": data, "export": export, "models": models, "clusters": clusters, "sweep": sweep, "report": report}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="plait", description="Plan, run and measure LLM parallelization layouts.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module in COMMANDS.items():
        module.add_arguments(sub.add_parser(name, help=module.HELP))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return common.exit_status(COMMANDS[args.command].run, args)
