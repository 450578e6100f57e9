"""Read a job file: ``--config FILE`` gives a command's flags defaults, the command line overrides them.

``parse_args`` finds the command in ``argv``; when it has ``--config`` and the command line names a
file, the file's settings (``read_job_file``) become the subcommand parser's defaults (and its
required flags are no longer required when the file sets them), then argparse parses ``argv`` as
usual: a flag given on the command line wins over the file. A repeatable flag (``--fix``) given on
the command line adds to the file's list. Paths in the file are read as on the command line
(relative to the current directory).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from plait.cli.jobfile.flags import Flag, flags_of, lookup
from plait.errors import PlaitError
from plait.run.data.mixture_spec import data_table
from plait.spec.serialize import toml_module

MAX_BYTES = 1 << 20  # a job file is a few hundred bytes; a larger file is not one


def add_config_flags(parser: argparse.ArgumentParser, print_config: bool = False) -> None:
    """``--config FILE`` (and ``--print-config``) in a "job file" group of ``parser``."""
    group = parser.add_argument_group("job file")
    group.add_argument("--config", metavar="FILE",
                       help="TOML job file setting any of these flags (keys: flag names, at the top level or in "
                            "a table named by the group's first word, e.g. [optimizer]); flags given here override it")
    if print_config:
        group.add_argument("--print-config", action="store_true",
                           help="check the run as --dry-run does (its report on stderr), then print the resolved job "
                                "file (TOML) on stdout and exit; --config reads it back")


def read_job_file(path: str, parser: argparse.ArgumentParser, command: str) -> dict[str, object]:
    """dest -> value of every flag the TOML job file at ``path`` sets for ``parser``'s command.

    PlaitError (one line, naming the file) for a missing or unreadable file, bad TOML, an unknown
    key (with the closest valid one), a key in the wrong table, a key set twice, or a value of the
    wrong type for its flag."""
    file = Path(path)
    try:
        if not file.is_file():
            raise PlaitError(f"--config {path}: no such file" if not file.exists() else f"--config {path}: not a file")
        if file.stat().st_size > MAX_BYTES:
            raise PlaitError(f"--config {path}: {file.stat().st_size:,} bytes is too large for a job file")
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PlaitError(f"--config {path}: cannot read it ({exc})") from None
    tomllib = toml_module("job file")
    try:
        data = tomllib.loads(text)
    except (ValueError, RecursionError) as exc:  # TOMLDecodeError; an integer of > 4300 digits; deep nesting
        why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc).split(";")[0]
        raise PlaitError(f"{path} is not valid TOML: {why}") from None
    return settings(data, flags_of(parser), f"{path}: ", command)


def settings(data: dict, flags: dict[str, Flag], where: str, command: str) -> dict[str, object]:
    """dest -> value from a parsed job file (see ``read_job_file``)."""
    tables = {flag.table for flag in flags.values() if flag.table}
    out: dict[str, object] = {}
    keys: dict[str, str] = {}  # dest -> the key that set it

    def put(key: str, value, table: str | None) -> None:
        flag = lookup(key, flags, where + (f"[{table}] " if table else ""), command)
        if table is not None and flag.table != table:
            home = f"in [{flag.table}] or at the top level" if flag.table else "at the top level"
            raise PlaitError(f"{where}[{table}] has no key {key!r}: it belongs {home}")
        if flag.dest in out:
            raise PlaitError(f"{where}{key!r} sets --{flag.key} again (already set by {keys[flag.dest]!r})")
        out[flag.dest] = flag.from_file(value, where)
        keys[flag.dest] = f"[{table}] {key}" if table else key

    for key, value in data.items():
        name = key.replace("_", "-")
        if name == "data" and isinstance(value, dict) and "data" in {f.key for f in flags.values()}:
            for inner, item in data_table(value, where).items():  # [[data.sources]]: a mixture
                put(inner, item, None)
        elif isinstance(value, dict) and name in tables:
            for inner, item in value.items():
                put(inner, item, name)
        else:
            put(key, value, None)
    return out


def _subcommand(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[argparse.ArgumentParser | None, list[str]]:
    """(the parser of the command named in ``argv``, the arguments after it); (None, []) when none is named."""
    commands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not commands:
        return None, []
    for index, token in enumerate(argv):
        if not token.startswith("-"):
            return commands[0].choices.get(token), argv[index + 1:]
    return None, []


def _given_config(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """The ``--config`` the command line gives, parsed by the command's own parser (abbreviations
    and ``--config=FILE`` alike), with required flags waived: the file may set them."""
    waived = [action for action in parser._actions if action.required]
    for action in waived:
        action.required = False
    try:
        known, _ = parser.parse_known_args(argv)
    finally:
        for action in waived:
            action.required = True
    return getattr(known, "config", None)


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """``parser.parse_args(argv)``, with the command's ``--config FILE`` as defaults under the flags given."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command, rest = _subcommand(parser, argv)
    if command is not None and any(a.dest == "config" for a in command._actions):
        path = _given_config(command, rest)
        if path is not None:
            values = read_job_file(path, command, command.prog.split()[-1])
            command.set_defaults(**values)
            for action in command._actions:
                if action.dest in values:
                    action.required = False
    return parser.parse_args(argv)
