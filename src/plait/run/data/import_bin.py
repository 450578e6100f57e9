"""Import a raw token array (nanoGPT's ``train.bin``: uint16 ids back to back, no header) as a plait token file.

The ids are copied as they are, in chunks (a file of any size), checked against ``vocab_size``;
the token file's dtype follows the vocabulary as ``prepare``'s does. No torch here.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from plait.errors import PlaitError
from plait.run.data.token_format import TokenWriter

DEFAULT_RAW_DTYPE = "uint16"  # what nanoGPT's prepare scripts write
RAW_DTYPES = ("uint16", "uint32")  # what --dtype accepts (little-endian, as numpy's tofile writes on x86/ARM)
CHUNK_TOKENS = 4 * 2**20  # ids read per chunk


def import_bin(path: str | os.PathLike, out: str | os.PathLike, dtype: str, vocab_size: int,
               name: str | None = None) -> dict:
    """Copy the raw ``dtype`` array at ``path`` into the token file ``out`` (written atomically).

    ``vocab_size``: the tokenizer's vocabulary (every id must be below it); ``name``: the tokenizer
    recorded in the header (default ``raw-<dtype>``). Returns a summary like ``prepare``'s.
    """
    path = Path(path)
    if dtype not in RAW_DTYPES:
        raise PlaitError(f"raw token dtype {dtype!r} is not supported; give one of {', '.join(RAW_DTYPES)}")
    if vocab_size < 1:
        raise PlaitError(f"vocab size must be at least 1, got {vocab_size}")
    if not path.is_file():
        raise PlaitError(f"raw token file {path} not found" if not path.exists() else f"{path} is not a file")
    raw = np.dtype(dtype).newbyteorder("<")
    size = path.stat().st_size
    if size % raw.itemsize:
        other = "uint16" if dtype == "uint32" else "uint32"
        raise PlaitError(f"{path} has {size} bytes, not a whole number of {dtype} ids ({raw.itemsize} bytes each); "
                         f"is it {other}?")
    if size < 2 * raw.itemsize:
        raise PlaitError(f"{path} holds {size // raw.itemsize} tokens; a training sample needs at least 2")
    done = 0
    try:
        with open(path, "rb") as f, TokenWriter(out, vocab_size, name or f"raw-{dtype}") as writer:
            while chunk := f.read(CHUNK_TOKENS * raw.itemsize):
                ids = np.frombuffer(chunk, dtype=raw)
                if int(ids.max()) >= vocab_size:
                    at = int(np.argmax(ids >= vocab_size))
                    raise PlaitError(f"{path}: token {done + at} is id {ids[at]}, not below vocab {vocab_size}; "
                                     "pass the tokenizer's vocabulary size (--vocab), or check --dtype")
                writer.append(ids)
                done += ids.size
    except OSError as e:
        raise PlaitError(f"cannot read {path}: {e.strerror or e}") from None
    return {"path": str(out), "source": str(path), "n_tokens": writer.n_tokens, "dtype": writer.dtype.name,
            "vocab_size": vocab_size, "tokenizer": writer.name, "checksum": f"{writer.crc:08x}"}
