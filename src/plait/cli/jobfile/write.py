"""Write a job file: the flags of a parsed command line as TOML (``plait train --print-config``).

Reading the file back (``plait.cli.jobfile.read``) gives the same values.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from plait.cli.jobfile.flags import flags_of, primary
from plait.cli.jobfile.toml_text import dumps


def job_file(parser: argparse.ArgumentParser, values: Mapping[str, object], leave_out: tuple[str, ...] = (),
             header: str = "") -> str:
    """The job file that sets ``values`` (argparse dest -> value) for ``parser``'s command.

    Every settable flag with a value other than None is written, in ``--help`` order, in its help
    group's table (ungrouped flags at the top); None means "not given" and is left out, as are the
    flags whose dest is in ``leave_out``."""
    top: dict[str, object] = {}
    tables: dict[str, dict[str, object]] = {}
    for flag in primary(flags_of(parser)):
        value = values.get(flag.dest)
        if value is None or flag.dest in leave_out:
            continue
        target = tables.setdefault(flag.table, {}) if flag.table else top
        target[flag.key] = flag.to_file(value)
    return dumps(top, tables, header)
