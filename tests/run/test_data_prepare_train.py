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


def test_jsonl_bpe_corpus_to_eval_loss_and_tensorboard_through_the_cli(tmp_path, capsys):
    """Issue 16, Bar 3, as a user runs it: ``plait data prepare`` (BPE, jsonl, a validation split),
    then ``plait train`` with eval loss and a TensorBoard directory that tensorboard's reader reads."""
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    tokenizer = train_bpe(tmp_path / "tok", [EOS])
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS * 8))
    train, val = tmp_path / "train.tok", tmp_path / "val.tok"
    assert main(["data", "prepare", str(corpus), "--tokenizer", str(tokenizer), "--out", str(train),
                 "--val-fraction", "0.1", "--val-out", str(val)]) == 0
    log, board = tmp_path / "run.jsonl", tmp_path / "tb"
    assert main(["train", "--model", "tiny", "--global-batch", "4", "--seq-len", "16", "--steps", "4",
                 "--nproc-per-node", "1", "--device", "cpu", "--data", str(train), "--eval-data", str(val),
                 "--eval-every", "2", "--eval-steps", "1", "--tensorboard", str(board), "--log", str(log)]) == 0
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    evals = [line for line in lines if "eval_loss" in line and not line.get("summary")]
    assert [line["step"] for line in evals] == [2, 4]
    assert all(math.isfinite(line["eval_loss"]) and line["eval_loss"] < math.log(512) for line in evals)
    events = event_accumulator.EventAccumulator(str(board))
    events.Reload()
    assert "eval_loss" in events.Tags()["scalars"] and "loss" in events.Tags()["scalars"]
    assert [(e.step, round(e.value, 5)) for e in events.Scalars("eval_loss")] == \
        [(line["step"], round(line["eval_loss"], 5)) for line in evals]
