"""Metrics sinks beside the JSONL log: TensorBoard, Weights & Biases and MLflow (rank 0 only).

A sink is one small class with ``log(values, step)`` (the numeric fields of one JSONL line, by
their JSONL names: ``loss``, ``lr``, ``grad_norm``, ``step_time_s``, ``tokens_per_s``, ``mfu``,
``eval_loss``, ...) and ``close()``; adding a sink is adding a class and a line in ``open_sinks``.
``MetricsLog`` puts the JSONL log and the sinks behind the one ``write(record)`` the training
loop calls: every line goes to the JSONL file; lines with a ``step`` (step and eval lines, not
events nor the summary) go to the sinks as scalars at that step.

The sinks' packages are optional (the ``metrics`` extra: tensorboard, wandb, mlflow-skinny):
``check_sinks`` (before launching) and the sink classes raise a PlaitError naming the pip command
when one is missing, and a W&B or MLflow run that cannot start (no API key, a URI the installed
MLflow cannot store to) is one PlaitError line. Nothing here imports torch, tensorboard, wandb or
mlflow at import time.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
from typing import Protocol
from urllib.parse import urlparse

from plait.errors import PlaitError
from plait.run.config import LogConfig
from plait.run.observe.jsonl import JsonlLog

# flag -> (module to import, pip package) of each sink
SINK_PACKAGES = {"--tensorboard": ("tensorboard", "tensorboard"), "--wandb-project": ("wandb", "wandb"),
                 "--mlflow-uri": ("mlflow", "mlflow-skinny")}
NOT_SCALARS = ("step", "time")  # numeric JSONL fields that are not metrics


class MetricsSink(Protocol):
    """Where rank 0's scalars go besides the JSONL file."""

    def log(self, values: dict[str, float], step: int) -> None:
        """Record ``values`` (metric name -> value) at optimizer step ``step``."""

    def close(self, failed: bool = False) -> None:
        """Flush and release what the sink holds; ``failed``: the run ended on an error."""


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

    def close(self, failed: bool = False) -> None:
        self.writer.close()


class WandbSink:
    """A Weights & Biases run in ``project`` (``WANDB_MODE=offline`` writes it locally, under ./wandb
    or ``WANDB_DIR``, for ``wandb sync``), with the run's settings as its config.

    ``run_id``: the W&B run of the checkpoint a resumed run starts from (its manifest's ``sinks``);
    the run goes on in it (``resume="allow"``; offline, the new directory has the same id and
    ``wandb sync`` joins the two). Steps W&B already has (a resumed run re-runs the steps after its
    checkpoint, with the same values) are not sent again."""

    ID_KEY = "wandb"

    def __init__(self, project: str, run: dict, run_id: str | None = None):
        wandb = _import("--wandb-project")
        again = {"id": run_id, "resume": "allow", "allow_val_change": True} if run_id else {}
        try:
            self.run = wandb.init(project=project, config=run_params(run), **again)
        except importlib.import_module("wandb.errors").Error as exc:  # no API key, no server: one line, with the offline way out
            raise PlaitError(f"--wandb-project {project}: W&B could not start the run ({_first_line(exc)}); "
                             "WANDB_MODE=offline logs it locally") from None
        self.run_id = self.run.id
        self.next_step = int(getattr(self.run, "step", 0) or 0) if run_id else 0  # W&B's next step (0 offline)

    def log(self, values: dict[str, float], step: int) -> None:
        if step >= self.next_step:
            self.run.log(values, step=step)

    def close(self, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else 0)


def is_file_store(uri: str) -> bool:
    """Whether MLflow tracking URI ``uri`` is a local directory (a path or a ``file:`` URI)."""
    return urlparse(uri).scheme in ("", "file")


def mlflow_name(name: str) -> str:
    """``name`` as an MLflow metric name: a character MLflow refuses (it takes letters, digits,
    ``_ - . / : `` and spaces) becomes ``_``, and so does a path part that is only dots, as in
    ``data_tokens/NAME`` of a data source named from a file like ``c4(en).tok``."""
    parts = re.sub(r"[^/\w.\- :]", "_", name).split("/")
    return "/".join(part if part.strip(".") else "_" * max(1, len(part)) for part in parts)


