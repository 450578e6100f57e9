"""The W&B and MLflow sinks with the real packages, offline: one ``plait train`` of the tiny model
(CPU, one process, 3 steps, an evaluation after steps 2 and 3) logs to a W&B offline run
(``WANDB_MODE=offline``, read back from its ``.wandb`` file) and to an MLflow file store (read back
with ``MlflowClient``), and both hold what the JSONL log of the same run holds: every scalar of
every step and eval line, at its step, bit for bit. Then the cases the training run does not show:
metric names MLflow refuses, runs that end on an error, runs that cannot start.

Each test skips when its package (``pip install wandb`` / ``pip install mlflow-skinny``, both in the
``metrics`` extra) is missing; tests/run/test_sinks.py covers the missing-package messages."""

from __future__ import annotations

import importlib.util
import json
import math
import struct
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

import eval_tasks

from plait.cli import main
from plait.errors import PlaitError
from plait.run.config import LogConfig, RunConfig, TrainJob
from plait.run.observe.jsonl import JsonlLog
from plait.run.observe.sinks import MetricsLog, open_sinks, run_params, scalars_of
from plait.spec.layout import Layout
from plait.spec.models import get_model

HAVE = {name: importlib.util.find_spec(name) is not None for name in ("wandb", "mlflow")}
RUN = RunConfig(job=TrainJob(model=get_model("tiny"), layout=Layout.parse("dp=1"), global_batch=8,
                             seq_len=32)).to_dict()


def offline_env(monkeypatch, root: Path) -> None:
    """W&B offline under ``root``, quiet; MLflow's file store without MLflow 3's opt-in (the sink sets it)."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(root))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "unset")  # so that teardown restores what was there
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")
    for name in ("WANDB_PROJECT", "WANDB_RUN_ID", "WANDB_RESUME", "MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID",
                 "MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One CLI training run logging to JSONL and to every installed sink; its paths and JSONL lines."""
    if not any(HAVE.values()):
        pytest.skip("neither wandb nor mlflow is installed (pip install wandb mlflow-skinny)")
    root = tmp_path_factory.mktemp("sinks")
    eval_file = eval_tasks.write_token_file(root / "held_out.bin", 4000, 512, seed=7)
    mlruns = (root / "mlruns").as_uri()
    args = ["train", "--model", "tiny", "--global-batch", "8", "--seq-len", "32", "--steps", "3", "--device", "cpu",
            "--log", str(root / "run.jsonl"), "--eval-data", eval_file, "--eval-every", "2", "--eval-steps", "1"]
    args += ["--wandb-project", "plait-test"] if HAVE["wandb"] else []
    args += ["--mlflow-uri", mlruns] if HAVE["mlflow"] else []
    with pytest.MonkeyPatch.context() as monkeypatch:
        offline_env(monkeypatch, root)
        assert main(args) == 0
    lines = [json.loads(line) for line in (root / "run.jsonl").read_text().splitlines()]
    return {"root": root, "mlruns": mlruns, "lines": lines}


def jsonl_scalars(lines: list[dict]) -> dict[int, dict[str, float]]:
    """step -> every scalar the JSONL step and eval lines hold at that step (what the sinks get)."""
    by_step: dict[int, dict[str, float]] = {}
    for line in lines:
        scalars = scalars_of(line)
        if scalars is not None:
            by_step.setdefault(scalars[0], {}).update(scalars[1])
    return by_step


def wandb_records(run_file: Path) -> list:
    """The protobuf records of a W&B ``.wandb`` file: after a 7-byte header (``:W&B``, magic, version),
    32 KiB blocks of chunks, each a 7-byte header (crc32c, little-endian length, type: 1 whole,
    2 first, 3 middle, 4 last) and its bytes; a block's tail under 7 bytes is padding."""
    from wandb.proto import wandb_internal_pb2

    data, block = run_file.read_bytes(), 32768
    assert data[:4] == b":W&B", "not a W&B run file"
    records, pending, pos = [], b"", 7
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:  # zeros to the end of the block
            pos += block - pos % block
            continue
        if pos + 7 + length > len(data):  # a chunk the service has not finished writing
            break
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def wandb_run(root: Path, patience_s: float = 120.0) -> list:
    """The records of the one offline run under ``root``, once its exit record is in the file.

    ``run.finish()`` returns when the service has handled the exit, but the service writes and closes
    the ``.wandb`` file on its own afterwards: read at once on a loaded machine, the file can still
    lack its last block (a run's only history row is written at exit). So this reads until the exit
    record is there, up to ``patience_s`` seconds, and then returns what the file holds."""
    (run_file,) = root.glob("wandb/offline-run-*/run-*.wandb")
    return finished_records(run_file, patience_s)


