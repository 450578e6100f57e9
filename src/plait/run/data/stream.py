"""A streamed source: local parquet / arrow / JSON-lines shards, tokenized on the fly (no torch).

The shards (sorted by path) are cut into units of work as ``plait data prepare`` cuts them
(``plait.run.data.documents``: a parquet row group, an arrow file, a part of a JSON-lines
file), and the units are tokenized in order with the run's tokenizer (``--data-tokenizer``,
the names ``prepare`` takes), each document followed by the tokenizer's end-of-text id, exactly
as ``prepare`` writes a token file. The stream is read as a token file is: sample ``j`` is the
window of ``seq_len + 1`` tokens at token ``w * seq_len`` of the stream, ``w = j % n``, where
``n = (stream tokens - 1) // seq_len`` windows fit one pass; in order (no shuffle), pass after
pass (epochs; the tail of a pass shorter than a window is dropped). A sample is therefore a pure
function of ``j`` and the shards, as for a token file: a resumed run, on any layout, reads the
same tokens.

A background thread tokenizes the next ``READ_AHEAD`` units while the current one is read (in
unit order, so it changes nothing). Where each unit starts in the stream is learned as it is read;
``bookmark(j)`` names the last unit known to start at or before sample ``j``, and a checkpoint
records it (``plait.run.data.mixture``), so a resumed run starts tokenizing there instead of at
the first shard (``restore``). Every rank reads the stream itself (and skips what others train on).
"""

from __future__ import annotations

import bisect
import threading
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from plait.errors import PlaitError
from plait.run.data.documents import plan_units
from plait.run.data.prepare import encode_unit
from plait.run.data.token_format import header_name, token_dtype
from plait.run.data.tokenizer import get_tokenizer

READ_AHEAD = 2  # units tokenized ahead of the one being read


