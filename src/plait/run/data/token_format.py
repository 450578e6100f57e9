"""The token file format (version 1) and its writer; the layout is described in ``plait.run.data.tokens``.

No torch here (numpy only). ``TokenWriter`` writes one token file atomically (``plait.atomic``): a
header placeholder, the token chunks in order (CRC-32 kept as they pass), then the real header.
"""

from __future__ import annotations

import os
import re
import struct
import zlib
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from plait.atomic import atomic_output
from plait.errors import PlaitError

MAGIC = b"PLAITTOK"
VERSION = 1
HEADER = struct.Struct("<8sIIQQII24s")  # see the docstring of plait.run.data.tokens
HEADER_SIZE = HEADER.size  # 64 bytes
NAME_BYTES = 24  # room for the tokenizer's name in the header (ASCII, NUL-padded)


def token_dtype(vocab_size: int) -> np.dtype:
    """Little-endian uint16 when every id < ``vocab_size`` fits 2 bytes (vocab <= 65536), else uint32."""
    if not 1 <= vocab_size <= 2**32:
        raise PlaitError(f"vocab size {vocab_size} does not fit a token file (1 to 2**32 ids)")
    return np.dtype("<u2" if vocab_size <= 2**16 else "<u4")


def header_name(name: str) -> str:
    """``name`` as the header stores it: printable ASCII (others become ``_``), at most 24 bytes
    (a longer name keeps its end, where a path's distinctive part is)."""
    ascii_name = re.sub(r"[^\x20-\x7e]", "_", name)
    return ascii_name if len(ascii_name) <= NAME_BYTES else ascii_name[-NAME_BYTES:]


def eos_field(eos_id: int | None) -> int:
    """The header's end-of-text field for ``eos_id``: eos_id + 1, or 0 when the file records none."""
    if eos_id is None:
        return 0
    if not 0 <= eos_id < 2**32 - 1:
        raise PlaitError(f"end-of-text id {eos_id} does not fit the token file header (0..2**32-2)")
    return eos_id + 1


def _write_chunk(f, array: np.ndarray) -> None:
    """Append one array's bytes to the open file (a hook the tests use to simulate a failed write)."""
    f.write(array.tobytes())


class TokenWriter:
    """``with TokenWriter(path, vocab_size, name) as w: w.append(ids)`` - the file lands at ``path``
    on a clean exit only (an older file there stays untouched otherwise; no temporary file is left).

    ``eos_id``: the end-of-text id ``prepare`` puts after every document, recorded in the header
    (``plait train --doc-mask`` cuts sequences into documents at it). ``append`` takes any integer array; ids must be < ``vocab_size`` (checked per chunk). The parent
    directory is created. OSError becomes a PlaitError naming the file.
    """

    def __init__(self, path: str | os.PathLike, vocab_size: int, name: str, eos_id: int | None = None) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            raise PlaitError(f"output {self.path} is a directory; give a file name such as {self.path / 'tokens.tok'}")
        self.vocab_size = vocab_size
        self.eos_id = eos_id  # the end-of-text id after every document; the header keeps eos_id + 1 (0: none)
        self.dtype = token_dtype(vocab_size)
        self.name = header_name(name)
        self.n_tokens = 0
        self.crc = 0
        self._stack = ExitStack()
        self._file = None

    def __enter__(self) -> TokenWriter:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self._stack.enter_context(atomic_output(self.path, "wb"))
            self._file.write(b"\0" * HEADER_SIZE)  # placeholder until the counts are known
        except OSError as e:
            self._stack.close()
            raise PlaitError(f"cannot write token file {self.path}: {e.strerror or e}") from None
        return self

    def append(self, ids: np.ndarray) -> None:
        """Write ``ids`` (in order, after what came before)."""
        ids = np.asarray(ids)
        if ids.size == 0:
            return
        low, top = int(ids.min()), int(ids.max())
        if low < 0 or top >= self.vocab_size:
            raise PlaitError(f"token id {low if low < 0 else top} is outside the vocabulary 0..{self.vocab_size - 1} "
                             f"of {self.path}")
        ids = ids.astype(self.dtype, copy=False)
        try:
            _write_chunk(self._file, ids)
        except OSError as e:
            raise PlaitError(f"cannot write token file {self.path}: {e.strerror or e}") from None
        self.crc = zlib.crc32(ids, self.crc)
        self.n_tokens += ids.size

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            try:
                if self.n_tokens < 2:
                    raise PlaitError(f"{self.path} would hold {self.n_tokens} tokens; a training sample needs at "
                                     "least 2")
                self._file.seek(0)
                self._file.write(HEADER.pack(MAGIC, VERSION, self.dtype.itemsize, self.vocab_size, self.n_tokens,
                                             self.crc, eos_field(self.eos_id), self.name.encode("ascii")))
            except BaseException as failure:  # the header could not be written: drop the file
                self._stack.__exit__(type(failure), failure, failure.__traceback__)
                if isinstance(failure, OSError):
                    raise PlaitError(f"cannot write token file {self.path}: {failure.strerror or failure}") from None
                raise
        try:
            return bool(self._stack.__exit__(exc_type, exc, tb))
        except OSError as e:
            raise PlaitError(f"cannot write token file {self.path}: {e.strerror or e}") from None
