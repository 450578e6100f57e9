"""The files of a Hugging Face model directory, read and written without torch.

A directory holds ``config.json`` and the weights: ``model.safetensors``, or shards
``model-0000k-of-0000n.safetensors`` listed by ``model.safetensors.index.json`` (its
``weight_map``: tensor name -> shard file). A safetensors file starts with the length of its
header (8 bytes, little-endian) and the header itself, JSON: each tensor's dtype, shape and byte
range. ``tensor_table`` reads only those headers, so the launcher checks a directory (and a
rank finds the file of each tensor it needs) without reading any weight.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from plait.errors import PlaitError
from plait.spec.serialize import read_json_file
from plait.spec.units import GIB, KIB, MIB

CONFIG = "config.json"
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
HEADER_LIMIT = 100 * 2**20  # bytes: a larger safetensors header is refused as corrupt (the format's own limit)
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
               "F8_E4M3": 1, "F8_E5M2": 1}


SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": KIB, "MIB": MIB, "GIB": GIB}
EXPORT_DTYPES = ("float32", "bfloat16", "float16")  # float32 first: plait's master weights, exactly


@dataclass(frozen=True)
class ExportOptions:
    """How ``plait export`` writes the weights (``plait.run.checkpoint.hf.export``)."""

    dtype: str = "float32"  # one of EXPORT_DTYPES
    max_shard_bytes: int = 5 * 10**9  # bytes per safetensors file at most (a larger tensor gets one of its own)
    tokenizer: str | None = None  # a tokenizer.json or a directory of tokenizer files to copy (default: the run's)


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor of a Hugging Face checkpoint lives: its file, shape (elements) and dtype name."""

    file: Path
    shape: tuple[int, ...]
    dtype: str  # safetensors dtype name: F32, BF16, F16...


def read_config(directory: str | Path) -> dict:
    """``DIRECTORY/config.json`` as a dict; PlaitError when missing or not a JSON object."""
    path = Path(directory) / CONFIG
    if not path.is_file():
        raise PlaitError(f"{directory} has no {CONFIG}: not a Hugging Face model directory")
    config = read_json_file(path, "Hugging Face config.json")
    if not isinstance(config, dict):
        raise PlaitError(f"{path} must hold a JSON object")
    return config


def read_header(path: Path) -> dict:
    """The JSON header of safetensors file ``path`` ({name: {dtype, shape, data_offsets}}, ``__metadata__``)."""
    try:
        with open(path, "rb") as handle:
            size_bytes = handle.read(8)
            if len(size_bytes) != 8:
                raise PlaitError(f"{path} is not a safetensors file (shorter than its header)")
            (size,) = struct.unpack("<Q", size_bytes)
            if size > HEADER_LIMIT:
                raise PlaitError(f"{path} is not a safetensors file (header of {size} bytes)")
            header = json.loads(handle.read(size))
    except OSError as exc:
        raise PlaitError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (ValueError, UnicodeDecodeError):
        raise PlaitError(f"{path} is not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise PlaitError(f"{path} is not a safetensors file (its header is not an object)")
    return header


DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
               "U16": 2, "U32": 4, "U64": 8, "F8_E4M3": 1, "F8_E5M2": 1}


def check_offsets(path: Path, header: dict) -> None:
    """Refuse a safetensors file whose header's byte ranges lie: a tensor's range must hold exactly
    its shape × dtype bytes and end inside the file (a truncated file fails here, naming it)."""
    try:
        with open(path, "rb") as handle:
            data_bytes = os.fstat(handle.fileno()).st_size - 8 - struct.unpack("<Q", handle.read(8))[0]
    except OSError as exc:
        raise PlaitError(f"cannot read {path}: {exc.strerror or exc}") from None
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = (int(n) for n in entry["data_offsets"])
            elements = math.prod(int(n) for n in entry["shape"])
        except (KeyError, TypeError, ValueError):
            raise PlaitError(f"{path}: the header entry of {name} is malformed") from None
        width = DTYPE_BYTES.get(str(entry.get("dtype")))
        if not 0 <= begin <= end or (width is not None and end - begin != elements * width):
            raise PlaitError(f"{path}: the header gives tensor {name} bytes {begin}..{end}, not the "
                             f"{elements:,} × {width} bytes of its shape (a corrupt file)")
        if end > data_bytes:
            raise PlaitError(f"{path}: tensor {name} ends at byte {end:,} but the file holds {max(0, data_bytes):,} "
                             "bytes of data (truncated?)")


