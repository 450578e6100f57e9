"""What ``--data`` names: one token file, or a weighted mixture of sources (no torch, no file reads
beyond ``stat``).

Syntax: ``--data "0.3:web.tok,0.7:books/"`` - sources separated by commas, each ``WEIGHT:PATH``.
Weights are decimals (``0.3``, ``3``, ``1e-2``), read exactly (``0.3`` is 3/10) and normalized
(``1:a,2:b`` is 1/3 and 2/3). A single source may leave its weight out. A path is a token file
(``plait data prepare``), a directory (of token files, or of parquet/arrow/jsonl shards streamed
and tokenized on the fly: ``plait.run.data.stream``), a glob of such files (``shards/*.parquet``), or
one shard file. In a job file, ``[[data.sources]]`` tables (``path``, ``weight``) say the same, and
``[data]``'s ``text_key`` and ``tokenizer`` set ``--data-text-key`` and ``--data-tokenizer``.
``canonical`` writes a spec with absolute paths (what a checkpoint records, so that a resume from
any directory finds the sources).
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from plait.errors import PlaitError

_WEIGHT = re.compile(r"^\s*((?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*:(.*)$")
STREAM_SUFFIXES = (".parquet", ".arrow", ".jsonl", ".ndjson")  # shards read as documents (a text column)
SYNTAX = "give SOURCE or WEIGHT:SOURCE,WEIGHT:SOURCE,... (e.g. 0.3:web.tok,0.7:books/)"


@dataclass(frozen=True)
class SourceSpec:
    """One source of ``--data``: its weight as written (None: a lone source without one) and its path."""

    weight: str | None
    path: str

    @property
    def fraction(self) -> Fraction:
        return Fraction(self.weight) if self.weight is not None else Fraction(1)

    def __str__(self) -> str:
        return self.path if self.weight is None else f"{self.weight}:{self.path}"


def parse_data(spec: str) -> list[SourceSpec]:
    """The sources of ``spec`` (see the module doc); PlaitError for an empty entry, a bad weight, or
    several sources of which some lack a weight."""
    parts = [part.strip() for part in str(spec).split(",")]
    if not str(spec).strip() or any(not part for part in parts):
        raise PlaitError(f"--data {spec!r}: an empty source; {SYNTAX}")
    sources = []
    for part in parts:
        match = _WEIGHT.match(part)
        if match and match.group(2).strip():
            weight = match.group(1)
            if Fraction(weight) <= 0:
                raise PlaitError(f"--data {spec!r}: weight {weight} of {match.group(2).strip()} must be > 0")
            sources.append(SourceSpec(weight, match.group(2).strip()))
        elif match or re.match(r"^\s*[-+]?[\d.eE]*\s*:", part) and not Path(part).exists():
            raise PlaitError(f"--data {spec!r}: {part!r} is not WEIGHT:PATH with a weight > 0; {SYNTAX}")
        else:
            sources.append(SourceSpec(None, part))
    if len(sources) > 1 and any(s.weight is None for s in sources):
        bare = next(s.path for s in sources if s.weight is None)
        raise PlaitError(f"--data {spec!r}: source {bare} has no weight; every source of a mixture needs one "
                         f"({SYNTAX})")
    return sources


def is_glob(path: str) -> bool:
    return any(c in path for c in "*?[")


def is_mixture(spec: str) -> bool:
    """Whether ``spec`` needs a mixture source: several sources, a weight, a directory, a glob or a
    shard file. A lone path to a file is a plain token file, read as it always was."""
    if str(spec) == "synthetic":
        return False
    sources = parse_data(spec)
    if len(sources) > 1 or sources[0].weight is not None:
        return True
    path = sources[0].path
    return is_glob(path) or Path(path).is_dir() or path.lower().endswith(STREAM_SUFFIXES)


def canonical(spec: str) -> str:
    """``spec`` with every path absolute (weights as written); "synthetic" and a lone token file as
    today (the lone file's absolute path)."""
    if str(spec) == "synthetic":
        return "synthetic"
    sources = parse_data(spec)
    out = []
    for source in sources:
        path = source.path
        absolute = os.path.abspath(path) + (os.sep if path.endswith(("/", os.sep)) else "")
        out.append(str(SourceSpec(source.weight, absolute)))
    return ",".join(out)


def expand(path: str) -> list[Path]:
    """The files of a glob, sorted; PlaitError when it matches none."""
    found = sorted(Path(p) for p in glob.glob(path, recursive=True) if Path(p).is_file())
    if not found:
        raise PlaitError(f"--data: no file matches {path}")
    return found


def source_names(sources: list[SourceSpec]) -> list[str]:
    """A short, unique name per source (its file stem or directory name) for the per-source token counts."""
    names: list[str] = []
    for source in sources:
        path = Path(source.path.rstrip("/" + os.sep) or source.path)
        base = path.parent.name if is_glob(path.name) else (path.name if path.is_dir() else path.stem)
        base = re.sub(r"[^A-Za-z0-9._-]", "_", base) or "source"
        name, n = base, 2
        while name in names:
            name, n = f"{base}-{n}", n + 1
        names.append(name)
    return names


def data_table(value: object, where: str) -> dict[str, object]:
    """A job file's ``[data]`` table -> {"data": spec, "data-text-key": ..., "data-tokenizer": ...}."""
    if not isinstance(value, dict):
        raise PlaitError(f"{where}data must be a string or a table with [[data.sources]]")
    unknown = sorted(set(value) - {"sources", "text_key", "tokenizer"})
    if unknown:
        raise PlaitError(f"{where}[data] has no key {unknown[0]!r} (keys: sources, text_key, tokenizer)")
    sources = value.get("sources")
    if not isinstance(sources, list) or not sources or not all(isinstance(s, dict) for s in sources):
        raise PlaitError(f"{where}[data] needs [[data.sources]] tables, each with path and weight")
    entries = []
    for index, source in enumerate(sources):
        extra = sorted(set(source) - {"path", "weight"})
        if extra or not isinstance(source.get("path"), str) or "," in source["path"]:
            why = (f"no key {extra[0]!r} (keys: path, weight)" if extra else "path must be a string"
                   if not isinstance(source.get("path"), str) else "a path with a comma cannot be a --data source")
            raise PlaitError(f"{where}[[data.sources]] {index + 1}: {why}")
        weight = source.get("weight")
        if weight is None and len(sources) == 1:
            entries.append(source["path"])
            continue
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or weight <= 0:
            raise PlaitError(f"{where}[[data.sources]] {index + 1} ({source['path']}): weight must be a number > 0, "
                             f"got {weight!r}")
        entries.append(f"{weight!r}:{source['path']}")  # repr: the shortest decimal, read back exactly
    out: dict[str, object] = {"data": ",".join(entries)}
    for key, flag in (("text_key", "data-text-key"), ("tokenizer", "data-tokenizer")):
        if key in value:
            out[flag] = value[key]
    return out
