"""Shared helpers to load the plain-data specs from dicts and JSON files with clear errors."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from plait.errors import PlaitError


def dataclass_from_dict(cls, data: dict, what: str):
    """Build ``cls(**data)``; unknown or missing fields become one clear PlaitError."""
    if not isinstance(data, dict):
        raise PlaitError(f"{what} spec must be a JSON object")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise PlaitError(f"unknown {what} fields {unknown}; expected some of {sorted(known)}")
    try:
        return cls(**data)
    except TypeError as exc:  # a required field is missing
        raise PlaitError(f"{what} spec is incomplete: {exc}") from None


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400 parses to inf
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def parse_json(text: str, finite: bool = True):
    """Strict JSON: NaN, Infinity and numbers that overflow a float (1e400) are refused with
    ValueError (unless ``finite`` is False: then they are floats, for a reader that range-checks
    every number itself and names the field), as are integers over Python's digit limit (4,300)
    and nesting too deep to parse."""
    try:
        if not finite:
            return json.loads(text)
        return json.loads(text, parse_float=_finite_float, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def read_json_file(path: str | Path, what: str, finite: bool = True):
    """Parse a JSON file with ``parse_json``, or raise PlaitError naming the file and the problem."""
    path = Path(path)
    if not path.is_file():
        raise PlaitError(f"{what} {path} does not exist")
    try:
        return parse_json(path.read_text(encoding="utf-8"), finite)
    except (OSError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise PlaitError(f"{path}: not a valid {what} ({_short(exc)})") from None


def _short(exc: Exception) -> str:
    """The first line of an exception's text, at most 200 characters (a PlaitError is one line)."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def toml_module(what: str):
    """Python's TOML reader: ``tomllib`` (3.11+) or ``tomli`` (3.10, installed with plait there);
    ``what`` names the file kind for the error when neither is importable."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            raise PlaitError(f"reading a {what} on Python 3.10 needs tomli: pip install tomli") from None
    return tomllib
