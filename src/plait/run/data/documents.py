"""The documents of ``plait data prepare``'s inputs: which files, cut into units of work, read as texts.

Input kinds by file name: ``.txt`` (the whole file is one document; also any other name given
explicitly), ``.jsonl``/``.ndjson`` (one JSON object per line, its ``text_key`` field is the
document), ``.json`` (a list of such objects, one object, or JSON lines), ``.parquet`` and ``.arrow``
(Arrow IPC, file or stream format, as Hugging Face ``datasets`` writes it): the ``text_key``
column, one document per row; needs pyarrow. A directory means every such file
under it, recursively, in sorted order. Empty texts and JSON ``null`` are skipped; a record
without ``text_key`` is an error naming the key and the keys the record has.

A unit is what one worker reads: a whole text or JSON file, a part of about ``UNIT_BYTES`` of a
JSON-lines file (cut at line ends), or one parquet row group (an arrow file is one unit). Units depend only on the inputs (never
on the number of workers), so any worker count produces the same documents in the same order.
No torch here; pyarrow is imported only for parquet inputs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from plait.errors import PlaitError

KINDS = {".txt": "text", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet",
         ".arrow": "arrow"}
UNIT_BYTES = 16 * 2**20  # a JSON-lines file is read in parts of about this many bytes (one worker each)
SHOWN_KEYS = 10  # keys of a record named in the error when text_key is missing


@dataclass(frozen=True)
class Unit:
    """One piece of work. ``start``/``stop``: byte range of a JSON-lines file (stop -1: to its end), or
    the row group (``start``) of a parquet file; unused for text and JSON files."""

    file_index: int  # position of the file in the sorted input list
    path: str
    kind: str  # one of KINDS' values
    start: int = 0
    stop: int = -1


def find_files(inputs: Sequence[str | os.PathLike]) -> list[Path]:
    """The input files in order: each file as given, each directory's known kinds recursively, sorted."""
    if not inputs:
        raise PlaitError("no input given; pass text, JSON lines, JSON or parquet files, or directories of them")
    files: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.suffix.lower() in KINDS and p.is_file())
            if not found:
                raise PlaitError(f"no *.txt, *.jsonl, *.json, *.parquet or *.arrow files under directory {path}")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise PlaitError(f"input {path} not found")
    return files


def kind_of(path: Path) -> str:
    """The input kind of ``path`` by its suffix; any other file is text."""
    return KINDS.get(path.suffix.lower(), "text")


def plan_units(files: Sequence[Path], text_key: str, unit_bytes: int | None = None) -> list[Unit]:
    """The units of work of ``files`` (parquet files are opened here, so a missing column fails early);
    ``unit_bytes``: size of a JSON-lines part (default ``UNIT_BYTES``)."""
    unit_bytes = UNIT_BYTES if unit_bytes is None else unit_bytes
    units: list[Unit] = []
    for index, path in enumerate(files):
        kind = kind_of(path)
        if kind == "jsonl":
            bounds = _line_bounds(path, unit_bytes)
            units.extend(Unit(index, str(path), kind, a, b) for a, b in zip(bounds, bounds[1:]))
        elif kind == "parquet":
            units.extend(Unit(index, str(path), kind, group) for group in range(_parquet_groups(path, text_key)))
        else:
            units.append(Unit(index, str(path), kind))
    return units


def _line_bounds(path: Path, unit_bytes: int) -> list[int]:
    """Byte offsets 0 = b0 < b1 < ... < bn = size cutting the file after line ends, parts of >= unit_bytes."""
    try:
        size = path.stat().st_size
        bounds = [0]
        with open(path, "rb") as f:
            while bounds[-1] + unit_bytes < size:
                f.seek(bounds[-1] + unit_bytes)
                f.readline()  # to the end of the line holding that byte
                if f.tell() >= size:
                    break
                bounds.append(f.tell())
    except OSError as e:
        raise PlaitError(f"cannot read input {path}: {e.strerror or e}") from None
    return [*bounds, size]


def _pyarrow_parquet():
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise PlaitError("reading parquet files needs pyarrow: pip install pyarrow (or pip install -e '.[data]')") \
            from None
    return pq


def _parquet_groups(path: Path, text_key: str) -> int:
    """Row groups of a parquet file whose ``text_key`` column holds strings."""
    pq = _pyarrow_parquet()
    import pyarrow as pa

    try:
        meta = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as e:
        raise PlaitError(f"cannot read parquet file {path}: {str(e).splitlines()[0]}") from None
    schema = meta.schema_arrow
    if text_key not in schema.names:
        shown = ", ".join(schema.names[:SHOWN_KEYS]) + (", ..." if len(schema.names) > SHOWN_KEYS else "")
        raise PlaitError(f"parquet file {path} has no column {text_key!r} (its columns: {shown}); "
                         "pass --text-key with one of them")
    column = schema.field(text_key).type
    if not (pa.types.is_string(column) or pa.types.is_large_string(column) or pa.types.is_null(column)
            or getattr(pa.types, "is_string_view", lambda t: False)(column)):
        raise PlaitError(f"parquet file {path}: column {text_key!r} holds {column}, not text; "
                         "pass --text-key with a string column")
    return meta.num_row_groups


