"""The flags a job file may set, read from a command's argparse parser (never a second list).

Every long flag that takes a value, or is a switch, is settable: its key is the flag name without
the leading dashes (``--global-batch`` -> ``global-batch``; ``global_batch`` is the same key), and
its table is its help group's (``table_name``). A TOML value is checked as argparse would check
the flag's text: the flag's ``type`` (int, float, str or a converter), its ``choices``, and for
switches a TOML boolean.
"""

from __future__ import annotations

import argparse
import difflib
import re
from dataclasses import dataclass

from plait.cli.jobfile.toml_text import toml_value
from plait.errors import PlaitError

NOT_SETTABLE = ("help", "config", "print-config")  # flags about the job file itself, not the job
SWITCHES = (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._StoreConstAction,
            argparse.BooleanOptionalAction)
VALUED = (argparse._StoreAction, argparse._AppendAction)
MAX_SHOWN = 60  # characters of a bad value quoted in an error


@dataclass(frozen=True)
class Flag:
    """One settable flag: its key in a job file, its argparse action and its table (None: top level only)."""

    key: str  # the long flag name without "--", e.g. "global-batch"
    action: argparse.Action
    table: str | None

    @property
    def dest(self) -> str:
        return self.action.dest

    def from_file(self, value, where: str):
        """The flag's value (what argparse would store) for the TOML ``value``; PlaitError naming ``where``."""
        action = self.action
        if isinstance(action, SWITCHES):
            if not isinstance(value, bool):
                raise PlaitError(f"{where}{self.key} = {shown(value)}: give true or false")
            if isinstance(action, argparse.BooleanOptionalAction):
                return value
            return action.const if value else action.default
        if isinstance(action, argparse._AppendAction) or action.nargs not in (None, "?"):
            items = value if isinstance(value, list) else [value]
            return [self._scalar(item, where) for item in items]
        return self._scalar(value, where)

    def to_file(self, value):
        """The TOML value that ``from_file`` turns back into ``value`` (the inverse, for writing)."""
        action = self.action
        if isinstance(action, argparse.BooleanOptionalAction):
            return bool(value)
        if isinstance(action, SWITCHES):
            return value == action.const
        return list(value) if isinstance(value, (list, tuple)) else value

    def _scalar(self, value, where: str):
        kind, action = self.action.type, self.action
        if isinstance(value, bool) or isinstance(value, (dict, list)) or not isinstance(value, (int, float, str)):
            raise PlaitError(f"{where}{self.key} = {shown(value)}: expected {expected(kind)}")
        if kind is int:
            if not isinstance(value, int):
                raise PlaitError(f"{where}{self.key} = {shown(value)}: expected an integer")
            converted = value
        elif kind is float:
            if isinstance(value, str):
                raise PlaitError(f"{where}{self.key} = {shown(value)}: expected a number")
            try:
                converted = float(value)
            except OverflowError:
                raise PlaitError(f"{where}{self.key} = {shown(value)}: too large for a number") from None
        elif kind is None or kind is str:
            if isinstance(value, float):
                raise PlaitError(f"{where}{self.key} = {shown(value)}: expected a string")
            converted = str(value)
        else:
            try:
                converted = kind(value if isinstance(value, str) else str(value))
            except (ValueError, TypeError, argparse.ArgumentTypeError) as exc:
                raise PlaitError(f"{where}{self.key} = {shown(value)}: {exc}") from None
        if action.choices is not None and converted not in action.choices:
            choices = ", ".join(map(str, action.choices))
            raise PlaitError(f"{where}{self.key} = {shown(value)}: expected one of {choices}")
        return converted


def expected(kind) -> str:
    return {int: "an integer", float: "a number"}.get(kind, "a string")


def shown(value) -> str:
    """A value as a job file writes it, cut to ``MAX_SHOWN`` characters."""
    try:
        text = toml_value(value)
    except PlaitError:
        text = repr(value)
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 3] + "..."


def table_name(title: str) -> str:
    """The job-file table of an argparse group: the first word of its title, in lower case
    (``"checkpoints, resume, failures"`` -> ``checkpoints``, ``"where to run (torchrun)"`` -> ``where``)."""
    return re.split(r"[^a-z0-9-]", title.strip().lower(), maxsplit=1)[0]


def flags_of(parser: argparse.ArgumentParser) -> dict[str, Flag]:
    """key -> Flag for every settable flag of ``parser``, in the parser's order. Aliases are keys of
    the same Flag (``nproc`` beside ``nproc-per-node``); ``--no-X`` of a ``--X/--no-X`` switch is not a key."""
    ungrouped = {parser._positionals.title, parser._optionals.title}
    tables = {}
    for group in parser._action_groups:
        for action in group._group_actions:
            tables[id(action)] = None if group.title in ungrouped else table_name(group.title or "")
    out: dict[str, Flag] = {}
    for action in parser._actions:
        if not isinstance(action, (*SWITCHES, *VALUED)):
            continue
        names = [o[2:] for o in action.option_strings if o.startswith("--")]
        if isinstance(action, argparse.BooleanOptionalAction):
            names = [n for n in names if not n.startswith("no-")]
        if not names or names[0] in NOT_SETTABLE:
            continue
        flag = Flag(names[0], action, tables.get(id(action)))
        for name in names:
            out[name] = flag
    return out


def primary(flags: dict[str, Flag]) -> list[Flag]:
    """Each flag once (under its first name), in the parser's order."""
    return [flag for key, flag in flags.items() if key == flag.key]


def lookup(key: str, flags: dict[str, Flag], where: str, command: str) -> Flag:
    """The flag a job-file key names (dashes or underscores); PlaitError naming the closest valid key."""
    name = key.replace("_", "-")
    if name in flags:
        return flags[name]
    if name in NOT_SETTABLE:
        raise PlaitError(f"{where}{key}: --{name} is given on the command line, not in a job file")
    tables = sorted({f.table for f in flags.values() if f.table})
    close = difflib.get_close_matches(name, [*flags, *tables], n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise PlaitError(f"{where}unknown key {key!r}{hint} (keys are the flags of `plait {command} --help`)")
