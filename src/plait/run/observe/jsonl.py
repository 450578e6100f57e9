"""The metrics JSONL file of ``plait train --log``: its records, the writer and the one reader. No torch.

One JSON object per line (rank 0 writes them):

* the format line, first in a file the run creates: ``{"format": "plait-metrics/1"}`` (``HEADER``;
  named as plait's other files are: ``plait-plan/1``, ``plait-calibration/1``); logs written before
  it existed have none and read the same;
* step records (``plait.run.metrics.StepRecord.to_dict``): ``step`` (optimizer steps counted from 1),
  ``loss``, ``lr``, ``grad_norm``, ``step_time_s`` (seconds), ``tokens_per_s``, ``mfu`` (0..1 or
  null), ``time`` (Unix seconds), and ``"profiled": true`` on a step run under the memory profiler;
  an MoE model's records add its routers' health (``plait.run.observe.router``, per step over the
  MoE layers; a pair is a token routed to one of its top-k experts): ``moe_tokens_per_expert_min``
  / ``_max`` (pairs of the least / most loaded expert of any layer), ``moe_tokens_per_expert_cv``
  (std / mean of the pairs per expert, averaged over the layers) and ``_cv_max`` (worst layer),
  ``moe_dropped_pairs`` and ``moe_dropped_frac`` (over capacity; 0 when dropless),
  ``moe_aux_loss`` (Σ over layers of the mean over micro-batches, coefficient included) and, for
  the sigmoid router, ``moe_bias_spread`` (max - min of the balancing bias, largest layer);
* eval records: ``step``, ``eval_loss`` (mean per token), ``eval_tokens``, ``eval_s`` (seconds);
* events: ``event`` (``resume``, ``checkpoint``, ``init_from``, ``replayed``, ...) with their fields;
* the closing summary (``plait.run.metrics.RunSummary.to_dict``): ``"summary": true`` and the run's
  steady-state figures.

A resumed run appends to the same file (``JsonlLog(append=True, resume_step=N)``). ``read_log`` is
how every reader (``plait report --train-log``, ``plait sweep``'s timing and outcome) reads it: a
line that is not a JSON object (one cut short by a killed run) is skipped.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from plait.atomic import atomic_output
from plait.errors import PlaitError

FORMAT = "plait-metrics/1"
HEADER = {"format": FORMAT}


def is_header(record: dict) -> bool:
    """Whether ``record`` is a format line (of any format or version)."""
    return "format" in record and not any(key in record for key in ("step", "event", "summary"))


def is_summary(record: dict) -> bool:
    """Whether ``record`` is the closing summary line."""
    return bool(record.get("summary"))


def step_of(record: dict) -> int | None:
    """The ``step`` of a record that has an integer one (step, eval and some event records), else None."""
    step = record.get("step")
    return None if isinstance(step, bool) or not isinstance(step, int) else step


def _check_header(record: dict, path: Path) -> None:
    if record["format"] != FORMAT:
        raise PlaitError(f"{path}: not a plait metrics log this plait reads (format {record['format']!r}, "
                         f"expected {FORMAT!r})")


def read_log(path: str | Path) -> list[dict]:
    """The records of a metrics JSONL file, in file order, without the format line; lines that are not
    a JSON object are skipped. OSError and UnicodeDecodeError propagate (callers word them); a format
    line of another format (or a later version) is a PlaitError."""
    path = Path(path)
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a killed run
        if not isinstance(record, dict):
            continue
        if is_header(record):
            _check_header(record, path)
            continue
        records.append(record)
    return records


def last_summary(records: list[dict]) -> dict | None:
    """The last summary record, or None (a run that did not finish)."""
    return next((record for record in reversed(records) if is_summary(record)), None)


class JsonlLog:
    """Appends one JSON object per line; a no-op without a path. A file it creates (or finds empty)
    starts with the format line (``HEADER``), written with the first record (so that a write error,
    a full disk, comes from ``write`` as every other one does).

    ``resume_step`` (a resumed run appending, ``steps done`` at its start): the lines of the steps
    after it - written before a kill, and about to be re-run - move out of the way, into one
    ``{"event": "replayed", "after_step": N, "lines": [...]}`` line, so that every step appears once
    and nothing written before is lost (a line cut short by the kill is kept as ``{"raw": text}``).
    """

    def __init__(self, path: str | None, append: bool = False, resume_step: int | None = None):
        self.handle = None
        self.path = path
        self.header_due = False
        if path:
            try:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                replayed = _set_aside_replayed(Path(path), resume_step) if append and resume_step is not None else []
                self.handle = open(path, "a" if append else "w", encoding="utf-8")  # noqa: SIM115 - closed by close()
                self.header_due = self.handle.tell() == 0 if self.handle.seekable() else not append
            except OSError as exc:
                raise PlaitError(f"cannot open the metrics log {path} ({exc.strerror or exc})") from None
            if replayed:
                self.write({"event": "replayed", "after_step": resume_step, "lines": replayed, "time": time.time()})

    def write(self, record: dict) -> None:
        if self.handle:
            if self.header_due:
                self.header_due = False
                self.handle.write(json.dumps(HEADER) + "\n")
            self.handle.write(json.dumps(record) + "\n")
            self.handle.flush()

    def close(self) -> None:
        if self.handle:
            self.handle.close()
            self.handle = None


def _set_aside_replayed(path: Path, resume_step: int) -> list[dict]:
    """Rewrite the regular file ``path`` without the lines of steps after ``resume_step`` (and a last
    line cut short); returns them. Anything else (a device, a FIFO, no file) is left alone."""
    if not path.is_file():
        return []
    kept, replayed = [], []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
    for number, line in enumerate(lines):
        try:
            record = json.loads(line)
        except ValueError:
            if number == len(lines) - 1 and not line.endswith("\n"):
                replayed.append({"raw": line})  # cut short by the kill: the next line would join it
            else:
                kept.append(line)
            continue
        step = step_of(record) if isinstance(record, dict) and not is_summary(record) else None
        if step is not None and step > resume_step:
            replayed.append(record)
        else:
            kept.append(line)
    if replayed:
        with atomic_output(path, "w", encoding="utf-8") as handle:  # keeps the file's mode
            handle.write("".join(kept))
    return replayed