def read_documents(unit: Unit, text_key: str) -> list[str]:
    """The non-empty document texts of ``unit``, in order."""
    path = Path(unit.path)
    if unit.kind == "parquet":
        table = _pyarrow_parquet().ParquetFile(path).read_row_group(unit.start, columns=[text_key])
        return [t for t in table.column(0).to_pylist() if t]
    if unit.kind == "arrow":
        return _arrow_documents(path, text_key)
    try:
        with open(path, "rb") as f:
            f.seek(unit.start)
            raw = f.read() if unit.stop < 0 else f.read(unit.stop - unit.start)
    except OSError as e:
        raise PlaitError(f"cannot read input {path}: {e.strerror or e}") from None
    if unit.kind == "jsonl":
        return _json_lines(raw, path, unit.start, text_key)
    if unit.kind == "json":
        return _json_file(raw, path, text_key)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PlaitError(f"input {path} is not UTF-8 text (byte {e.start})") from None
    return [text] if text else []


def _arrow_documents(path: Path, text_key: str) -> list[str]:
    """The non-empty texts of column ``text_key`` of an Arrow IPC file (random-access or stream format)."""
    try:
        import pyarrow as pa
    except ImportError:
        raise PlaitError("reading arrow files needs pyarrow: pip install pyarrow (or pip install -e '.[data]')") \
            from None
    try:
        with pa.memory_map(str(path)) as source:
            try:
                table = pa.ipc.open_file(source).read_all()
            except pa.ArrowInvalid:  # not the file format: the stream format (Hugging Face datasets' shards)
                source.seek(0)
                table = pa.ipc.open_stream(source).read_all()
    except (OSError, pa.ArrowException) as e:
        raise PlaitError(f"cannot read arrow file {path}: {str(e).splitlines()[0]}") from None
    if text_key not in table.column_names:
        shown = ", ".join(table.column_names[:SHOWN_KEYS]) + (", ..." if table.num_columns > SHOWN_KEYS else "")
        raise PlaitError(f"arrow file {path} has no column {text_key!r} (its columns: {shown}); "
                         "pass the name of its text column")
    texts = table.column(text_key).to_pylist()
    if any(t is not None and not isinstance(t, str) for t in texts):
        raise PlaitError(f"arrow file {path}: column {text_key!r} holds {table.schema.field(text_key).type}, not text")
    return [t for t in texts if t]


def _text_of(record: object, text_key: str, where: str) -> str | None:
    """The document of one JSON record (None: null, skipped)."""
    if not isinstance(record, dict):
        raise PlaitError(f"{where}: a JSON {type(record).__name__} where an object with key {text_key!r} "
                         "was expected")
    if text_key not in record:
        keys = list(record)
        shown = ", ".join(map(str, keys[:SHOWN_KEYS])) + (", ..." if len(keys) > SHOWN_KEYS else "")
        raise PlaitError(f"{where}: no key {text_key!r} (its keys: {shown or 'none'}); "
                         "pass --text-key with the one that holds the text")
    text = record[text_key]
    if text is not None and not isinstance(text, str):
        raise PlaitError(f"{where}: key {text_key!r} holds a JSON {type(text).__name__}, not text")
    if text and not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:  # JSON's "\ud800": a lone surrogate, not a character
            raise PlaitError(f"{where}: key {text_key!r} holds a lone surrogate ({text[e.start]!r} at character "
                             f"{e.start}), not Unicode text") from None
    return text


def _decode_problem(exc: BaseException) -> str:
    """What made ``json.loads`` fail other than a syntax error: an integer of more than Python's 4300
    digits, or nesting deeper than its recursion limit."""
    return "nested too deeply" if isinstance(exc, RecursionError) else str(exc).split(";")[0]


def _json_lines(raw: bytes, path: Path, start: int, text_key: str) -> list[str]:
    docs: list[str] = []
    offset = start
    for number, line in enumerate(raw.split(b"\n"), 1):
        where = f"{path} line {number}" if start == 0 else f"{path} (the line at byte {offset})"
        offset += len(line) + 1
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except UnicodeDecodeError:
            raise PlaitError(f"{where} is not UTF-8 text") from None
        except json.JSONDecodeError as e:
            raise PlaitError(f"{where} is not a JSON object ({e.msg} at column {e.colno}); a .jsonl file holds "
                             "one JSON object per line") from None
        except (ValueError, RecursionError) as e:
            raise PlaitError(f"{where} cannot be read as JSON ({_decode_problem(e)})") from None
        text = _text_of(record, text_key, where)
        if text:
            docs.append(text)
    return docs


def _json_file(raw: bytes, path: Path, text_key: str) -> list[str]:
    try:
        data = json.loads(raw)
    except UnicodeDecodeError:
        raise PlaitError(f"input {path} is not UTF-8 text") from None
    except json.JSONDecodeError as e:
        if e.msg == "Extra data":  # several values: JSON lines in a .json file (as Hugging Face datasets write)
            return _json_lines(raw, path, 0, text_key)
        raise PlaitError(f"input {path} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except (ValueError, RecursionError) as e:
        raise PlaitError(f"input {path} cannot be read as JSON ({_decode_problem(e)})") from None
    records = data if isinstance(data, list) else [data]
    docs = []
    for index, record in enumerate(records):
        text = _text_of(record, text_key, f"{path} item {index}" if isinstance(data, list) else str(path))
        if text:
            docs.append(text)
    return docs