class StreamSource:
    """Shards ``files`` (in this order) as one token stream, tokenized by ``tokenizer`` (see module doc)."""

    def __init__(self, files: list[Path], tokenizer: str = "bytes", text_key: str = "text",
                 where: str = "") -> None:
        self.files = list(files)
        self.where = where or str(files[0].parent)
        self.text_key = text_key
        self.units = plan_units(self.files, text_key)  # opens the parquet files: a missing column fails now
        self.tok = get_tokenizer(tokenizer)
        self.eos_id = self.tok.eot_id
        if self.eos_id is None:
            raise PlaitError(f"--data-tokenizer {tokenizer}: it names no end-of-text token to put after every "
                             "document; use a tokenizer that has one")
        self.vocab_size = max(self.tok.vocab_size, self.eos_id + 1)
        self.dtype = token_dtype(self.vocab_size)
        self.tokenizer = header_name(self.tok.name)  # as a token file's header names it
        self._lock = threading.Lock()
        self._starts: dict[int, int] = {0: 0}  # unit -> stream token where it starts (the same every pass)
        self._known = [0]  # the units of _starts, sorted (their starts grow with them)
        self.encoded: set[int] = set()  # units tokenized so far (the read-ahead thread's too)
        self._pass_tokens: int | None = None  # tokens of one pass, once a pass has been read to its end
        self._unit = 0  # the next unit to read
        self._buf = np.empty(0, dtype=np.int64)  # tokens from stream token _buf_start to the end of unit _unit - 1
        self._buf_start = 0
        self._pool: ThreadPoolExecutor | None = None
        self._ahead: dict[int, Future] = {}

    @property
    def fingerprint(self) -> str:
        """Shard names and sizes (no read): CRC-32 of "name:bytes;..." and the totals."""
        listing = ";".join(f"{p.name}:{p.stat().st_size}" for p in self.files)
        total = sum(p.stat().st_size for p in self.files)
        return f"shards={len(self.files)},bytes={total},crc32={zlib.crc32(listing.encode()):08x}"

    @property
    def description(self) -> str:
        return (f"stream of {len(self.files)} shard(s) under {self.where} ({len(self.units)} units, column "
                f"{self.text_key!r}, tokenizer {self.tok.name})")

    def _encode(self, unit: int) -> np.ndarray:
        self.encoded.add(unit)
        return encode_unit(self.tok, self.units[unit], self.text_key, self.eos_id, self.dtype.str).tokens

    def _tokens_of(self, unit: int) -> np.ndarray:
        """Unit ``unit``'s tokens (from the read-ahead thread when it made them); queues the next units."""
        future = self._ahead.pop(unit, None)
        for stale in [u for u in self._ahead if not unit < u <= unit + READ_AHEAD]:
            self._ahead.pop(stale).cancel()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="plait-tokenize")
        for ahead in range(unit + 1, min(unit + 1 + READ_AHEAD, len(self.units))):
            if ahead not in self._ahead:
                self._ahead[ahead] = self._pool.submit(self._encode, ahead)
        return np.asarray(future.result() if future is not None else self._encode(unit), dtype=np.int64)

    def _learn(self, unit: int, start: int) -> None:
        if unit not in self._starts:
            self._starts[unit] = start
            bisect.insort(self._known, unit)

    def _unit_at(self, token: int) -> int:
        """The last known unit starting at or before stream token ``token``."""
        starts = [self._starts[u] for u in self._known]  # sorted, as the units are
        return self._known[bisect.bisect_right(starts, token) - 1]

    def _seek(self, token: int) -> None:
        """Make the reader's buffer start at or before stream token ``token``: read on from where it is,
        unless it is past ``token`` or a known unit start lies between it and ``token`` (a bookmark)."""
        unit = self._unit_at(token)
        if self._buf_start <= token and unit <= self._unit:
            return
        self._unit, self._buf_start, self._buf = unit, self._starts[unit], np.empty(0, dtype=np.int64)

    def _window(self, w: int, seq_len: int) -> np.ndarray | None:
        """Stream tokens [w·seq_len, w·seq_len + seq_len + 1), or None when the pass ends before them."""
        a, b = w * seq_len, w * seq_len + seq_len + 1
        if self._pass_tokens is not None and b > self._pass_tokens:
            return None
        self._seek(a)
        while self._buf_start + len(self._buf) < b:
            if self._unit >= len(self.units):
                self._pass_tokens = self._buf_start + len(self._buf)
                return None
            tokens = self._tokens_of(self._unit)
            keep = min(max(0, a - self._buf_start), len(self._buf))  # drop what no later window needs
            self._buf = np.concatenate([self._buf[keep:], tokens])
            self._buf_start += keep
            self._unit += 1
            self._learn(self._unit, self._buf_start + len(self._buf))
        return self._buf[a - self._buf_start : b - self._buf_start]

    def _windows_per_pass(self, seq_len: int) -> int | None:
        if self._pass_tokens is None:
            return None
        n = (self._pass_tokens - 1) // seq_len
        if n < 1:
            raise PlaitError(f"--data {self.where}: the stream holds {self._pass_tokens} tokens but one sequence of "
                             f"seq_len {seq_len} needs {seq_len + 1}; use a shorter --seq-len or more text")
        return n

    def _sample(self, j: int, seq_len: int) -> np.ndarray:
        n = self._windows_per_pass(seq_len)
        row = self._window(j if n is None else j % n, seq_len)
        if row is None:  # the first pass ended: now n is known
            row = self._window(j % self._windows_per_pass(seq_len), seq_len)
        return row

    def rows(self, samples, seq_len: int) -> np.ndarray:
        """int64 array (len(samples), seq_len + 1): the stream's samples ``samples`` (see module doc)."""
        out = np.empty((len(samples), seq_len + 1), dtype=np.int64)
        with self._lock:
            for row, j in enumerate(samples):
                out[row] = self._sample(int(j), seq_len)
        return out

    def bookmark(self, j: int, seq_len: int) -> dict:
        """Where a reader of sample ``j`` may start: the last unit known to start at or before it."""
        with self._lock:
            n = self._windows_per_pass(seq_len)
            unit = self._unit_at((j if n is None else j % n) * seq_len)
            return {"unit": unit, "token": self._starts[unit], "pass_tokens": self._pass_tokens,
                    "units": len(self.units)}

    def restore(self, mark: dict | None) -> None:
        """Take a checkpoint's ``bookmark`` (ignored when it does not fit these shards' units)."""
        if not isinstance(mark, dict) or mark.get("units") != len(self.units):
            return
        unit, token = mark.get("unit"), mark.get("token")
        if isinstance(unit, int) and isinstance(token, int) and 0 <= unit <= len(self.units) and token >= 0:
            with self._lock:
                self._learn(unit, token)
                if isinstance(mark.get("pass_tokens"), int):
                    self._pass_tokens = mark["pass_tokens"]

    def close(self) -> None:
        """Stop the read-ahead thread."""
        for future in self._ahead.values():
            future.cancel()
        self._ahead.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
