"""The data layer of ``plait train``: byte tokenizer, token files, and layout-independent sampling.

No torch here. Every bad input must end in a PlaitError that names the file and the problem.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pytest

from plait.errors import PlaitError
from plait.run.data import token_format
from plait.run.data import tokens as data
from plait.run.data.tokens import (
    HEADER,
    HEADER_SIZE,
    MAGIC,
    SyntheticTokens,
    TokenFile,
    open_tokens,
    prepare,
)
from plait.run.data.tokenizer import ByteTokenizer, get_tokenizer
from one_line import error_of  # tests/support

TOK = ByteTokenizer()
TEXTS = {"a.txt": "Hello, world.\nSecond line.", "b.txt": "Grüße, naïve café — 日本語 🚲"}


def make_corpus(tmp_path: Path, texts: dict[str, str] = TEXTS) -> Path:
    folder = tmp_path / "corpus"
    folder.mkdir(exist_ok=True)
    for name, text in texts.items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder


def craft(path: Path, tokens, vocab=257, version=1, itemsize=2, crc=None, name=b"bytes", tail=b"") -> Path:
    """Write a token file by hand (to build files that ``prepare`` never would)."""
    body = np.asarray(tokens, dtype="<u2" if itemsize == 2 else "<u4").tobytes()
    crc = zlib.crc32(body) if crc is None else crc
    path.write_bytes(HEADER.pack(MAGIC, version, itemsize, vocab, len(tokens), crc, 0, name) + body + tail)
    return path


def stream_file(tmp_path: Path, n_tokens: int, name: str = "stream.bin") -> Path:
    """A valid token file whose token at index i is i % 251 (so a window's content names its start)."""
    return craft(tmp_path / name, np.arange(n_tokens) % 251)


# ------------------------------------------------------------------ tokenizer
@pytest.mark.parametrize("text", ["", "plain ascii", "Grüße — naïve café", "日本語 and emoji 🚲🌧"])
def test_tokenizer_round_trip(text):
    ids = TOK.encode(text)
    assert ids == list(text.encode("utf-8")) and all(0 <= i < 256 for i in ids)
    assert TOK.decode(ids) == text
    assert TOK.decode(ids + [TOK.eot_id] + ids) == text + text  # end-of-text ids are skipped


def test_tokenizer_vocab_and_bad_ids():
    assert (TOK.vocab_size, TOK.eot_id, TOK.name) == (257, 256, "bytes")
    assert TOK.decode([0xE6, 0x97]) == "\ufffd"  # a cut multi-byte character decodes to U+FFFD
    assert "257" in error_of(TOK.decode, [65, 257])
    assert isinstance(get_tokenizer("bytes"), ByteTokenizer)
    assert "bytes" in error_of(get_tokenizer, "gpt2")


# --------------------------------------------------------- prepare + TokenFile
def test_prepare_round_trip(tmp_path):
    out = tmp_path / "out" / "tokens.bin"  # parent directory is created
    summary = prepare([make_corpus(tmp_path)], out)
    expected = []
    for name in sorted(TEXTS):
        expected += TOK.encode(TEXTS[name]) + [TOK.eot_id]
    n_bytes = sum(len(t.encode("utf-8")) for t in TEXTS.values())
    assert summary["n_files"] == 2 and summary["n_bytes_text"] == n_bytes
    assert summary["n_tokens"] == len(expected) == n_bytes + 2
    assert summary["dtype"] == "uint16" and summary["path"] == str(out)
    tf = TokenFile(out)
    assert tf.tokens.dtype == np.uint16 and tf.vocab_size == 257 and tf.tokenizer == "bytes"
    assert tf.n_tokens == len(expected) and tf.tokens.tolist() == expected
    assert out.stat().st_size == HEADER_SIZE + 2 * len(expected)
    assert TOK.decode(tf.tokens) == TEXTS["a.txt"] + TEXTS["b.txt"]
    tf.verify()  # a fresh file verifies


def test_prepare_inputs_order_and_empty_files(tmp_path):
    folder = make_corpus(tmp_path, {"b.txt": "bee", "a.txt": "ay", "empty.txt": "", "notes.md": "skip me"})
    (folder / "sub").mkdir()
    (folder / "sub" / "c.txt").write_text("sea")
    extra = tmp_path / "extra.text"
    extra.write_text("given by name")
    summary = prepare([folder, extra], tmp_path / "t.bin")
    assert summary["n_files"] == 4  # a, b, sub/c (sorted, recursive); empty skipped; .md ignored; explicit file
    assert TOK.decode(TokenFile(tmp_path / "t.bin").tokens) == "aybeeseagiven by name"


def test_prepare_bad_inputs(tmp_path):
    assert "nope.txt" in error_of(prepare, [tmp_path / "nope.txt"], tmp_path / "o.bin")
    (tmp_path / "emptydir").mkdir()
    assert "no *.txt" in error_of(prepare, [tmp_path / "emptydir"], tmp_path / "o.bin")
    (tmp_path / "blank.txt").write_text("")
    assert "no text found" in error_of(prepare, [tmp_path / "blank.txt"], tmp_path / "o.bin")
    (tmp_path / "latin1.txt").write_bytes("café".encode("latin-1"))
    assert "not UTF-8" in error_of(prepare, [tmp_path / "latin1.txt"], tmp_path / "o.bin")
    assert "unknown tokenizer" in error_of(prepare, [make_corpus(tmp_path)], tmp_path / "o.bin", tokenizer="bpe")
    assert "is a directory" in error_of(prepare, [make_corpus(tmp_path)], tmp_path)
    assert "no input" in error_of(prepare, [], tmp_path / "o.bin")
    assert not (tmp_path / "o.bin").exists()
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("exc", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_prepare_is_atomic(tmp_path, monkeypatch, exc):
    folder = make_corpus(tmp_path)
    out = tmp_path / "tokens.bin"
    out.write_bytes(b"old contents")
    calls = []

    def failing_write(f, array):
        calls.append(len(array))
        if len(calls) == 2:
            raise exc
        f.write(array.tobytes())

    monkeypatch.setattr(token_format, "_write_chunk", failing_write)
    if isinstance(exc, OSError):
        assert "No space left" in error_of(prepare, [folder], out)
    else:
        with pytest.raises(KeyboardInterrupt):
            prepare([folder], out)
    assert len(calls) == 2  # the failure happened after the first document was written
    assert out.read_bytes() == b"old contents"  # the old file is untouched ...
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus", "tokens.bin"]  # ... and no temp file is left
    monkeypatch.undo()
    out.unlink()
    prepare([folder], tmp_path / "new.bin")
    assert not out.exists() and (tmp_path / "new.bin").exists()


# ------------------------------------------------------------------- corruption
def test_missing_and_directory(tmp_path):
    message = error_of(TokenFile, tmp_path / "missing.bin")
    assert "missing.bin" in message and "not found" in message and "plait data prepare" in message
    assert "is a directory" in error_of(TokenFile, tmp_path)


def test_bad_magic_and_empty(tmp_path):
    (tmp_path / "text.txt").write_text("just some text that is longer than a header " * 3)
    message = error_of(TokenFile, tmp_path / "text.txt")
    assert "text.txt" in message and "bad magic" in message
    (tmp_path / "empty.bin").write_bytes(b"")
    assert "empty" in error_of(TokenFile, tmp_path / "empty.bin")


def test_truncated_and_extra_bytes(tmp_path):
    good = stream_file(tmp_path, 100).read_bytes()
    (tmp_path / "short.bin").write_bytes(good[:-10])
    message = error_of(TokenFile, tmp_path / "short.bin")
    assert "short.bin" in message and "truncated" in message and "5 tokens missing" in message
    (tmp_path / "head.bin").write_bytes(good[:20])
    assert "shorter than the 64-byte header" in error_of(TokenFile, tmp_path / "head.bin")
    (tmp_path / "long.bin").write_bytes(good + b"\0\0\0")
    assert "3 extra bytes" in error_of(TokenFile, tmp_path / "long.bin")


def test_bad_header_fields(tmp_path):
    assert "version 2 is not supported" in error_of(TokenFile, craft(tmp_path / "v.bin", [1, 2, 3], version=2))
    assert "bytes per token" in error_of(TokenFile, craft(tmp_path / "i.bin", [1, 2], itemsize=3))
    assert "vocab 70000" in error_of(TokenFile, craft(tmp_path / "w.bin", [1, 2], vocab=70000))
    assert "not ASCII" in error_of(TokenFile, craft(tmp_path / "n.bin", [1, 2], name=b"\xff"))
    assert "holds 1 tokens" in error_of(TokenFile, craft(tmp_path / "one.bin", [7]))
    wide = TokenFile(craft(tmp_path / "u4.bin", [70000, 1, 2], vocab=100000, itemsize=4))
    assert wide.tokens.dtype == np.uint32 and wide.tokens.tolist() == [70000, 1, 2]


def test_flipped_byte_is_caught(tmp_path, monkeypatch):
    path = stream_file(tmp_path, 1000)
    raw = bytearray(path.read_bytes())
    raw[HEADER_SIZE + 2 * 500] ^= 0x01  # still a valid id, wrong data
    path.write_bytes(bytes(raw))
    message = error_of(TokenFile, path)  # small file: checked on open
    assert "stream.bin" in message and "checksum mismatch" in message
    monkeypatch.setattr(data, "VERIFY_ON_OPEN_BYTES", 0)  # large file: open skips the full read ...
    tf = TokenFile(path)
    assert "checksum mismatch" in error_of(tf.verify)  # ... and verify() still catches it


def test_out_of_vocab_token(tmp_path):
    message = error_of(TokenFile, craft(tmp_path / "oov.bin", [1, 300, 2]))  # checksum is right
    assert "token id 300" in message and "vocab 257" in message


def test_random_corruption_only_raises_plait_error(tmp_path):
    good = bytearray(stream_file(tmp_path, 64).read_bytes())
    rng = np.random.default_rng(0)
    path = tmp_path / "fuzz.bin"
    caught = 0
    for trial in range(200):
        raw = bytearray(good)
        if trial % 3 == 0:
            raw = raw[: int(rng.integers(0, len(raw)))]
        else:
            for _ in range(int(rng.integers(1, 4))):
                raw[int(rng.integers(0, len(raw)))] = int(rng.integers(0, 256))
        path.write_bytes(bytes(raw))
        try:
            TokenFile(path)
        except PlaitError as e:
            caught += 1
            assert "fuzz.bin" in str(e)
    assert caught > 170  # a rare mutation (e.g. of the reserved field) is harmless; the rest are caught


def test_too_few_tokens_for_a_sequence(tmp_path):
    path = stream_file(tmp_path, 100)
    message = error_of(TokenFile, path, seq_len=100)
    assert "has 100 tokens" in message and "needs 101" in message
    assert "needs 101" in error_of(open_tokens, path, 257, seq_len=100)
    assert "needs 101" in error_of(TokenFile(path).batch, 0, [0], 100, 4)
    assert TokenFile(path, seq_len=99).n_samples(99) == 1


# ---------------------------------------------------------------- sampling
def rows_by_layout(source, step: int, seq_len: int, global_batch: int, dp: int) -> np.ndarray:
    """What dp data-parallel ranks read at one step, concatenated in rank order."""
    per_rank = global_batch // dp
    return np.concatenate([source.batch(step, range(r * per_rank, (r + 1) * per_rank), seq_len, global_batch)
                           for r in range(dp)])


@pytest.mark.parametrize("kind", ["synthetic", "file"])
def test_sampling_is_layout_independent(tmp_path, kind):
    source = SyntheticTokens(300, seed=3) if kind == "synthetic" else TokenFile(stream_file(tmp_path, 2000), seed=3)
    seq_len, gb = 16, 8
    full = rows_by_layout(source, 5, seq_len, gb, dp=1)
    assert full.shape == (gb, seq_len + 1) and full.dtype == np.int64
    for dp in (2, 4, 8):
        assert np.array_equal(rows_by_layout(source, 5, seq_len, gb, dp), full)
    order = [6, 1, 3]
    assert np.array_equal(source.batch(5, order, seq_len, gb), full[order])  # any subset, any order
    again = SyntheticTokens(300, seed=3) if kind == "synthetic" else TokenFile(source.path, seed=3)
    assert np.array_equal(again.batch(5, [2], seq_len, gb)[0], full[2])  # a fresh reader: no hidden state
    assert not np.array_equal(source.batch(6, range(gb), seq_len, gb), full)  # the step matters
    assert not np.array_equal(full[0], full[1])  # so does the position
    other = SyntheticTokens(300, seed=4) if kind == "synthetic" else TokenFile(source.path, seed=4)
    assert not np.array_equal(rows_by_layout(other, 5, seq_len, gb, 1), full)  # and the seed


def test_synthetic_tokens_range_and_errors():
    rows = SyntheticTokens(50, seed=0).batch(0, range(64), 32, 64)
    assert rows.min() >= 0 and rows.max() < 50 and len(np.unique(rows)) == 50
    assert "seed" in error_of(SyntheticTokens, 10, -1)
    assert "seq_len" in error_of(SyntheticTokens(10).batch, 0, [0], 0, 1)


def test_every_window_once_per_epoch(tmp_path):
    seq_len, gb, n_tokens = 10, 7, 1234
    tf = TokenFile(craft(tmp_path / "ids.bin", np.arange(n_tokens), vocab=n_tokens, itemsize=4), seed=11)
    n = tf.n_samples(seq_len)
    assert n == (n_tokens - 1) // seq_len == 123
    steps = -(-2 * n // gb) + 1  # a bit more than two epochs, in batches that do not divide n
    rows = np.concatenate([tf.batch(s, range(gb), seq_len, gb) for s in range(steps)])
    assert all(np.array_equal(row, np.arange(row[0], row[0] + seq_len + 1)) for row in rows)  # contiguous windows
    assert (rows[:, 0] % seq_len == 0).all() and rows[:, -1].max() < n_tokens
    windows = (rows[:, 0] // seq_len).tolist()  # token i is i, so a row names its window
    epoch0, epoch1 = windows[:n], windows[n : 2 * n]
    assert sorted(epoch0) == list(range(n)) and sorted(epoch1) == list(range(n))
    assert epoch0 != epoch1 and epoch0 != sorted(epoch0)  # shuffled, and differently each epoch
    assert tf.permutation(seq_len, 1).tolist() == epoch1
    assert windows[2 * n :] == tf.permutation(seq_len, 2)[: len(windows) - 2 * n].tolist()


def test_sampling_rejects_bad_positions(tmp_path):
    tf = TokenFile(stream_file(tmp_path, 500))
    assert "global_batch=4" in error_of(tf.batch, 0, [4], 8, 4)
    assert ">= 0" in error_of(tf.batch, 0, [-1], 8, 4)
    assert "step" in error_of(tf.batch, -1, [0], 8, 4)
    assert "global_batch" in error_of(tf.batch, 0, [0], 8, 0)


# ---------------------------------------------------------------- open_tokens
def test_open_tokens(tmp_path):
    synthetic = open_tokens("synthetic", 512, seed=2)
    assert isinstance(synthetic, SyntheticTokens) and synthetic.vocab_size == 512 and synthetic.seed == 2
    path = prepare([make_corpus(tmp_path)], tmp_path / "t.bin")["path"]
    message = error_of(open_tokens, path, 256, model_name="tiny")
    assert "t.bin" in message and "vocab 257" in message and "model tiny has vocab 256" in message
    tf = open_tokens(path, 32000, seed=5, seq_len=8)
    assert isinstance(tf, TokenFile) and tf.seed == 5 and "uint16" in tf.description
    assert "not found" in error_of(open_tokens, tmp_path / "nothing.bin", 257)


def test_shipped_corpus_prepares(tmp_path):
    corpus = data.sample_corpus_path()
    files = sorted(corpus.glob("*.txt"))
    total = sum(p.stat().st_size for p in files)
    assert len(files) >= 3 and 150_000 <= total <= 300_000
    summary = prepare([corpus], tmp_path / "sample.bin")
    assert summary["n_tokens"] > 100_000 and summary["n_files"] == len(files)
    tf = TokenFile(tmp_path / "sample.bin", seq_len=256)
    text = TOK.decode(tf.batch(0, [0], 256, 1)[0])
    assert sum(ch.isalpha() or ch in " .,\n" for ch in text) > 0.9 * len(text)  # readable prose
