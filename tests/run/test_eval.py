"""Held-out loss during training (plait.run.observe.evaluate): the value equals a forward pass computed by
hand, it is logged to JSONL and TensorBoard at the steps asked, it does not change training, and
a pipelined 2-process layout computes the same numbers as one process.

The tiny model (runtime_tasks.make_config: 4 layers, vocab 512) trains 3 steps on synthetic tokens
with an evaluation after every step over 2 global batches (8 × 32 tokens) of a random token file.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

import eval_tasks
import runtime_tasks
import tolerances

from plait.cli import main
from plait.errors import PlaitError
from plait.run.config import EvalConfig
from plait.run.launcher.request import TrainRequest
from plait.run.launcher.resolve import eval_config

BATCHES, GLOBAL_BATCH, SEQ_LEN = 2, 8, 32
EVAL_TOKENS = BATCHES * GLOBAL_BATCH * SEQ_LEN


def eval_lines(lines: list[dict]) -> list[dict]:
    """The JSONL lines of the evaluations (not the summary, which repeats the last eval loss)."""
    return [line for line in lines if "eval_loss" in line and not line.get("summary")]


@pytest.fixture(scope="module")
def eval_file(tmp_path_factory):
    # 4,000 tokens: 124 windows of 33, more than the 16 the evaluation reads
    return eval_tasks.write_token_file(tmp_path_factory.mktemp("eval") / "held_out.bin", 4000, 512, seed=7)


@pytest.fixture(scope="module")
def one_process(eval_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    result = runtime_tasks.in_one_process(eval_tasks.one_process_eval_run, eval_file, str(out / "run.jsonl"),
                                          str(out / "tb"))
    lines = [json.loads(line) for line in (out / "run.jsonl").read_text().splitlines()]
    return {**result, "lines": lines, "tb": out / "tb"}


def test_eval_loss_equals_the_forward_loss_computed_by_hand(one_process):
    # the same kernels on the same batches; only the sum over the tokens and batches may be ordered
    # differently: an fp32 sum of EVAL_TOKENS terms
    assert one_process["eval_loss"] == pytest.approx(one_process["hand"],
                                                     rel=tolerances.reduction_rtol(EVAL_TOKENS))


def test_eval_lines_follow_every_eval_step(one_process):
    evals = eval_lines(one_process["lines"])
    assert [line["step"] for line in evals] == [1, 2, 3]  # optimizer steps done, as the console counts
    assert all(line["eval_tokens"] == EVAL_TOKENS for line in evals)
    assert evals[-1]["eval_loss"] == one_process["eval_loss"]
    assert one_process["lines"][-1]["eval_loss"] == one_process["eval_loss"]  # the summary line
    assert evals[0]["eval_loss"] != evals[-1]["eval_loss"]  # the weights moved between evaluations


def test_evaluating_does_not_change_training(one_process):
    reference = runtime_tasks.reference()  # the same run without evaluation
    assert one_process["losses"] == reference["losses"]


def test_tensorboard_holds_loss_lr_and_eval_loss(one_process):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(one_process["tb"]))
    events.Reload()
    assert {"loss", "lr", "grad_norm", "tokens_per_s", "eval_loss"} <= set(events.Tags()["scalars"])
    steps = [line for line in one_process["lines"] if "loss" in line and "summary" not in line]
    evals = eval_lines(one_process["lines"])

    def scalars(tag):
        return [(event.step, event.value) for event in events.Scalars(tag)]

    # TensorBoard stores fp32: compare with the JSONL values rounded to fp32
    assert scalars("loss") == [(line["step"], pytest.approx(line["loss"], rel=tolerances.U)) for line in steps]
    assert scalars("lr") == [(line["step"], pytest.approx(line["lr"], rel=tolerances.U)) for line in steps]
    assert scalars("eval_loss") == [(line["step"], pytest.approx(line["eval_loss"], rel=tolerances.U))
                                    for line in evals]


def test_a_pipeline_evaluates_what_one_process_does(dist_pool, one_process, eval_file, tmp_path):
    # pp=2 runs the evaluation through the schedule's forward-only eval between training steps; with
    # activation offload of half the first stage's layers (the second stage holds no offloaded layer,
    # and still joins the summary's offload collective)
    out = dist_pool(2).run(eval_tasks.train_with_eval, "pp=2,offload=cpu:0.5", eval_file,
                           str(tmp_path / "run.jsonl"), timeout=180)
    reference = [line["eval_loss"] for line in eval_lines(one_process["lines"])]
    got = [line["eval_loss"] for line in out[0]["evals"]]
    # a loss of the same weights summed in another order, as the training losses of tests/run/test_runtime_parity.py
    assert got == pytest.approx(reference, rel=tolerances.LOSS_RTOL)
    assert out[0]["losses"] == pytest.approx(one_process["losses"], rel=tolerances.LOSS_RTOL)
    assert out[1]["eval_loss"] == out[0]["eval_loss"] == got[-1]  # every rank returns the same value


def test_eval_settings_are_checked():
    with pytest.raises(PlaitError, match="eval_every=5 needs eval_data"):
        EvalConfig(every=5)
    with pytest.raises(PlaitError, match="eval_steps=0 must be a positive integer"):
        EvalConfig(data="x.bin", steps=0)
    assert EvalConfig(data="x.bin", every=4).due_after(8, 10) and EvalConfig(data="x.bin").due_after(10, 10)
    assert not EvalConfig(data="x.bin").due_after(8, 10) and not EvalConfig().due_after(10, 10)


def test_eval_data_is_checked_against_the_model_before_launching(tmp_path, capsys):
    big = eval_tasks.write_token_file(tmp_path / "big.bin", 100, 1000, seed=0)
    job = runtime_tasks.make_config("dp=1").job
    with pytest.raises(PlaitError, match="has vocab 1000 .* but model tiny has vocab 512"):
        eval_config(TrainRequest(eval_data=big), job)
    argv = ["train", "--model", "tiny", "--global-batch", "8", "--seq-len", "32", "--device", "cpu", "--dry-run"]
    assert main(argv + ["--eval-data", str(tmp_path / "missing.bin")]) == 2
    assert "missing.bin not found" in capsys.readouterr().err
    assert main(argv + ["--eval-every", "2"]) == 2
    assert "eval_every=2 needs eval_data (--eval-data TOKENS" in capsys.readouterr().err
