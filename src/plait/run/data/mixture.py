"""A weighted mixture of data sources behind the token sources' ``batch`` (no torch).

``--data "0.3:web.tok,0.7:books/"`` (``plait.run.data.mixture_spec``) opens one source per entry:
a token file (``TokenFile``), a directory or glob of token files (``TokenShards``: their windows
as one source), or parquet/arrow/JSON-lines shards (``plait.run.data.stream.StreamSource``). Global
sample ``g = step * global_batch + position`` reads sample ``j`` of source ``s``, where
``(s, j) = Schedule.locate(g)`` (``plait.run.data.schedule``: exact proportions, a pure function of
``g`` and the weights); a source wraps around (a new epoch, reshuffled for token files) when
``j`` passes its end. Token-file sources keep the run's seed: source 0's windows are permuted as a
lone token file's are (seeded (seed, epoch)), source ``i > 0``'s with (seed, epoch, i). So a
mixture's samples depend on (seed, g, the sources) only - a run resumed on another layout reads
the same ones - and a one-source mixture reads what that token file alone reads.

Tokens consumed per source after ``k`` steps are ``counts(k * global_batch)[s] * seq_len`` (the
inputs of each sample, as ``tokens_per_step`` counts them): a pure function of the step, so a
resumed run's counts continue the saved run's. ``state`` (what a checkpoint records) holds them
and each streamed source's bookmark; ``restore`` gives the bookmarks back to the streams.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from plait.errors import PlaitError
from plait.run.data.mixture_spec import (STREAM_SUFFIXES, SYNTAX, expand, is_glob, parse_data,
                                         source_names)
from plait.run.data.schedule import Schedule
from plait.run.data.token_format import MAGIC
from plait.run.data.tokens import PREPARE_HINT, TokenFile, _check_request


class TokenShards:
    """Several token files as one source: their windows back to back (none crosses a file), permuted
    per epoch with (seed, epoch[, stream]) as a token file's are."""

    def __init__(self, files: list[Path], seed: int, stream: int | None, where: str) -> None:
        self.files = [TokenFile(f, seed=seed) for f in files]
        self.seed, self.stream, self.where = seed, stream, where
        self._perms: dict[tuple[int, int], np.ndarray] = {}
        first = self.files[0]
        for other in self.files[1:]:
            if (other.tokenizer, other.eos_id) != (first.tokenizer, first.eos_id):
                raise PlaitError(f"--data {where}: {other.path.name} was prepared with tokenizer {other.tokenizer} "
                                 f"(end-of-text {other.eos_id}), {first.path.name} with {first.tokenizer} "
                                 f"({first.eos_id}); one source needs one tokenizer")
        self.vocab_size = max(f.vocab_size for f in self.files)
        self.tokenizer, self.eos_id = first.tokenizer, first.eos_id
        self.n_tokens = sum(f.n_tokens for f in self.files)

    @property
    def fingerprint(self) -> str:
        return ";".join(f"{f.path.name}:{f.fingerprint}" for f in self.files)

    @property
    def description(self) -> str:
        return f"{len(self.files)} token files under {self.where} ({self.n_tokens:,} tokens)"

    def mean_document_length(self) -> int | None:
        return self.files[0].mean_document_length()

    def _bounds(self, seq_len: int) -> np.ndarray:
        return np.cumsum([0] + [(f.n_tokens - 1) // seq_len for f in self.files])

    def rows(self, samples, seq_len: int) -> np.ndarray:
        bounds = self._bounds(seq_len)
        n = int(bounds[-1])
        if n < 1:
            raise PlaitError(f"--data {self.where}: no token file holds one sequence of seq_len {seq_len} "
                             f"({seq_len + 1} tokens); use a shorter --seq-len")
        out = np.empty((len(samples), seq_len + 1), dtype=np.int64)
        for row, g in enumerate(samples):
            epoch = int(g) // n
            key = (seq_len, epoch)
            if key not in self._perms:
                if len(self._perms) >= 2:
                    self._perms.pop(next(iter(self._perms)))
                rng = np.random.default_rng([self.seed, epoch] + ([self.stream] if self.stream else []))
                self._perms[key] = rng.permutation(n)
            window = int(self._perms[key][int(g) % n])
            shard = int(np.searchsorted(bounds, window, side="right")) - 1
            start = (window - int(bounds[shard])) * seq_len
            out[row] = self.files[shard].tokens[start : start + seq_len + 1]
        return out


def _is_token_file(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def open_source(path: str, index: int, seed: int, tokenizer: str, text_key: str):
    """The source ``path`` names (see the module doc); ``index``: its place in the mixture."""
    from plait.run.data.stream import StreamSource

    stream = index or None
    if is_glob(path):
        files = expand(path)
    elif Path(path).is_dir():
        files = sorted(p for p in Path(path).rglob("*") if p.is_file() and not p.name.startswith("."))
        shards = [p for p in files if p.suffix.lower() in STREAM_SUFFIXES]
        files = shards or [p for p in files if _is_token_file(p)]
        if not files:
            raise PlaitError(f"--data {path}: the directory holds no token files ({PREPARE_HINT}) and no "
                             f"{', '.join('*' + s for s in STREAM_SUFFIXES)} shards")
    elif Path(path).is_file() and path.lower().endswith(STREAM_SUFFIXES):
        files = [Path(path)]
    elif not Path(path).exists():
        raise PlaitError(f"--data: source {path} not found (a token file, a directory or a glob of shards)")
    else:
        return TokenFile(path, seed=seed, stream=stream)
    streamed = [p.suffix.lower() in STREAM_SUFFIXES for p in files]
    if all(streamed):
        return StreamSource(files, tokenizer=tokenizer, text_key=text_key, where=path)
    if any(streamed):
        raise PlaitError(f"--data {path} mixes token files and shards to stream; give them as two sources")
    return TokenShards(files, seed, stream, path)


class MixtureSource:
    """The sources of ``--data`` sampled by their weights (see the module doc)."""

    def __init__(self, spec: str, seed: int = 0, tokenizer: str = "bytes", text_key: str = "text") -> None:
        self.spec = spec
        entries = parse_data(spec)
        self.names = source_names(entries)
        self.schedule = Schedule([e.fraction for e in entries])
        self.sources = []
        try:
            for index, entry in enumerate(entries):
                self.sources.append(open_source(entry.path, index, seed, tokenizer, text_key))
        except BaseException:
            self.close()
            raise
        self.seed = seed
        first = self.sources[0]
        for name, source in zip(self.names[1:], self.sources[1:]):
            if (source.tokenizer, source.eos_id) != (first.tokenizer, first.eos_id):
                self.close()
                raise PlaitError(f"--data: source {name} has tokenizer {source.tokenizer} (end-of-text "
                                 f"{source.eos_id}, vocab {source.vocab_size}) but {self.names[0]} has "
                                 f"{first.tokenizer} ({first.eos_id}, vocab {first.vocab_size}); a mixture "
                                 "needs one vocabulary: prepare the sources with the same tokenizer")
        self.vocab_size = max(s.vocab_size for s in self.sources)
        self.tokenizer, self.eos_id = first.tokenizer, first.eos_id

    @property
    def fingerprint(self) -> str:
        return "|".join(f"{name}={s.fingerprint}" for name, s in zip(self.names, self.sources))

    @property
    def description(self) -> str:
        return "mixture of " + ", ".join(f"{float(w):.4g} {name} ({s.description})" for w, name, s in
                                         zip(self.schedule.weights, self.names, self.sources))

    def mean_document_length(self) -> int | None:
        method = getattr(self.sources[0], "mean_document_length", None)
        return method() if method else None

    def batch(self, step: int, positions, seq_len: int, global_batch: int) -> np.ndarray:
        """int64 array (len(positions), seq_len + 1): global sample step*global_batch + position each."""
        if global_batch < 1:
            raise PlaitError(f"global_batch must be at least 1 sample, got {global_batch}")
        _check_request(step, positions, seq_len, global_batch)
        g = np.asarray([step * global_batch + int(p) for p in positions], dtype=np.int64)
        which, local = self.schedule.locate(g)
        out = np.empty((len(g), seq_len + 1), dtype=np.int64)
        for s, source in enumerate(self.sources):
            rows = np.flatnonzero(which == s)
            if rows.size:
                out[rows] = source.rows(local[rows].tolist(), seq_len)
        return out

    def tokens_consumed(self, steps_done: int, global_batch: int, seq_len: int) -> dict[str, int]:
        """Input tokens each source gave to the first ``steps_done`` steps, by source name."""
        counts = self.schedule.counts(steps_done * global_batch)
        return {name: c * seq_len for name, c in zip(self.names, counts)}

    def state(self, steps_done: int, global_batch: int, seq_len: int) -> dict:
        """What a checkpoint after ``steps_done`` steps records: per-source tokens and stream bookmarks."""
        counts = self.schedule.counts(steps_done * global_batch)
        marks = {name: source.bookmark(c, seq_len) for name, source, c in zip(self.names, self.sources, counts)
                 if hasattr(source, "bookmark")}
        return {"tokens": self.tokens_consumed(steps_done, global_batch, seq_len), "streams": marks}

    def restore(self, state: dict | None) -> None:
        """Give a checkpoint's stream bookmarks (``state``) back to the streamed sources."""
        marks = (state or {}).get("streams") or {}
        for name, source in zip(self.names, self.sources):
            if hasattr(source, "restore"):
                source.restore(marks.get(name))

    def close(self) -> None:
        for source in self.sources:
            if hasattr(source, "close"):
                source.close()


def open_mixture(spec: str, vocab_size: int, seed: int = 0, seq_len: int | None = None, model_name: str = "the model",
                 tokenizer: str = "bytes", text_key: str = "text") -> MixtureSource:
    """``MixtureSource(spec)`` checked against the model's vocab (and ``seq_len``: the token files hold one sequence)."""
    mixture = MixtureSource(spec, seed, tokenizer, text_key)
    if mixture.vocab_size > vocab_size:
        mixture.close()
        raise PlaitError(f"--data has vocab {mixture.vocab_size} (tokenizer {mixture.tokenizer}) but model "
                         f"{model_name} has vocab {vocab_size}; use a model whose vocab is at least "
                         f"{mixture.vocab_size}")
    try:
        for source in mixture.sources if seq_len is not None else ():
            if isinstance(source, TokenFile):
                source.n_samples(seq_len)
            elif isinstance(source, TokenShards):
                source.rows([0], seq_len)
    except BaseException:
        mixture.close()
        raise
    return mixture


__all__ = ["SYNTAX", "MixtureSource", "TokenShards", "open_data", "open_mixture", "open_source"]


def open_data(data: str, vocab_size: int, seed: int = 0, seq_len: int | None = None, model_name: str = "the model",
              tokenizer: str = "bytes", text_key: str = "text"):
    """What ``--data`` names: synthetic tokens or a lone token file (``open_tokens``, as always), else a
    ``MixtureSource`` (several sources, a weight, a directory, a glob or a shard file)."""
    from plait.run.data.mixture_spec import is_mixture
    from plait.run.data.tokens import open_tokens

    if not is_mixture(data):
        return open_tokens(data, vocab_size, seed, seq_len=seq_len, model_name=model_name)
    return open_mixture(data, vocab_size, seed, seq_len, model_name, tokenizer, text_key)
