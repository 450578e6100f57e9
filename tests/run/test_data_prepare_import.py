"""``plait data prepare --import-bin``: a raw token array (nanoGPT's train.bin) into a plait token file.
No torch here."""

from __future__ import annotations

import numpy as np

from plait.cli import main
from plait.run.data import import_bin as import_module
from plait.run.data.import_bin import import_bin
from plait.run.data.tokens import TokenFile
from one_line import error_of  # tests/support


def test_nanogpt_bin_is_imported_as_is(tmp_path, monkeypatch):
    ids = (np.arange(5000) * 7919 % 50257).astype(np.uint16)  # nanoGPT: GPT-2 ids as uint16, no header
    ids.tofile(tmp_path / "train.bin")
    monkeypatch.setattr(import_module, "CHUNK_TOKENS", 1000)  # several chunks
    summary = import_bin(tmp_path / "train.bin", tmp_path / "train.tok", "uint16", 50257)
    tf = TokenFile(tmp_path / "train.tok")
    np.testing.assert_array_equal(tf.tokens, ids)
    assert tf.vocab_size == 50257 and tf.dtype == np.uint16 and tf.tokenizer == summary["tokenizer"] == "raw-uint16"
    assert summary["n_tokens"] == 5000 and summary["checksum"] == f"{tf.checksum:08x}"


def test_dtype_follows_the_vocab(tmp_path):
    wide = np.array([0, 70000, 5, 100255], dtype=np.uint32)  # a vocab above 65536 needs uint32
    wide.tofile(tmp_path / "wide.bin")
    import_bin(tmp_path / "wide.bin", tmp_path / "wide.tok", "uint32", 100277, name="tiktoken:cl100k_base")
    tf = TokenFile(tmp_path / "wide.tok")
    assert tf.dtype == np.uint32 and tf.tokens.tolist() == wide.tolist() and tf.tokenizer == "tiktoken:cl100k_base"
    narrow = np.array([1, 2, 3, 4], dtype=np.uint32)  # uint32 ids of a small vocab land as uint16
    narrow.tofile(tmp_path / "narrow.bin")
    import_bin(tmp_path / "narrow.bin", tmp_path / "narrow.tok", "uint32", 50)
    assert TokenFile(tmp_path / "narrow.tok").dtype == np.uint16


def test_import_errors(tmp_path, monkeypatch):
    out = tmp_path / "o.tok"
    np.array([1, 2, 300, 4, 900], dtype=np.uint16).tofile(tmp_path / "ids.bin")
    monkeypatch.setattr(import_module, "CHUNK_TOKENS", 2)  # the bad id is in the second chunk
    message = error_of(import_bin, tmp_path / "ids.bin", out, "uint16", 256)
    assert "token 2 is id 300, not below vocab 256" in message and "--vocab" in message
    (tmp_path / "odd.bin").write_bytes(b"\x01\x00\x02")
    assert "not a whole number of uint16 ids" in error_of(import_bin, tmp_path / "odd.bin", out, "uint16", 256)
    assert "not found" in error_of(import_bin, tmp_path / "none.bin", out, "uint16", 256)
    assert "int8" in error_of(import_bin, tmp_path / "ids.bin", out, "int8", 256)
    (tmp_path / "one.bin").write_bytes(b"\x01\x00")
    assert "at least 2" in error_of(import_bin, tmp_path / "one.bin", out, "uint16", 256)
    assert not out.exists() and not list(tmp_path.glob(".*.tmp"))


def test_cli_import(tmp_path, capsys):
    np.arange(100, dtype=np.uint16).tofile(tmp_path / "train.bin")
    out = tmp_path / "train.tok"
    assert main(["data", "prepare", "--import-bin", str(tmp_path / "train.bin"), "--vocab", "100", "--out", str(out)]) == 0
    assert "wrote 100 tokens (uint16, vocab 100, tokenizer raw-uint16)" in capsys.readouterr().out
    assert TokenFile(out).tokens.tolist() == list(range(100))
    for extra, wanted in ((["--vocab", "100", "--workers", "2"], "--workers"), ([], "--vocab N"),
                          (["--vocab", "100", "extra.txt"], "not both")):
        assert main(["data", "prepare", "--import-bin", str(tmp_path / "train.bin"), "--out", str(tmp_path / "x.tok"),
                     *extra]) == 2
        assert wanted in capsys.readouterr().err
    assert not (tmp_path / "x.tok").exists()
