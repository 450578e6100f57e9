"""Shared helpers to load the plain-data specs from dicts and JSON files with clear errors."""

from __future__ import annotations

import dataclasses
import json
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


def read_json_file(path: str | Path, what: str):
    """Parse a JSON file, or raise PlaitError naming the file and the problem."""
    path = Path(path)
    if not path.is_file():
        raise PlaitError(f"{what} {path} does not exist")
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PlaitError(f"{path}: not a valid {what} ({exc})") from None
