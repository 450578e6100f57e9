"""A corpus prepared with a real BPE tokenizer trains: JSON lines -> ``prepare`` -> the tiny model on
one process (the session's 1-rank pool), and ``plait train --dry-run`` accepts the file."""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("torch")
pytest.importorskip("tokenizers")

import runtime_tasks  # noqa: E402  (tests/run and tests/support, after the skips)
from bpe_corpus import DOCS, EOS, train_bpe  # noqa: E402

from plait.cli import main  # noqa: E402
from plait.run.data.prepare import prepare  # noqa: E402
from plait.run.data.tokens import TokenFile  # noqa: E402


def test_a_bpe_corpus_trains(tmp_path, dist_pool, capsys):
    tokenizer = train_bpe(tmp_path / "tok", [EOS])
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS * 8))
    summary = prepare([corpus], tmp_path / "train.tok", tokenizer=str(tokenizer), val_fraction=0.1,
                      val_out=str(tmp_path / "val.tok"))
    vocab = summary["vocab_size"]
    assert vocab <= 512 and TokenFile(tmp_path / "val.tok").n_tokens > 16  # tiny's vocab holds the BPE's ids
    assert main(["train", "--model", "tiny", "--global-batch", "4", "--seq-len", "16", "--nproc-per-node", "1",
                 "--device", "cpu", "--data", str(tmp_path / "train.tok"), "--dry-run"]) == 0
    assert "train.tok" in capsys.readouterr().out
    losses = dist_pool(1).run(runtime_tasks.train_layout, "dp=1", steps=8, global_batch=4, seq_len=16,
                              data=str(tmp_path / "train.tok"))[0]["losses"]
    assert all(math.isfinite(x) for x in losses)
    # 5 sentences repeated: the tokens are far more predictable than uniform over the model's 512 ids
    assert losses[0] > math.log(512) - 0.5 and losses[-1] < losses[0] - 0.5
