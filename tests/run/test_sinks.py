"""Metrics sinks (plait.run.observe.sinks): which JSONL lines reach them, how a failed run closes
them, MLflow's metric names, the missing-package errors, and the console line. The W&B and MLflow
sinks with the real packages: tests/run/test_sinks_real.py."""

from __future__ import annotations

import json
import sys

import pytest

from plait.cli import main
from plait.errors import PlaitError
from plait.run.config import LogConfig, RunConfig, TrainJob
from plait.run.metrics import StepRecord, status_text
from plait.run.observe.jsonl import HEADER, JsonlLog
from plait.run.observe.sinks import MetricsLog, check_sinks, mlflow_name, open_sinks, run_params, scalars_of
from plait.spec.layout import Layout
from plait.spec.models import get_model

STEP_LINE = {"step": 3, "loss": 2.5, "lr": 1e-4, "grad_norm": 0.75, "step_time_s": 0.5, "tokens_per_s": 512.0,
             "mfu": None, "time": 1.7e9, "skipped": True}
EVAL_LINE = {"step": 4, "eval_loss": 2.25, "eval_tokens": 512, "eval_s": 0.125, "time": 1.7e9}
RUN = RunConfig(job=TrainJob(model=get_model("tiny"), layout=Layout.parse("dp=1"), global_batch=8,
                             seq_len=32)).to_dict()


class RecordingSink:
    def __init__(self):
        self.calls: list[tuple[int, dict]] = []
        self.closed: bool | None = None  # None: open; else whether it was closed as failed

    def log(self, values, step):
        self.calls.append((step, values))

    def close(self, failed=False):
        self.closed = failed


def test_step_and_eval_lines_reach_the_sinks_as_scalars(tmp_path):
    sink = RecordingSink()
    log = MetricsLog(JsonlLog(str(tmp_path / "run.jsonl")), [sink])
    log.write({"event": "resume", "step": 2, "checkpoint": "/ckpt"})
    log.write(STEP_LINE)
    log.write(EVAL_LINE)
    log.write({"summary": True, "steps": 4, "final_loss": 2.5})
    log.close()
    # numbers only: not the step and time, not None (mfu off GPU), not flags (skipped)
    assert sink.calls == [(3, {"loss": 2.5, "lr": 1e-4, "grad_norm": 0.75, "step_time_s": 0.5, "tokens_per_s": 512.0}),
                          (4, {"eval_loss": 2.25, "eval_tokens": 512.0, "eval_s": 0.125})]
    assert sink.closed is False  # closed, not failed
    lines = [json.loads(line) for line in (tmp_path / "run.jsonl").read_text().splitlines()]
    # the JSONL file keeps every line whole, after its format line
    assert len(lines) == 5 and lines[0] == HEADER and lines[2] == STEP_LINE


def test_events_and_summaries_have_no_scalars():
    assert scalars_of({"event": "checkpoint", "step": 5}) is None
    assert scalars_of({"summary": True, "steps": 5}) is None
    assert scalars_of({"loss": 1.0}) is None


def test_run_params_are_flat_scalars_with_the_model_by_name():
    params = run_params(RUN)
    assert params["job.model"] == "tiny"
    assert params["job.global_batch"] == 8
    assert params["optim.schedule"] == "cosine"
    assert "checkpoint.dir" not in params  # None values are left out
    assert all(not isinstance(value, (dict, list)) for value in params.values())


def test_a_failed_run_or_write_closes_the_sinks_as_failed(tmp_path):
    sink = RecordingSink()
    MetricsLog(JsonlLog(None), [sink]).close(failed=True)
    assert sink.closed is True
    sink = RecordingSink()
    log = MetricsLog(JsonlLog(str(tmp_path / "run.jsonl")), [sink])
    log.failure = "could not write the metrics log (No space left on device)"
    log.close()
    assert sink.closed is True


def test_mlflow_names_keep_what_mlflow_takes_and_replace_the_rest():
    assert mlflow_name("data_tokens/web-2.v1 a:b") == "data_tokens/web-2.v1 a:b"
    assert mlflow_name("data_tokens/c4(en)+x") == "data_tokens/c4_en__x"
    assert mlflow_name("data_tokens/..") == "data_tokens/__"
    assert mlflow_name("data_tokens/.") == "data_tokens/_"


@pytest.mark.parametrize("field, flag, package", [("wandb_project", "--wandb-project", "wandb"),
                                                  ("mlflow_uri", "--mlflow-uri", "mlflow-skinny"),
                                                  ("tensorboard", "--tensorboard", "tensorboard")])
def test_a_missing_package_is_named_with_its_pip_command(monkeypatch, field, flag, package):
    monkeypatch.setitem(sys.modules, package.split("-")[0], None)  # import fails, find_spec finds nothing
    observe = LogConfig(**{field: "x"})
    message = f"{flag} needs the {package} package, which is not installed: pip install {package}"
    with pytest.raises(PlaitError, match=message):
        check_sinks(observe)
    with pytest.raises(PlaitError, match=message):
        open_sinks(observe, RUN)


def test_train_refuses_a_sink_without_its_package_before_launching(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)
    argv = ["train", "--model", "tiny", "--global-batch", "8", "--seq-len", "32", "--device", "cpu", "--dry-run",
            "--wandb-project", "p"]
    assert main(argv) == 2
    assert "pip install wandb" in capsys.readouterr().err


def test_console_line_shows_lr_grad_norm_throughput_mfu_and_memory():
    record = StepRecord(step=0, loss=2.0, lr=3e-4, grad_norm=4.0, step_time_s=0.25, tokens_per_s=4096.0, mfu=0.375)
    assert status_text(record, 1.5 * 2**30) == ("loss 2.0000 | lr 3.00e-04 | gnorm 4.00 | 4,096 tok/s | 250 ms | "
                                                "mfu 37.5% | mem 1.50 GiB")
    record.mfu = None  # CPU: no MFU
    assert status_text(record) == "loss 2.0000 | lr 3.00e-04 | gnorm 4.00 | 4,096 tok/s | 250 ms"
