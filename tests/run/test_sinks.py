"""Metrics sinks (plait.run.observe.sinks): which JSONL lines reach them, the contracts of the
W&B and MLflow sinks against fake modules (and the real packages when installed), the missing-
package errors, and the console line."""

from __future__ import annotations

import json
import sys
import types

import pytest

from plait.cli import main
from plait.errors import PlaitError
from plait.run.config import LogConfig, RunConfig, TrainJob
from plait.run.metrics import StepRecord, status_text
from plait.run.observe.jsonl import HEADER, JsonlLog
from plait.run.observe.sinks import MetricsLog, check_sinks, open_sinks, run_params, scalars_of
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
        self.closed = False

    def log(self, values, step):
        self.calls.append((step, values))

    def close(self):
        self.closed = True


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
    assert sink.closed
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


def fake_wandb():
    module = types.ModuleType("wandb")
    module.runs = []

    class Run:
        def __init__(self, project, config):
            self.project, self.config, self.logged, self.finished = project, config, [], False
            module.runs.append(self)

        def log(self, values, step):
            self.logged.append((step, dict(values)))

        def finish(self):
            self.finished = True

    module.init = lambda project, config: Run(project, config)
    return module


def fake_mlflow():
    module = types.ModuleType("mlflow")
    module.calls = []
    for name in ("set_tracking_uri", "start_run", "log_params", "log_metrics", "end_run"):
        setattr(module, name, lambda *args, _name=name, **kwargs: module.calls.append((_name, args, kwargs)))
    return module


def test_wandb_sink_contract(monkeypatch, tmp_path):
    wandb = fake_wandb()
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    log = MetricsLog(JsonlLog(None), open_sinks(LogConfig(wandb_project="plait-test"), RUN))
    log.write(STEP_LINE)
    log.close()
    (run,) = wandb.runs
    assert run.project == "plait-test" and run.config == run_params(RUN)
    assert run.logged == [(3, scalars_of(STEP_LINE)[1])]
    assert run.finished


def test_mlflow_sink_contract(monkeypatch):
    mlflow = fake_mlflow()
    monkeypatch.setitem(sys.modules, "mlflow", mlflow)
    log = MetricsLog(JsonlLog(None), open_sinks(LogConfig(mlflow_uri="file:///tmp/mlruns"), RUN))
    log.write(EVAL_LINE)
    log.close()
    assert [call[0] for call in mlflow.calls] == ["set_tracking_uri", "start_run", "log_params", "log_metrics",
                                                  "end_run"]
    assert mlflow.calls[0][1] == ("file:///tmp/mlruns",)
    assert mlflow.calls[2][1] == (run_params(RUN),)
    assert mlflow.calls[3] == ("log_metrics", (scalars_of(EVAL_LINE)[1],), {"step": 4})


@pytest.mark.parametrize("field, flag, package", [("wandb_project", "--wandb-project", "wandb"),
                                                  ("mlflow_uri", "--mlflow-uri", "mlflow"),
                                                  ("tensorboard", "--tensorboard", "tensorboard")])
def test_a_missing_package_is_named_with_its_pip_command(monkeypatch, field, flag, package):
    monkeypatch.setitem(sys.modules, package, None)  # import fails, find_spec finds nothing
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


def test_real_wandb_offline(monkeypatch, tmp_path):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    log = MetricsLog(JsonlLog(None), open_sinks(LogConfig(wandb_project="plait-test"), RUN))
    log.write(STEP_LINE)
    log.close()
    assert list(tmp_path.rglob("*.wandb")), "no offline run file written"


def test_real_mlflow_file_store(tmp_path):
    pytest.importorskip("mlflow")
    uri = (tmp_path / "mlruns").as_uri()
    log = MetricsLog(JsonlLog(None), open_sinks(LogConfig(mlflow_uri=uri), RUN))
    log.write(EVAL_LINE)
    log.close()
    import mlflow

    runs = mlflow.search_runs(search_all_experiments=True)
    assert runs["metrics.eval_loss"].tolist() == [2.25]
