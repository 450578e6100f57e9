"""The sweep CSV: one row per layout, written as each layout finishes, and read back with checks;
the summary JSON beside it is ``summary_path(csv)``.

Columns (units in the names; empty = not known, never guessed):
  layout, compile, status (ok / oom / failed / refused / timeout / invalid), reason,
  planner_rank (1 = the planner's predicted fastest of the swept layouts that pass its rules and
  that it predicts fit in memory; a layout with and without compile is priced and ranked apart; empty
  for a layout predicted not to fit), predicted_fits (1/0: the planner's memory verdict; empty when
  not evaluated),
  predicted_step_time_s, measured_step_time_s, step_time_error,
  predicted_memory_bytes (what the GPU allocator should hand out at the peak: the planner's
  total minus CUDA context, NCCL buffers and fragmentation), measured_memory_bytes,
  memory_kind (cuda_allocated: torch.cuda.max_memory_allocated, max over ranks; host_tensors: a
  CPU run's counted peak of torch tensor storage in its second step, max over ranks, the train
  summary's peak_tensor_bytes (``plait.run.memory.counted``), compared like cuda_allocated with a
  prediction for the CPU of a CPU profile; host_rss: the peak resident memory of a CPU process,
  what older sweeps recorded, not comparable with the prediction), memory_error (cuda_allocated,
  and host_tensors predicted for the CPU: empty when the prediction is for a GPU, column gpu),
  predicted_mfu, measured_mfu, mfu_error, tokens_per_s (measured, all processes),
  model (preset name or model file path), global_batch, seq_len, nproc_per_node, steps, device,
  gpu (the GPU spec the predictions are for; empty when none were recorded), calibration (the
  calibration file's absolute path; empty: default cost parameters), calibration_sha256 (the first
  16 hex digits of its sha256 when the sweep ran), elapsed_s (wall time of the run).
Timing (``plait.measure.sweep.timing``; seconds; empty in CSVs of older sweeps, which still read):
  measured_step_time_s is the median over the layout's runs of each run's median post-warm-up step
  time; warmup_steps (first steps of each run left out), measured_steps (post-warm-up steps of a
  run), repeats (runs that measured it), step_time_min_s / step_time_max_s / step_time_iqr_s (over
  every post-warm-up step of every run), repeat_min_s / repeat_max_s (the fastest and slowest
  run's median), spread_s (one run: step_time_iqr_s; several: repeat_max_s - repeat_min_s), noisy
  (1: spread_s exceeds the gap to the nearest layout in the measured ranking), threads_per_process
  (OMP_NUM_THREADS of a CPU run; empty when the sweep left it to plait train).
Errors are relative: measured / predicted - 1.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
from dataclasses import dataclass
from pathlib import Path

from plait.atomic import atomic_write_text
from plait.errors import PlaitError

STATUSES = ("ok", "oom", "failed", "refused", "timeout", "invalid")
MEMORY_KINDS = ("", "cuda_allocated", "host_tensors", "host_rss")


@dataclass(frozen=True)
class SweepRow:
    """One swept layout: what was predicted, what was measured, how it ended."""

    layout: str
    status: str
    reason: str = ""
    compile: bool = False
    planner_rank: int | None = None
    predicted_fits: bool | None = None
    predicted_step_time_s: float | None = None
    measured_step_time_s: float | None = None
    step_time_error: float | None = None
    predicted_memory_bytes: float | None = None
    measured_memory_bytes: float | None = None
    memory_kind: str = ""
    memory_error: float | None = None
    predicted_mfu: float | None = None
    measured_mfu: float | None = None
    mfu_error: float | None = None
    tokens_per_s: float | None = None
    model: str = ""
    global_batch: int | None = None
    seq_len: int | None = None
    nproc_per_node: int | None = None
    steps: int | None = None
    device: str = ""
    gpu: str = ""
    calibration: str = ""
    calibration_sha256: str = ""
    elapsed_s: float | None = None
    warmup_steps: int | None = None
    measured_steps: int | None = None
    repeats: int | None = None
    step_time_min_s: float | None = None
    step_time_max_s: float | None = None
    step_time_iqr_s: float | None = None
    repeat_min_s: float | None = None
    repeat_max_s: float | None = None
    spread_s: float | None = None
    noisy: bool | None = None
    threads_per_process: int | None = None

    def with_errors(self) -> SweepRow:
        """This row with the relative errors filled from its predicted and measured values."""
        return dataclasses.replace(
            self,
            step_time_error=relative_error(self.measured_step_time_s, self.predicted_step_time_s),
            memory_error=(relative_error(self.measured_memory_bytes, self.predicted_memory_bytes)
                          if self.memory_kind == "cuda_allocated"
                          or (self.memory_kind == "host_tensors" and not self.gpu) else None),
            mfu_error=relative_error(self.measured_mfu, self.predicted_mfu))


COLUMNS = tuple(f.name for f in dataclasses.fields(SweepRow))
_TYPES = {f.name: f.type for f in dataclasses.fields(SweepRow)}


def relative_error(measured: float | None, predicted: float | None) -> float | None:
    if measured is None or not predicted:
        return None
    return measured / predicted - 1


def _format(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


class SweepWriter:
    """Writes the header, then one row per call, flushed at once (a stopped sweep keeps its rows)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.handle = self.path.open("w", newline="", encoding="utf-8")
        except OSError as exc:
            raise PlaitError(f"cannot write the sweep CSV {path}: {exc}") from None
        self.writer = csv.writer(self.handle)
        self.writer.writerow(COLUMNS)
        self.handle.flush()

    def write(self, row: SweepRow) -> None:
        self.writer.writerow([_format(getattr(row, c)) for c in COLUMNS])
        self.handle.flush()

    def close(self) -> None:
        self.handle.close()


