"""A small TOML writer for what a job file holds (no imports of the job-file flags).

Booleans, integers, floats (``repr``: read back bit for bit; ``inf``/``nan`` as TOML writes them),
strings (TOML basic strings), lists of those, and one level of tables. ``tomllib`` reads the text
back as the same values.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from plait.errors import PlaitError

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def toml_string(text: str) -> str:
    """``text`` as a TOML basic string (quotes, backslashes and control characters escaped)."""
    out = []
    for char in text:
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04x}")
        elif 0xD800 <= ord(char) <= 0xDFFF:  # a byte that was not UTF-8 (surrogateescape): no TOML form
            raise PlaitError(f"cannot write {text[:60]!r} in a job file: it is not valid UTF-8 text")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def toml_value(value) -> str:
    """One value in TOML syntax; PlaitError for what a job file cannot hold (None, tables in lists, ...)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)  # always has "." or "e": a TOML float
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    raise PlaitError(f"a job file cannot hold {type(value).__name__} value {value!r}")


def toml_key(key: str) -> str:
    return key if _BARE_KEY.match(key) else toml_string(key)


def dumps(top: Mapping[str, object], tables: Mapping[str, Mapping[str, object]], header: str = "") -> str:
    """TOML text: ``header`` lines as comments, the ``top`` keys, then each non-empty table in order."""
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    lines += [f"{toml_key(k)} = {toml_value(v)}" for k, v in top.items()]
    for name, entries in tables.items():
        if entries:
            lines += ["", f"[{toml_key(name)}]", *(f"{toml_key(k)} = {toml_value(v)}" for k, v in entries.items())]
    return "\n".join(lines).strip("\n") + "\n"
