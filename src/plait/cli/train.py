"""``plait train``: its flags, turned into a ``TrainRequest`` for ``plait.run.launcher.resolve.start``.

Every flag, its help, default and job-file key is declared once, as a field of its section
(``plait.run.launcher.request.TRAIN_SECTIONS``, ``plait.run.settings``); nothing is restated here.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys

from plait.cli.jobfile.read import add_config_flags
from plait.cli.support.setting_flags import add_setting_flags
from plait.errors import PlaitError
from plait.run.launcher.request import TRAIN_SECTIONS, TrainRequest

HELP = "train a layout with torchrun (CPU: gloo, GPU: NCCL)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_setting_flags(parser, *TRAIN_SECTIONS)
    add_config_flags(parser, print_config=True)


def run(args) -> int:
    from plait.run.launcher.resolve import start

    request = _request(args)
    if not args.print_config:
        try:
            job_file = _job_file(args)
        except PlaitError:  # a flag value TOML cannot hold (bytes that are not UTF-8): the run goes on unrecorded
            job_file = None
        return start(request, job_file=job_file)
    job_file = _job_file(args)
    with contextlib.redirect_stdout(sys.stderr):  # stdout is the job file alone: `... --print-config > run.toml`
        start(dataclasses.replace(request, dry_run=True), job_file=job_file)
    sys.stdout.write(job_file)
    return 0


def _job_file(args) -> str:
    """The resolved job file of this command line (``--config`` file and flags merged): what
    ``--print-config`` prints and the checkpoints record; ``--config`` reads it back as the same request."""
    from plait.cli.jobfile.write import job_file

    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    return job_file(parser, vars(args), leave_out=("dry_run",),
                    header="plait train job file: plait train --config FILE (flags given there override it)")


def _request(args) -> TrainRequest:
    """The typed request of the parsed flags (every flag's dest is a TrainRequest field)."""
    return TrainRequest(**{field.name: getattr(args, field.name) for field in dataclasses.fields(TrainRequest)})
