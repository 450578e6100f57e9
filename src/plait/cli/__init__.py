"""plait command line: one module per subcommand, all of one shape.

Each module of ``COMMANDS`` has ``HELP`` (its line in ``plait --help``), ``add_arguments(parser)``
(its flags) and ``run(args) -> int`` (the exit status). ``argparse`` stops here: what the
commands call below ``plait.cli`` takes typed values. Every user error ends with one line on
stderr and exit status 2, never a traceback (``plait.cli.support.common.exit_status``).

  plan.py validate.py stacks.py models.py clusters.py   the planner's commands
  train.py data.py export.py generate.py                the runtime's commands
  profile.py calibrate.py sweep.py report.py            the measuring commands
  support/   what the command modules share: console, one-line errors, plan tables
  jobfile/   --config TOML job files: flags in TOML, read and written
"""

from __future__ import annotations

import argparse
import sys

from plait.cli import (
    calibrate,
    clusters,
    data,
    export,
    generate,
    models,
    plan,
    profile,
    report,
    stacks,
    sweep,
    train,
    validate,
)
from plait.cli.support import common

# name -> module, in the order of ``plait --help``
COMMANDS = {"plan": plan, "validate": validate, "train": train, "profile": profile, "calibrate": calibrate,
            "data": data, "export": export, "generate": generate,
            "models": models, "clusters": clusters,
            "stacks": stacks, "sweep": sweep, "report": report}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``only`` (a command's name), only that command's flags are added
    (the others' subparsers stay empty: ``plait --help`` and the list of commands are the same), which
    saves the ~7 ms of adding every command's flags on each in-process call."""
    parser = argparse.ArgumentParser(prog="plait", description="Plan, run and measure LLM parallelization layouts.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module in COMMANDS.items():
        command = sub.add_parser(name, help=module.HELP)
        if only is None or name == only:
            module.add_arguments(command)
    return parser


def main(argv: list[str] | None = None) -> int:
    return common.exit_status(_parse_and_run, argv)


def _parse_and_run(argv: list[str] | None) -> int:
    """Parse (a ``--config`` job file gives the command's defaults: ``plait.cli.jobfile``), then run."""
    from plait.cli.jobfile.read import parse_args

    first = (list(argv) if argv is not None else sys.argv[1:])[:1]
    args = parse_args(build_parser(first[0] if first and first[0] in COMMANDS else None), argv)
    return COMMANDS[args.command].run(args)
