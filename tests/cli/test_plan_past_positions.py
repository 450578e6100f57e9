"""``plait plan`` and ``plait train`` at a sequence length past the model's max_position_embeddings:
a RoPE model is planned and trained with one warning line naming its RoPE scaling (stdout keeps the
table, or the JSON); learned positions (GPT-2) are refused in one line that says why."""

from __future__ import annotations

import json

from plait.cli import main

WARNING = ("plait: warning: seq_len=512 passes tiny's max_position_embeddings=256: RoPE runs at any length, here "
           "with no rope_scaling (plain RoPE, rope_theta=10000); positions past 256 are new to the model")
PLAN = ["plan", "--gpus", "2", "--global-batch", "8", "--seq-len", "512", "--top", "1"]


def test_plan_warns_once_and_ranks(capsys):
    assert main([*PLAN, "--model", "tiny"]) == 0
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [WARNING]
    assert "fitting layouts that plait train runs" in captured.out
    assert main([*PLAN, "--model", "tiny", "--json"]) == 0
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [WARNING]
    assert json.loads(captured.out)[0]["model"]["max_seq_len"] == 256  # the plan records the config's length


def test_plan_within_the_context_says_nothing(capsys):
    assert main([*PLAN[:-4], "--seq-len", "256", "--top", "1", "--model", "tiny"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_learned_positions_are_refused_with_the_reason(capsys):
    assert main([*PLAN, "--model", "tiny-gpt"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "learned absolute position embeddings have one row per position and none past 256" in err


def test_train_warns_once(capsys):
    code = main(["train", "--model", "tiny", "--layout", "cp=2", "--global-batch", "8", "--seq-len", "512",
                 "--nproc-per-node", "2", "--device", "cpu", "--dry-run"])
    captured = capsys.readouterr()
    assert code == 0 and "torchrun" in captured.out
    assert [line for line in captured.err.splitlines() if "warning" in line] == [WARNING]
