"""Metrics sinks beside the JSONL log: TensorBoard, Weights & Biases and MLflow (rank 0 only).

A sink is one small class with ``log(values, step)`` (the numeric fields of one JSONL line, by
their JSONL names: ``loss``, ``lr``, ``grad_norm``, ``step_time_s``, ``tokens_per_s``, ``mfu``,
``eval_loss``, ...) and ``close()``; adding a sink is adding a class and a line in ``open_sinks``.
``MetricsLog`` puts the JSONL log and the sinks behind the one ``write(record)`` the training
loop calls: every line goes to the JSONL file; lines with a ``step`` (step and eval lines, not
events nor the summary) go to the sinks as scalars at that step.

The sinks' packages are optional: ``check_sinks`` (before launching) and the sink classes raise
a PlaitError naming the pip command when one is missing. Nothing here imports torch, tensorboard,
wandb or mlflow at import time.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from typing import Protocol

from plait.errors import PlaitError
from plait.run.config import LogConfig
from plait.run.observe.jsonl import JsonlLog

# flag -> (module to import, pip package) of each sink
SINK_PACKAGES = {"--tensorboard": ("tensorboard", "tensorboard"), "--wandb-project": ("wandb", "wandb"),
                 "--mlflow-uri": ("mlflow", "mlflow")}
NOT_SCALARS = ("step", "time")  # numeric JSONL fields that are not metrics


class MetricsSink(Protocol):
    """Where rank 0's scalars go besides the JSONL file."""

    def log(self, values: dict[str, float], step: int) -> None:
        """Record ``values`` (metric name -> value) at optimizer step ``step``."""

    def close(self) -> None:
        """Flush and release what the sink holds."""


def _missing(flag: str) -> PlaitError:
    module, package = SINK_PACKAGES[flag]
    return PlaitError(f"{flag} needs the {package} package, which is not installed: pip install {package}")


def _import(flag: str):
    module, _ = SINK_PACKAGES[flag]
    try:
        return importlib.import_module(module)
    except ImportError:
        raise _missing(flag) from None


def _flags_given(observe: LogConfig) -> list[str]:
    given = {"--tensorboard": observe.tensorboard, "--wandb-project": observe.wandb_project,
             "--mlflow-uri": observe.mlflow_uri}
    return [flag for flag, value in given.items() if value]


def check_sinks(observe: LogConfig) -> None:
    """Refuse (PlaitError with the pip command) a sink whose package is not installed; imports nothing."""
    for flag in _flags_given(observe):
        if importlib.util.find_spec(SINK_PACKAGES[flag][0]) is None:
            raise _missing(flag)


def run_params(run: dict) -> dict[str, object]:
    """The run's settings as flat ``section.name`` scalars (the model by its name), for sinks that
    record parameters; ``run`` is ``RunConfig.to_dict()``."""
    flat: dict[str, object] = {}
    for section, values in run.items():
        if not isinstance(values, dict):
            continue
        for name, value in values.items():
            if section == "job" and name == "model":
                value = value.get("name") if isinstance(value, dict) else value
            if value is None or isinstance(value, (dict, list)):
                continue
            flat[f"{section}.{name}"] = value
    return flat


class TensorBoardSink:
    """Scalars into a TensorBoard event directory (``torch.utils.tensorboard.SummaryWriter``)."""

    def __init__(self, directory: str, flush_s: int = 10, purge_step: int | None = None):
        """``purge_step``: a resumed run's first step; TensorBoard hides the events of that step and
        later ones from earlier event files (the steps are re-run)."""
        _import("--tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=directory, flush_secs=flush_s, purge_step=purge_step)

    def log(self, values: dict[str, float], step: int) -> None:
        for name, value in values.items():
            self.writer.add_scalar(name, value, step)

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """A Weights & Biases run in ``project`` (``WANDB_MODE=offline`` writes it locally, under ./wandb
    or ``WANDB_DIR``), with the run's settings as its config."""

    def __init__(self, project: str, run: dict):
        wandb = _import("--wandb-project")
        self.run = wandb.init(project=project, config=run_params(run))

    def log(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowSink:
    """An MLflow run at tracking URI ``uri``, with the run's settings as its parameters."""

    def __init__(self, uri: str, run: dict):
        self.mlflow = _import("--mlflow-uri")
        self.mlflow.set_tracking_uri(uri)
        self.mlflow.start_run()
        self.mlflow.log_params(run_params(run))

    def log(self, values: dict[str, float], step: int) -> None:
        self.mlflow.log_metrics(values, step=step)

    def close(self) -> None:
        self.mlflow.end_run()


def open_sinks(observe: LogConfig, run: dict, purge_step: int | None = None) -> list[MetricsSink]:
    """The sinks ``observe`` asks for (call on rank 0 only); ``run`` is ``RunConfig.to_dict()``;
    ``purge_step``: a resumed run's first step (``TensorBoardSink``)."""
    sinks: list[MetricsSink] = []
    try:
        if observe.tensorboard:
            sinks.append(TensorBoardSink(observe.tensorboard, purge_step=purge_step))
        if observe.wandb_project:
            sinks.append(WandbSink(observe.wandb_project, run))
        if observe.mlflow_uri:
            sinks.append(MlflowSink(observe.mlflow_uri, run))
    except BaseException:
        for sink in sinks:
            sink.close()
        raise
    return sinks


def scalars_of(record: dict) -> tuple[int, dict[str, float]] | None:
    """(step, numeric metrics) of a step or eval line; None for events, the summary and lines without a step."""
    if "step" not in record or record.get("event") or record.get("summary"):
        return None
    values = {name: float(value) for name, value in record.items()
              if name not in NOT_SCALARS and isinstance(value, (int, float)) and not isinstance(value, bool)}
    return int(record["step"]), values


class MetricsLog:
    """The JSONL log and the sinks behind one ``write(record)`` (what ``JsonlLog`` offers)."""

    def __init__(self, jsonl: JsonlLog, sinks: list[MetricsSink] | None = None):
        self.jsonl = jsonl
        self.sinks = list(sinks or [])
        self.failure: str | None = None  # why a write failed (a full disk...): nothing is written after it

    def write(self, record: dict) -> None:
        """Write ``record``; an OSError (a full disk, a lost mount) is kept in ``failure``, not raised:
        the training loop then stops after its step and saves a checkpoint first."""
        if self.failure is not None:
            return
        where = f"metrics log {self.jsonl.path}"
        try:
            self.jsonl.write(record)
            scalars = scalars_of(record) if self.sinks else None
            if scalars is not None and scalars[1]:
                step, values = scalars
                for sink in self.sinks:
                    where = f"{type(sink).__name__} metrics"
                    sink.log(values, step)
        except OSError as exc:
            self.failure = f"could not write the {where} ({os.strerror(exc.errno) if exc.errno else exc})"

    def close(self) -> None:
        try:
            self.jsonl.close()
        except OSError as exc:  # the last buffered bytes: only when nothing failed before
            self.failure = self.failure or f"could not write the metrics log {self.jsonl.path} ({exc.strerror or exc})"
        sinks, self.sinks = self.sinks, []
        for sink in sinks:
            sink.close()