def finished_records(run_file: Path, patience_s: float = 120.0) -> list:
    """``wandb_records(run_file)`` once the file holds its exit record (up to ``patience_s`` s; ``wandb_run``)."""
    deadline = time.monotonic() + patience_s
    while True:
        records = wandb_records(run_file)
        if of_type(records, "exit") or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


def of_type(records: list, kind: str) -> list:
    return [getattr(record, kind) for record in records if record.WhichOneof("record_type") == kind]


def values_of(items) -> dict:
    """A history row's or config's items, name -> value, without W&B's own (``_step``, ``_runtime``...)."""
    values = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}
    return {name: value for name, value in values.items() if not name.startswith("_")}


def test_wandb_offline_run_holds_the_jsonl_scalars(trained):
    pytest.importorskip("wandb")
    records = wandb_run(trained["root"])
    history = {row.step.num: values_of(row.item) for row in of_type(records, "history")}
    expected = jsonl_scalars(trained["lines"])
    assert sorted(expected) == [1, 2, 3] and "eval_loss" in expected[2] and "eval_loss" in expected[3]
    assert history == expected
    (run,) = of_type(records, "run")
    config = values_of(run.config.update)
    assert run.project == "plait-test"
    assert config["job.model"] == "tiny" and config["job.steps"] == 3 and config["eval.every"] == 2
    assert [record.exit_code for record in of_type(records, "exit")] == [0]


