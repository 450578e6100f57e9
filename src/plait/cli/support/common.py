"""What every command shares: the console, the cost parameters of ``--calibration``, --doc-len, warnings, and
the one place where a user error becomes one line on stderr and an exit status."""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable

from plait.errors import PlaitError

EXIT_USAGE = 2  # a user error (PlaitError without an exit_code of its own)
EXIT_INTERRUPTED = 130  # 128 + SIGINT


def console():
    """A rich console; wide when the output is not a terminal (files, pipes, CI logs)."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=200)


def warn(text: str) -> None:
    """``plait: warning: TEXT`` on stderr."""
    print(f"plait: warning: {text}", file=sys.stderr)


def cost_params(calibration, cluster=None):
    """(CostParams, cluster with GPU overrides applied) from a calibration, else defaults; the overrides'
    warnings go to stderr. ``calibration``: a file's path, one already read
    (``plait.plan.calibration.read_calibration``: a command that needs more of it reads it once), or None."""
    from plait.plan.calibration import read_calibration
    from plait.plan.params import DEFAULT_PARAMS

    if not calibration:
        return DEFAULT_PARAMS, cluster
    if isinstance(calibration, (str, os.PathLike)):
        calibration = read_calibration(calibration)  # checks every field; GPU and link overrides included
    if cluster is not None:
        cluster, warnings = calibration.apply(cluster)
        params = calibration.params
    else:  # e.g. validate: published runs on other GPUs
        params, warnings = calibration.params_for_runs_elsewhere()
    for warning in warnings:
        warn(warning)
    return params, cluster


USER_PATH_ERRORS = (errno.ENAMETOOLONG, errno.ELOOP)


def exit_status(run: Callable[[object], int], args) -> int:
    """``run(args)``'s exit status; a PlaitError is one line on stderr (status 2, or the error's own)."""
    try:
        return run(args)
    except PlaitError as exc:
        print(f"plait: error: {exc}", file=sys.stderr)
        return getattr(exc, "exit_code", EXIT_USAGE)
    except KeyboardInterrupt:
        print("plait: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except OSError as exc:
        if exc.errno not in USER_PATH_ERRORS:
            raise
        # a path the user gave that the filesystem cannot take (a name too long, a loop of links)
        name = str(exc.filename or "")
        shown = name if len(name) <= 120 else f"{name[:60]}...{name[-40:]} ({len(name):,} characters)"
        print(f"plait: error: cannot use the path {shown}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE


def doc_len_of(given: str | None) -> int:
    """--doc-len: a mean document length in tokens, or the one measured from a token file (0: not given)."""
    if given is None:
        return 0
    if given.strip().isdigit():
        if int(given) < 1:
            raise PlaitError(f"--doc-len {given}: a document holds at least 1 token")
        return int(given)
    from plait.run.data.tokens import TokenFile

    length = TokenFile(given).mean_document_length()
    if length is None:
        raise PlaitError(f"--doc-len {given}: the token file records no end-of-text id to count documents by; "
                         "give the mean document length in tokens")
    return length