class MlflowSink:
    """An MLflow run at tracking URI ``uri``, with the run's settings as its parameters. A directory
    (a path or ``file:`` URI) is MLflow's file store, which MLflow 3 keeps only behind
    ``MLFLOW_ALLOW_FILE_STORE=true``: set here unless the environment says otherwise."""

    ID_KEY = "mlflow"

    def __init__(self, uri: str, run: dict, run_id: str | None = None):
        """``run_id``: the MLflow run of the checkpoint a resumed run starts from; it goes on in that
        run when the store at ``uri`` has it (else in a new one), logs the settings it did not have
        (a changed one, e.g. a new layout, as a ``resumed.NAME`` tag: MLflow keeps a parameter's first
        value) and skips the steps the run already has."""
        mlflow = self.mlflow = _import("--mlflow-uri")
        errors = importlib.import_module("mlflow.exceptions").MlflowException
        if is_file_store(uri):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.last_step = -1
        try:
            mlflow.set_tracking_uri(uri)
            started = None
            if run_id:
                try:
                    started = mlflow.start_run(run_id=run_id)
                except errors:  # not in this store (another --mlflow-uri): a new run
                    started = None
            self.run_id = (started or mlflow.start_run()).info.run_id
        except errors as exc:  # a URI the installed MLflow cannot store to
            raise PlaitError(f"--mlflow-uri {uri}: MLflow could not start the run ({_first_line(exc)})") from None
        try:
            params, had = run_params(run), {}
            if started is not None:
                client = importlib.import_module("mlflow.tracking").MlflowClient(uri)
                data = client.get_run(self.run_id).data
                had = data.params
                self.last_step = max((m.step for name in data.metrics
                                      for m in client.get_metric_history(self.run_id, name)), default=-1)
            mlflow.log_params({name: value for name, value in params.items() if name not in had})
            changed = {f"resumed.{name}": value for name, value in params.items()
                       if name in had and had[name] != str(value)}
            if changed:
                mlflow.set_tags(changed)
        except BaseException:
            mlflow.end_run(status="FAILED")
            raise

    def log(self, values: dict[str, float], step: int) -> None:
        if step > self.last_step:
            self.mlflow.log_metrics({mlflow_name(name): value for name, value in values.items()}, step=step)

    def close(self, failed: bool = False) -> None:
        self.mlflow.end_run(status="FAILED" if failed else "FINISHED")


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "message", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def open_sinks(observe: LogConfig, run: dict, purge_step: int | None = None,
               resume_ids: dict[str, str] | None = None) -> list[MetricsSink]:
    """The sinks ``observe`` asks for (call on rank 0 only); ``run`` is ``RunConfig.to_dict()``;
    ``purge_step``: a resumed run's first step (``TensorBoardSink``); ``resume_ids``: the W&B and
    MLflow run ids saved with the checkpoint it starts from (``MetricsLog.sink_ids``)."""
    resume_ids = resume_ids or {}
    sinks: list[MetricsSink] = []
    try:
        if observe.tensorboard:
            sinks.append(TensorBoardSink(observe.tensorboard, purge_step=purge_step))
        if observe.wandb_project:
            sinks.append(WandbSink(observe.wandb_project, run, resume_ids.get(WandbSink.ID_KEY)))
        if observe.mlflow_uri:
            sinks.append(MlflowSink(observe.mlflow_uri, run, resume_ids.get(MlflowSink.ID_KEY)))
    except BaseException:
        for sink in sinks:
            sink.close(failed=True)
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

    def sink_ids(self) -> dict[str, str]:
        """``{"wandb": id, "mlflow": id}`` of the runs the sinks write to (kept in each checkpoint's
        manifest, so that a resumed run goes on in the same runs)."""
        return {sink.ID_KEY: sink.run_id for sink in self.sinks if getattr(sink, "run_id", None)}

    def close(self, failed: bool = False) -> None:
        """Close the log and the sinks; ``failed`` (the run ended on an error), or a write that
        failed, marks the W&B and MLflow runs as failed."""
        try:
            self.jsonl.close()
        except OSError as exc:  # the last buffered bytes: only when nothing failed before
            self.failure = self.failure or f"could not write the metrics log {self.jsonl.path} ({exc.strerror or exc})"
        sinks, self.sinks = self.sinks, []
        for sink in sinks:
            sink.close(failed=failed or self.failure is not None)
