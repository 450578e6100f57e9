"""Training data for ``plait train``: deterministic synthetic tokens, or a prepared token file.

No torch here (numpy only); the runtime converts the rows it gets.

**Sampling contract** (both sources, interchangeable): ``batch(step, positions, seq_len,
global_batch)`` returns one row of ``seq_len + 1`` tokens per requested position of the global
batch; inputs are ``row[:-1]`` and labels ``row[1:]``. A row is a pure function of
(seed, step, position, seq_len, global_batch) and of the data itself - not of dp/tp/pp, nor of
which rank asks, nor of which other positions are requested with it. So a run resumed on
another layout reads exactly the samples it would have read.

For a token file, the stream of ``n_tokens`` is cut into ``n_samples = (n_tokens - 1) // seq_len``
non-overlapping windows of ``seq_len + 1`` tokens (window ``i`` starts at token ``i * seq_len``;
neighbouring windows share one token, the label of the last input). Global sample
``g = step * global_batch + position`` reads window ``perm_e[g % n_samples]`` of epoch
``e = g // n_samples``, where ``perm_e`` is a permutation depending only on (seed, e): every
window is read exactly once per epoch.

**Token file format** (version 1, all integers little-endian), a 64-byte header then the tokens::

    offset size  field
         0    8  magic b"PLAITTOK"
         8    4  format version (uint32) = 1
        12    4  bytes per token (uint32): 2 (uint16, vocab <= 65536) or 4 (uint32)
        16    8  vocab_size (uint64): token ids are < vocab_size
        24    8  n_tokens (uint64)
        32    4  CRC-32 (zlib.crc32) of the token bytes (uint32)
        36    4  end-of-text id + 1 (uint32): the id after every document; 0: not recorded
                 (files of plait before it recorded one, raw imports)
        40   24  tokenizer name, ASCII, NUL-padded
        64       n_tokens * bytes-per-token bytes of tokens, nothing after them

The writer is ``plait.run.data.token_format.TokenWriter``; ``prepare`` (``plait.run.data.prepare``)
tokenizes documents into it, ``import_bin`` (``plait.run.data.import_bin``) copies raw token arrays.

Opening checks the header and the file size; it also recomputes the checksum when the token
data is smaller than ``VERIFY_ON_OPEN_BYTES`` (256 MiB) and skips that full read above it
(call ``verify()`` to force it).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from plait.errors import PlaitError
from plait.run.data.prepare import prepare
from plait.run.data.synthetic import synthetic_rows
from plait.run.data.token_format import HEADER, HEADER_SIZE, MAGIC, VERSION

__all__ = ["HEADER", "HEADER_SIZE", "MAGIC", "VERSION", "SyntheticTokens", "TokenFile", "open_tokens", "prepare",
           "sample_corpus_path"]  # the format names and prepare are re-exported from their own modules

VERIFY_ON_OPEN_BYTES = 256 * 2**20  # token data below this size (bytes) is checksummed on open
CHUNK_BYTES = 16 * 2**20  # read size (bytes) for checksums and scans; a multiple of 4
PREPARE_HINT = "make one with `plait data prepare`"
DOC_SAMPLE_TOKENS = 2**24  # tokens read to measure the mean document length (--doc-mask's planner input)


def _check_request(step: int, positions: Sequence[int], seq_len: int, global_batch: int | None) -> None:
    if seq_len < 1:
        raise PlaitError(f"seq_len must be at least 1 token, got {seq_len}")
    if step < 0:
        raise PlaitError(f"step must be >= 0, got {step}")
    for p in positions:
        if p < 0 or (global_batch is not None and p >= global_batch):
            limit = f" and < global_batch={global_batch}" if global_batch is not None else ""
            raise PlaitError(f"batch position {p} must be >= 0{limit}")


class SyntheticTokens:
    """Uniformly random token ids; row (step, position) is seeded by (seed, step, position) only."""

    def __init__(self, vocab_size: int, seed: int = 0) -> None:
        if vocab_size < 1:
            raise PlaitError(f"synthetic data needs a vocab of at least 1 token, got {vocab_size}")
        if seed < 0:
            raise PlaitError(f"data seed must be >= 0, got {seed}")
        self.vocab_size = vocab_size
        self.seed = seed

    @property
    def description(self) -> str:
        return f"synthetic tokens (vocab {self.vocab_size}, seed {self.seed})"

    def batch(self, step: int, positions: Sequence[int], seq_len: int, global_batch: int | None = None) -> np.ndarray:
        """int64 array (len(positions), seq_len + 1) of token ids; ``global_batch`` is unused."""
        _check_request(step, positions, seq_len, None)
        # row p: np.random.default_rng([seed, step, p]).integers(0, vocab, seq_len + 1), set up faster
        return synthetic_rows(self.seed, step, positions, seq_len + 1, self.vocab_size)


class TokenFile:
    """A token file written by ``prepare``, opened read-only as a memmap (see the module doc)."""

    def __init__(self, path: str | os.PathLike, seed: int = 0, seq_len: int | None = None,
                 stream: int | None = None) -> None:
        self.path = Path(path)
        self.seed = seed
        self.stream = stream  # a mixture's source index > 0: its permutations are seeded (seed, epoch, stream)
        self._perms: dict[tuple[int, int], np.ndarray] = {}  # (seq_len, epoch) -> permutation
        if seed < 0:
            raise PlaitError(f"data seed must be >= 0, got {seed}")
        header = self._read_header()
        _, _, itemsize, vocab, n_tokens, crc, eos_field, name = header
        self.dtype = np.dtype("<u2" if itemsize == 2 else "<u4")
        self.vocab_size = vocab
        self.n_tokens = n_tokens
        self.checksum = crc
        self.tokenizer = name
        self.eos_id = eos_field - 1 if eos_field else None  # end of every document (None: not recorded)
        if n_tokens * itemsize < VERIFY_ON_OPEN_BYTES:
            self.verify()
        try:
            self.tokens = np.memmap(self.path, dtype=self.dtype, mode="r", offset=HEADER_SIZE, shape=(n_tokens,))
        except (OSError, ValueError) as e:
            raise PlaitError(f"token file {self.path}: cannot map it ({e})") from None
        if seq_len is not None:
            self.n_samples(seq_len)

    def _fail(self, what: str) -> PlaitError:
        return PlaitError(f"token file {self.path}: {what}")

    def _read_header(self) -> tuple:
        try:
            exists, is_dir = self.path.exists(), self.path.is_dir()
        except OSError as e:  # a name too long for the filesystem, a loop of links...
            raise PlaitError(f"token file {str(self.path)[:200]}: cannot read it ({e.strerror or e})") from None
        if not exists:
            raise PlaitError(f"token file {self.path} not found; {PREPARE_HINT}")
        if is_dir:
            raise PlaitError(f"token file {self.path} is a directory, not a token file; {PREPARE_HINT}")
        try:
            size = self.path.stat().st_size
            with open(self.path, "rb") as f:
                raw = f.read(HEADER_SIZE)
        except OSError as e:
            raise self._fail(f"cannot read it ({e.strerror or e})") from None
        if not raw:
            raise self._fail(f"the file is empty, not a plait token file; {PREPARE_HINT}")
        if raw[: len(MAGIC)] != MAGIC[: len(raw)]:
            raise self._fail(f"not a plait token file (bad magic bytes); {PREPARE_HINT}")
        if len(raw) < HEADER_SIZE:
            raise self._fail(f"truncated: {size} bytes, shorter than the {HEADER_SIZE}-byte header")
        fields = HEADER.unpack(raw)
        _, version, itemsize, vocab, n_tokens, _, _, name = fields
        if version != VERSION:
            raise self._fail(f"format version {version} is not supported (this plait reads version {VERSION})")
        if itemsize not in (2, 4):
            raise self._fail(f"corrupt header: {itemsize} bytes per token (expected 2 or 4)")
        if not 1 <= vocab <= 256**itemsize:
            raise self._fail(f"corrupt header: vocab {vocab} does not fit {itemsize}-byte tokens")
        try:
            name = name.rstrip(b"\0").decode("ascii")
        except UnicodeDecodeError:
            raise self._fail("corrupt header: tokenizer name is not ASCII") from None
        expected = HEADER_SIZE + n_tokens * itemsize
        if size < expected:
            missing = (expected - size) / itemsize
            raise self._fail(f"truncated: {size} bytes but the header promises {n_tokens} tokens "
                             f"({expected} bytes); {missing:g} tokens missing")
        if size > expected:
            raise self._fail(f"{size - expected} extra bytes after the {n_tokens} tokens the header promises "
                             f"({expected} bytes expected)")
        if n_tokens < 2:
            raise self._fail(f"holds {n_tokens} tokens; a training sample needs at least 2")
        return (*fields[:7], name)

    def verify(self) -> None:
        """Recompute the CRC-32 of all token bytes (a full read) and check every id < vocab_size."""
        crc, top = 0, 0
        try:
            with open(self.path, "rb") as f:
                f.seek(HEADER_SIZE)
                while chunk := f.read(CHUNK_BYTES):
                    crc = zlib.crc32(chunk, crc)
                    if len(chunk) % self.dtype.itemsize == 0:
                        top = max(top, int(np.frombuffer(chunk, dtype=self.dtype).max()))
        except OSError as e:
            raise self._fail(f"cannot read it ({e.strerror or e})") from None
        if crc != self.checksum:
            raise self._fail(f"checksum mismatch (stored {self.checksum:08x}, data {crc:08x}): "
                             "the token data is corrupt; prepare it again")
        if top >= self.vocab_size:
            raise self._fail(f"corrupt: token id {top} is not below vocab {self.vocab_size}")

    @property
    def fingerprint(self) -> str:
        """What identifies the tokens (from the header, no full read): CRC-32, token count, file size."""
        return f"crc32={self.checksum:08x},tokens={self.n_tokens},bytes={self.path.stat().st_size}"

    @property
    def description(self) -> str:
        return (f"token file {self.path} ({self.n_tokens:,} tokens, {self.dtype.name}, "
                f"vocab {self.vocab_size}, tokenizer {self.tokenizer}, seed {self.seed})")

    def n_samples(self, seq_len: int) -> int:
        """Windows of seq_len + 1 tokens per epoch; PlaitError if not even one fits."""
        if seq_len < 1:
            raise PlaitError(f"seq_len must be at least 1 token, got {seq_len}")
        if self.n_tokens < seq_len + 1:
            raise self._fail(f"has {self.n_tokens} tokens but one sequence of seq_len {seq_len} "
                             f"needs {seq_len + 1}; use a shorter --seq-len or more text")
        return (self.n_tokens - 1) // seq_len

    def mean_document_length(self, sample_tokens: int = DOC_SAMPLE_TOKENS) -> int | None:
        """Mean tokens per document (its end-of-text id included) over the file's first
        ``sample_tokens`` tokens, rounded; None when the file records no end-of-text id."""
        if self.eos_id is None:
            return None
        head = np.asarray(self.tokens[:sample_tokens])
        return max(1, round(head.size / max(1, int(np.count_nonzero(head == self.eos_id)))))

    def permutation(self, seq_len: int, epoch: int) -> np.ndarray:
        """Window order of one epoch: a permutation of range(n_samples) seeded by (seed, epoch)."""
        key = (seq_len, epoch)
        if key not in self._perms:
            if len(self._perms) >= 2:  # keep the current and the next epoch
                self._perms.pop(next(iter(self._perms)))
            rng = np.random.default_rng([self.seed, epoch] + ([self.stream] if self.stream else []))
            self._perms[key] = rng.permutation(self.n_samples(seq_len))
        return self._perms[key]

    def batch(self, step: int, positions: Sequence[int], seq_len: int, global_batch: int) -> np.ndarray:
        """int64 array (len(positions), seq_len + 1): global sample step*global_batch + position each."""
        if global_batch < 1:
            raise PlaitError(f"global_batch must be at least 1 sample, got {global_batch}")
        _check_request(step, positions, seq_len, global_batch)
        return self.rows([step * global_batch + int(p) for p in positions], seq_len)

    def rows(self, samples: Sequence[int], seq_len: int) -> np.ndarray:
        """int64 array (len(samples), seq_len + 1): sample ``g`` is window ``perm_e[g % n]`` of epoch
        ``e = g // n`` (the module doc); a mixture asks for its source's own sample indices."""
        n = self.n_samples(seq_len)
        out = np.empty((len(samples), seq_len + 1), dtype=np.int64)
        for row, g in enumerate(samples):
            g = int(g)
            start = int(self.permutation(seq_len, g // n)[g % n]) * seq_len
            out[row] = self.tokens[start : start + seq_len + 1]
        return out


def open_tokens(data: str | os.PathLike, vocab_size: int, seed: int = 0, seq_len: int | None = None,
                model_name: str = "the model") -> SyntheticTokens | TokenFile:
    """``"synthetic"`` -> SyntheticTokens over the model's vocab; anything else is a token file path
    (write ``./synthetic`` for a file of that name),
    checked against the model's ``vocab_size`` (and against ``seq_len`` when given)."""
    if str(data) == "synthetic":
        return SyntheticTokens(vocab_size, seed)
    tokens = TokenFile(data, seed=seed, seq_len=seq_len)
    if tokens.vocab_size > vocab_size:
        raise PlaitError(f"token file {tokens.path} has vocab {tokens.vocab_size} (tokenizer {tokens.tokenizer}) "
                         f"but model {model_name} has vocab {vocab_size}; use a model whose vocab is at least "
                         f"{tokens.vocab_size}")
    return tokens


def sample_corpus_path() -> Path:
    """The directory of the small English corpus shipped with plait (a few *.txt files)."""
    return Path(__file__).resolve().parents[2] / "data" / "sample_corpus"
