"""``plait data prepare``: tokenize documents into a token file (optionally a validation file beside it).

Every document's tokens are followed by the end-of-text id, so document boundaries stay visible in
the stream. Units of work (``plait.run.data.documents``) are tokenized by ``workers`` processes
and written in unit order, so the output is byte-identical for any worker count. With
``val_fraction`` f, document i (0-based, over all inputs in order) goes to the validation file
when floor((i + 1) * f) > floor(i * f): exactly floor(n * f) documents, evenly spread. No torch here.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterator, Sequence
from contextlib import closing, nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from plait.errors import PlaitError
from plait.progress import ProgressBar
from plait.run.data.documents import Unit, find_files, plan_units, read_documents
from plait.run.data.token_format import TokenWriter, token_dtype
from plait.run.data.tokenizer import get_tokenizer


@dataclass(frozen=True)
class PrepareOptions:
    """How ``prepare`` tokenizes (the flags of ``plait data prepare`` read their defaults here)."""

    tokenizer: str = "bytes"  # bytes, tiktoken:ENCODING, or a local tokenizer.json / a directory holding one
    text_key: str = "text"  # JSON field / parquet column holding a document's text
    workers: int = 1  # processes tokenizing in parallel (the output is identical for any count)
    eos_id: int | None = None  # id put after every document (default: the tokenizer's end-of-text token)
    val_fraction: float = 0.0  # share of documents (not tokens) written to val_out instead of the output
    val_out: str | None = None  # validation token file; required when val_fraction > 0

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise PlaitError(f"workers must be at least 1 process, got {self.workers}")
        if self.eos_id is not None and not 0 <= self.eos_id < 2**32:
            raise PlaitError(f"eos id must be in 0..2**32-1, got {self.eos_id}")
        if not 0.0 <= self.val_fraction < 1.0:
            raise PlaitError(f"val fraction must be in [0, 1) (a share of the documents), got {self.val_fraction}")
        if self.val_fraction > 0 and not self.val_out:
            raise PlaitError("a validation fraction needs a file to write: pass --val-out FILE")
        if self.val_out and self.val_fraction == 0:
            raise PlaitError("--val-out needs --val-fraction F (the share of documents it gets, e.g. 0.01)")
        if not self.text_key:
            raise PlaitError("text key must not be empty (default: text)")


@dataclass(frozen=True)
class Encoded:
    """One unit's documents, tokenized: their ids back to back, each document followed by the EOS id."""

    tokens: np.ndarray  # ids, in the token file's dtype
    lengths: np.ndarray  # tokens per document, EOS included
    n_bytes: int  # UTF-8 bytes of the documents' text


def encode_unit(tok, unit: Unit, text_key: str, eos: int, dtype: str) -> Encoded:
    """Read and tokenize one unit with the tokenizer ``tok``: every document's ids, then ``eos``, as
    ``dtype`` (the token file's)."""
    docs = read_documents(unit, text_key)
    ids = tok.encode_batch(docs) if docs else []
    end = np.array([eos], dtype=dtype)
    tokens = np.concatenate([part for doc in ids for part in (doc, end)]).astype(dtype, copy=False) if ids \
        else np.empty(0, dtype=dtype)
    lengths = np.array([len(doc) + 1 for doc in ids], dtype=np.int64)
    return Encoded(tokens, lengths, sum(len(d.encode("utf-8")) for d in docs))


_worker: dict[str, object] = {}  # set in a pool's worker processes only: {"tokenizer": loaded once per worker}


def _start_worker(tokenizer: str) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker: the workers are the parallelism
    _worker["tokenizer"] = get_tokenizer(tokenizer)


def _encode_in_worker(job: tuple[Unit, str, int, str]) -> Encoded:
    return encode_unit(_worker["tokenizer"], *job)


def _encoded(tok, name: str, jobs: list[tuple[Unit, str, int, str]], workers: int) -> Iterator[Encoded]:
    """``encode_unit`` of every job, in order: in this process with ``tok`` for one worker, else in a
    pool of processes that each load the tokenizer ``name`` once."""
    if workers == 1 or len(jobs) <= 1:
        yield from (encode_unit(tok, *job) for job in jobs)
        return
    context = multiprocessing.get_context("spawn")  # never fork a process that may hold tokenizer threads
    with context.Pool(min(workers, len(jobs)), initializer=_start_worker, initargs=(name,)) as pool:
        yield from pool.imap(_encode_in_worker, jobs)