def test_mlflow_file_store_holds_the_jsonl_scalars(trained, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # the sink set it in the worker, not here
    client = MlflowClient(trained["mlruns"])
    (run,) = client.search_runs(experiment_ids=["0"])
    expected = jsonl_scalars(trained["lines"])
    names = sorted({name for values in expected.values() for name in values})
    assert sorted(run.data.metrics) == names
    for name in names:
        history = sorted((metric.step, metric.value) for metric in client.get_metric_history(run.info.run_id, name))
        assert history == [(step, values[name]) for step, values in sorted(expected.items()) if name in values]
    assert run.info.status == "FINISHED"
    assert run.data.params["job.model"] == "tiny" and run.data.params["job.steps"] == "3"


def test_mlflow_gets_names_it_refuses_made_valid_and_a_failed_run_so_marked(monkeypatch, tmp_path):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    offline_env(monkeypatch, tmp_path)
    uri = str(tmp_path / "mlruns")  # a plain directory is a file store too
    log = MetricsLog(JsonlLog(None), open_sinks(LogConfig(mlflow_uri=uri), RUN))
    # a data source named after its file c4(en).tok; a path part of dots
    log.write({"step": 1, "loss": 2.5, "data_tokens/c4(en)": 256, "data_tokens/..": 512})
    log.close(failed=True)
    (run,) = MlflowClient(uri).search_runs(experiment_ids=["0"])
    assert run.data.metrics == {"loss": 2.5, "data_tokens/c4_en_": 256.0, "data_tokens/__": 512.0}
    assert run.info.status == "FAILED"


def test_mlflow_uri_it_cannot_store_to_is_one_line(monkeypatch, tmp_path):
    pytest.importorskip("mlflow")
    offline_env(monkeypatch, tmp_path)
    with pytest.raises(PlaitError, match=r"^--mlflow-uri nosuch://x: MLflow could not start the run \([^\n]+\)$"):
        open_sinks(LogConfig(mlflow_uri="nosuch://x"), RUN)


def test_wandb_run_ending_on_an_error_exits_1(monkeypatch, tmp_path):
    pytest.importorskip("wandb")
    offline_env(monkeypatch, tmp_path)
    log = MetricsLog(JsonlLog(None), open_sinks(LogConfig(wandb_project="plait-test"), RUN))
    log.write({"step": 1, "loss": float("nan"), "lr": 1e-4})
    log.close(failed=True)
    records = wandb_run(tmp_path)
    (row,) = of_type(records, "history")
    values = values_of(row.item)
    assert row.step.num == 1 and math.isnan(values.pop("loss")) and values == {"lr": 1e-4}  # a NaN loss is kept
    assert [record.exit_code for record in of_type(records, "exit")] == [1]
    (run,) = of_type(records, "run")
    assert values_of(run.config.update) == run_params(RUN)


def test_wandb_run_that_cannot_start_is_one_line(monkeypatch, tmp_path):
    pytest.importorskip("wandb")
    offline_env(monkeypatch, tmp_path)
    with pytest.raises(PlaitError, match=r"^--wandb-project x+: W&B could not start the run \(Invalid project name "
                                         r"[^\n]+\); WANDB_MODE=offline logs it locally$"):
        open_sinks(LogConfig(wandb_project="x" * 200), RUN)


def test_a_resumed_run_goes_on_in_the_same_wandb_and_mlflow_runs(monkeypatch, tmp_path):
    """Three steps with a checkpoint after step 2 and at the end; the step-3 checkpoint is removed (as if
    the job had died before writing it), and the same command with --steps 4 resumes from step 2:
    it re-runs step 3 and runs step 4. MLflow: one run, every step's loss once, at its value from the
    JSONL log; W&B: the second offline run directory carries the first one's run id (``wandb sync``
    joins them) and the steps it ran."""
    if not all(HAVE.values()):
        pytest.skip("needs both wandb and mlflow (pip install wandb mlflow-skinny)")
    import shutil

    from mlflow.tracking import MlflowClient

    offline_env(monkeypatch, tmp_path)
    mlruns, ckpt, jsonl = str(tmp_path / "mlruns"), tmp_path / "ck", tmp_path / "run.jsonl"
    args = ["train", "--model", "tiny", "--global-batch", "8", "--seq-len", "32", "--device", "cpu",
            "--log", str(jsonl), "--checkpoint-dir", str(ckpt), "--checkpoint-every", "2",
            "--wandb-project", "plait-test", "--mlflow-uri", mlruns]
    assert main([*args, "--steps", "3"]) == 0
    manifest = json.loads((ckpt / "step_00000002" / "manifest.json").read_text())
    assert set(manifest["sinks"]) == {"wandb", "mlflow"}
    shutil.rmtree(ckpt / "step_00000003")
    assert main([*args, "--steps", "4"]) == 0
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(mlruns)
    (run,) = client.search_runs(experiment_ids=["0"])
    assert run.info.run_id == manifest["sinks"]["mlflow"] and run.info.status == "FINISHED"
    losses = {line["step"]: line["loss"] for line in map(json.loads, jsonl.read_text().splitlines())
              if "loss" in line and "step" in line and not line.get("event")}
    history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss"))
    assert history == sorted(losses.items()) and [step for step, _ in history] == [1, 2, 3, 4]
    run_dirs = sorted((tmp_path / "wandb").glob("offline-run-*"))
    assert len(run_dirs) == 2 and all(d.name.endswith(manifest["sinks"]["wandb"]) for d in run_dirs)
    (second,) = run_dirs[1].glob("run-*.wandb")
    records = finished_records(second)
    assert sorted(row.step.num for row in of_type(records, "history")) == [3, 4]
    assert [record.exit_code for record in of_type(records, "exit")] == [0]


def test_mlflow_resumed_with_another_setting_keeps_the_first_as_a_parameter_and_tags_the_new(monkeypatch, tmp_path):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from plait.run.observe.sinks import MlflowSink

    offline_env(monkeypatch, tmp_path)
    uri = str(tmp_path / "mlruns")
    first = MlflowSink(uri, RUN)
    first.log({"loss": 3.0}, 1)
    first.log({"loss": 2.0}, 2)
    first.close(failed=True)
    moved = json.loads(json.dumps(RUN))
    moved["job"]["layout"] = "dp=2,tp=1,pp=1,cp=1,mbs=1"
    again = MlflowSink(uri, moved, run_id=first.run_id)
    assert again.run_id == first.run_id and again.last_step == 2
    again.log({"loss": 2.5}, 2)  # a replayed step: MLflow has it already
    again.log({"loss": 1.0}, 3)
    again.close()
    run = MlflowClient(uri).get_run(first.run_id)
    assert run.data.params["job.layout"] == RUN["job"]["layout"]
    assert run.data.tags["resumed.job.layout"] == "dp=2,tp=1,pp=1,cp=1,mbs=1"
    history = sorted((m.step, m.value) for m in MlflowClient(uri).get_metric_history(first.run_id, "loss"))
    assert history == [(1, 3.0), (2, 2.0), (3, 1.0)]
    lost = MlflowSink(uri, RUN, run_id="0123456789abcdef0123456789abcdef")  # not in this store: a new run
    assert lost.run_id != first.run_id and lost.last_step == -1
    lost.close()