def csv_text(rows: list[SweepRow]) -> str:
    """The whole CSV (header and rows) as text."""
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer)
    writer.writerow(COLUMNS)
    for row in rows:
        writer.writerow([_format(getattr(row, c)) for c in COLUMNS])
    return buffer.getvalue()


def rewrite_sweep(path: str | Path, rows: list[SweepRow]) -> None:
    """Replace the sweep CSV at ``path`` by ``rows`` in one atomic write (the final rows of a sweep)."""
    atomic_write_text(path, csv_text(rows), "sweep CSV")


REQUIRED = ("layout", "status", "predicted_step_time_s", "measured_step_time_s")


def _parse(name: str, text: str, where: str):
    kind = _TYPES[name]
    text = text.strip()
    if "float" in kind or "int" in kind:
        if text == "":
            return None
        try:
            value = int(text) if "int" in kind else float(text)
        except ValueError:
            raise PlaitError(f"{where}: {name} {text!r} is not a number") from None
        if not math.isfinite(value) or (value <= 0 and name.startswith(("predicted_", "measured_", "tokens"))):
            raise PlaitError(f"{where}: {name} {text!r} must be a finite{' positive' if value <= 0 else ''} number")
        return value
    if kind.startswith("bool"):
        if text not in ("", "0", "1", "true", "false", "True", "False"):
            raise PlaitError(f"{where}: {name} {text!r} is not 0 or 1")
        if text == "" and "None" in kind:
            return None
        return text in ("1", "true", "True")
    return text


def read_sweep(path: str | Path) -> list[SweepRow]:
    """Rows of a sweep CSV written by ``plait sweep``; one clear PlaitError for a bad file."""
    path = Path(path)
    if not path.is_file():
        raise PlaitError(f"sweep file {path} not found; write it with plait sweep --out {path}")
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            header = reader.fieldnames or []
            missing = [c for c in REQUIRED if c not in header]
            if missing:
                raise PlaitError(f"{path}: not a plait sweep CSV (missing column(s) {', '.join(missing)}; "
                                 "write it with plait sweep)")
            rows = []
            for line, record in enumerate(reader, start=2):
                where = f"{path} line {line}"
                if None in record or any(v is None for v in record.values()):
                    raise PlaitError(f"{where}: {len(header)} columns expected, the row has a different count")
                values = {name: _parse(name, text, where) for name, text in record.items() if name in _TYPES}
                if values["status"] not in STATUSES:
                    raise PlaitError(f"{where}: status {values['status']!r} is not one of {', '.join(STATUSES)}")
                if not values["layout"]:
                    raise PlaitError(f"{where}: empty layout")
                if values.get("memory_kind", "") not in MEMORY_KINDS:
                    raise PlaitError(f"{where}: memory_kind {values['memory_kind']!r} is not one of "
                                     f"{', '.join(k for k in MEMORY_KINDS if k)}")
                rows.append(SweepRow(**values))
    except UnicodeDecodeError:
        raise PlaitError(f"{path}: not a text CSV file") from None
    except csv.Error as exc:
        raise PlaitError(f"{path}: malformed CSV ({exc})") from None
    except OSError as exc:
        raise PlaitError(f"cannot read {path}: {exc}") from None
    if not rows:
        raise PlaitError(f"{path} has no layouts (an empty sweep); run plait sweep with --top K or --grid")
    return rows


def summary_path(csv_path: str | Path) -> Path:
    """Where the summary JSON of a sweep CSV goes: ``sweep.csv`` -> ``sweep.summary.json``."""
    path = Path(csv_path)
    return path.with_name(path.stem + ".summary.json")