def weight_files(directory: str | Path) -> list[Path]:
    """The safetensors files of a model directory: the shards its index lists, else ``model.safetensors``."""
    root = Path(directory)
    index = root / INDEX
    if index.is_file():
        data = read_json_file(index, "safetensors index")
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise PlaitError(f"{index} has no weight_map")
        files = sorted({str(name) for name in weight_map.values()})
        if any("/" in name or name in ("", ".", "..") for name in files):
            raise PlaitError(f"{index} names a file outside {root}")
        missing = [name for name in files if not (root / name).is_file()]
        if missing:
            raise PlaitError(f"{root} lacks {missing[0]}, a shard its {INDEX} lists")
        return [root / name for name in files]
    if (root / SINGLE).is_file():
        return [root / SINGLE]
    others = sorted(p.name for p in root.glob("*.bin")) if root.is_dir() else []
    hint = f" (it holds {others[0]}: PyTorch pickles are not read; save with safe_serialization)" if others else ""
    raise PlaitError(f"{root} has neither {SINGLE} nor {INDEX}{hint}")


def tensor_table(directory: str | Path) -> dict[str, TensorEntry]:
    """{tensor name: where it is} of every safetensors file of a model directory (headers only)."""
    table: dict[str, TensorEntry] = {}
    for file in weight_files(directory):
        header = read_header(file)
        check_offsets(file, header)
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            try:
                shape, dtype = tuple(int(n) for n in entry["shape"]), str(entry["dtype"])
            except (KeyError, TypeError, ValueError):
                raise PlaitError(f"{file}: the header entry of {name} is malformed") from None
            if name in table:
                raise PlaitError(f"{directory}: tensor {name} is in both {table[name].file.name} and {file.name}")
            table[name] = TensorEntry(file, shape, dtype)
    return table


def check_model_dir(directory: str | Path, flag: str = "--init-from") -> Path:
    """The absolute path of a Hugging Face model directory that has a config and readable weight headers."""
    path = Path(directory)
    if not path.is_dir():
        raise PlaitError(f"{flag} {directory}: no such directory (a local Hugging Face model directory: "
                         f"{CONFIG} + {SINGLE} or sharded safetensors)")
    read_config(path)
    if not tensor_table(path):
        raise PlaitError(f"{flag} {directory}: its safetensors files hold no tensor")
    return path.resolve()


def shard_groups(sizes: list[tuple[str, int]], max_bytes: int) -> list[list[str]]:
    """Tensor names (in the given order) cut into consecutive groups of at most ``max_bytes`` bytes each
    (a tensor larger than that gets a group of its own)."""
    groups: list[list[str]] = []
    used = 0
    for name, size in sizes:
        if not groups or (used + size > max_bytes and groups[-1]):
            groups.append([])
            used = 0
        groups[-1].append(name)
        used += size
    return groups


def shard_names(count: int) -> list[str]:
    """File names of ``count`` shards: ``model.safetensors`` alone, else ``model-0000k-of-0000n.safetensors``."""
    if count == 1:
        return [SINGLE]
    return [f"model-{k:05d}-of-{count:05d}.safetensors" for k in range(1, count + 1)]


def index_json(weight_map: dict[str, str], total_bytes: int, total_params: int) -> str:
    """The text of ``model.safetensors.index.json`` for sharded weights."""
    body = {"metadata": {"total_size": total_bytes, "total_parameters": total_params},
            "weight_map": dict(sorted(weight_map.items()))}
    return json.dumps(body, indent=2) + "\n"


def parse_size(text: str, flag: str = "--max-shard-size") -> int:
    """Bytes of a size such as ``5GB``, ``500MB``, ``2GiB`` or ``1000000`` (decimal and binary units)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
    unit = match.group(2).upper() if match else None
    if match is None or unit not in SIZE_UNITS:
        raise PlaitError(f"{flag} {text}: expected a size such as 5GB, 500MB or 2GiB")
    size = float(match.group(1)) * SIZE_UNITS[unit]
    if not 1 <= size <= MAX_SIZE_BYTES:  # inf from a 400-digit number; a zero size
        raise PlaitError(f"{flag} {text}: expected a size from 1 byte to 1 PB")
    return int(size)


MAX_SIZE_BYTES = 10**15  # a safetensors file larger than 1 PB is a typo