def _val_mask(first: int, count: int, fraction: float) -> np.ndarray:
    """Which of documents first..first+count-1 go to the validation file (see the module docstring)."""
    index = np.arange(first, first + count, dtype=np.float64)
    return np.floor((index + 1) * fraction) > np.floor(index * fraction)


def prepare(inputs: Sequence[str | os.PathLike], out: str | os.PathLike, tokenizer: str = "bytes", *,
            progress: bool = False, **settings) -> dict:
    """Tokenize ``inputs`` (files or directories, see ``plait.run.data.documents``) into the token file ``out``.

    ``settings`` are the other fields of ``PrepareOptions``. The file is written atomically (a
    failure leaves an older ``out`` untouched; a device or FIFO is written through). ``progress``
    draws a bar on a terminal. Returns a summary: path, n_files (files with text), n_documents,
    n_bytes_text (UTF-8 bytes of text), n_tokens, dtype, vocab_size, tokenizer, eos_id, checksum,
    and ``val`` (path, n_documents, n_tokens) when a validation file was written.
    """
    opts = PrepareOptions(tokenizer=tokenizer, **settings)
    tok = get_tokenizer(opts.tokenizer)
    eos = opts.eos_id if opts.eos_id is not None else tok.eot_id
    if eos is None:
        raise PlaitError(f"tokenizer {tok.name} names no end-of-text token; pass --eos-id N (the id to put after "
                         "every document)")
    vocab = max(tok.vocab_size, eos + 1)
    files = find_files(inputs)
    if opts.val_out is not None and Path(opts.val_out).resolve() == Path(out).resolve():
        raise PlaitError(f"--val-out {opts.val_out} is the output file itself; give another name")
    units = plan_units(files, opts.text_key)
    jobs = [(unit, opts.text_key, eos, token_dtype(vocab).str) for unit in units]
    n_docs = n_bytes = n_val_docs = 0
    files_with_text: set[int] = set()
    bar = ProgressBar("tokenizing", len(units), enabled=progress, lines=False, clock="remaining")
    try:
        with TokenWriter(out, vocab, tok.name, eos) as train, \
                (TokenWriter(opts.val_out, vocab, tok.name, eos) if opts.val_out else nullcontext()) as val, \
                closing(_encoded(tok, opts.tokenizer, jobs, opts.workers)) as parts:  # closed: the pool ends
            for unit, part in zip(units, parts):
                if len(part.lengths):
                    files_with_text.add(unit.file_index)
                if val is None:
                    train.append(part.tokens)
                else:
                    chosen = _val_mask(n_docs, len(part.lengths), opts.val_fraction)
                    in_val = np.repeat(chosen, part.lengths)
                    train.append(part.tokens[~in_val])
                    val.append(part.tokens[in_val])
                    n_val_docs += int(chosen.sum())
                n_docs += len(part.lengths)
                n_bytes += part.n_bytes
                bar.advance(f"{train.n_tokens + (val.n_tokens if val else 0):,} tokens")
            if n_docs == 0:
                names = ", ".join(str(p) for p in files[:3]) + (", ..." if len(files) > 3 else "")
                raise PlaitError(f"no text found in {names}")
            if val is not None and n_val_docs == 0:
                raise PlaitError(f"no document went to the validation file: {n_docs} documents x val fraction "
                                 f"{opts.val_fraction} < 1; raise --val-fraction (at least {1 / n_docs:.3g})")
    finally:
        bar.close()
    summary = {"path": str(out), "n_files": len(files_with_text), "n_documents": n_docs - n_val_docs,
               "n_bytes_text": n_bytes, "n_tokens": train.n_tokens, "dtype": train.dtype.name, "vocab_size": vocab,
               "tokenizer": tok.name, "eos_id": eos, "checksum": f"{train.crc:08x}"}
    if val is not None:
        summary["val"] = {"path": str(opts.val_out), "n_documents": n_val_docs, "n_tokens": val.n_tokens}
    return summary

