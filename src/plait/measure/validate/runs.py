"""Predict published training runs (``shared/data`` CSV schema) and compare with what was reported.

Every comparison is on plait's one MFU basis: model FLOPs (causal attention counted explicitly)
over the dense bf16 peak. The reported side is first turned into tokens/s per GPU, from the most
direct figure the source gives: tokens/s/GPU, else iteration time (global batch · seq / GPUs /
time), else TFLOP/s/GPU divided by the source's own FLOPs per token (Narayanan et al. 2021,
Eq. 3, which counts the recompute forward and the full attention square), else MFU/HFU times the
peak over the source's FLOPs per token (torchtitan 6N + 12·L·h·s; Korthikanti et al. Eq. 7).

Inputs the source omits are completed, never refused (``plait.measure.validate.specs``): data
fields get documented defaults per architecture, layout knobs are searched (the fastest layout that
fits), and each completion is written in the row's notes (``completed: mbs=1, zero=1, ... — fastest
that fits``). Only a row without model dimensions, GPU type, GPU count, global batch or sequence
length is ``incomplete``. fp8 rows are predicted with fp8 GEMMs and scored on the bf16 peak too.
"""

from __future__ import annotations

import csv
import json
import statistics
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path

from plait.errors import PlaitError
from plait.measure.validate.moe import megatron_flops_per_token
from plait.measure.validate.cells import num
from plait.measure.validate.specs import IncompleteRow, UnsupportedRow, row_problem, row_specs
from plait.plan.cost import estimate_step
from plait.plan.memory import estimate_memory
from plait.plan.params import DEFAULT_PARAMS, CostParams
from plait.spec.hardware import ClusterSpec, GpuSpec
from plait.spec.layout import JobSpec, Layout
from plait.spec.model import ModelSpec
from plait.spec.units import GIB

__all__ = ["IncompleteRow", "UnsupportedRow", "RunResult", "build_specs", "predict_row", "predict_runs",
           "read_runs", "row_problem", "error_summary", "accuracy_record", "shipped_accuracy"]

REQUIRED_COLUMNS = ("id", "source", "arch", "n_layers", "hidden", "ffn_hidden", "n_heads", "n_kv_heads",
                    "vocab", "seq_len", "gpu_type", "n_gpus", "tp", "pp", "dp", "mbs", "gbs", "zero_stage",
                    "recompute")


@dataclass
class RunResult:
    id: str
    source: str
    status: str  # ok | oom | incomplete: ... | unsupported: ... | invalid: ...
    notes: list[str] = field(default_factory=list)
    predicted_step_time_s: float | None = None
    predicted_mfu: float | None = None
    predicted_tokens_per_s_per_gpu: float | None = None
    predicted_mem_gb: float | None = None
    reported_mfu: float | None = None  # on plait's basis
    reported_tokens_per_s_per_gpu: float | None = None
    reported_mem_gb: float | None = None
    seq_len: int | None = None

    @property
    def complete(self) -> bool:
        return self.status in ("ok", "oom")

    @property
    def mfu_error_points(self) -> float | None:
        if self.predicted_mfu is None or self.reported_mfu is None:
            return None
        return 100.0 * (self.predicted_mfu - self.reported_mfu)


def read_runs(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        raise PlaitError(f"runs file {path} does not exist")
    try:
        with path.open(newline="") as handle:
            reader = csv.DictReader(handle)
            rows = list(reader)
            columns = reader.fieldnames or []
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise PlaitError(f"{path}: not a readable CSV file ({exc})") from None
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:
        raise PlaitError(f"{path}: missing columns {', '.join(missing)} (schema: shared/data/README.md)")
    if not rows:
        raise PlaitError(f"{path}: no rows")
    return rows


def _source_flops_per_token(row: dict, model: ModelSpec, seq_len: int) -> tuple[float, str]:
    """FLOPs per token behind a source's TFLOP/s or MFU figures."""
    source = row["source"].lower()
    l, h, v, s = model.n_layers, model.hidden, model.vocab, seq_len
    if model.moe is not None:  # the MoE sources' TFLOP/s are Megatron-Core's counter (plait.measure.validate.moe)
        return megatron_flops_per_token(model, s), "Megatron-Core MoE counter (active experts, causal s/2)"
    if "narayanan" in source:
        return 96 * l * h * h * (1 + s / (6 * h) + v / (16 * l * h)), "Megatron Eq.3 (recompute, full square)"
    if "korthikanti" in source:
        return 72 * l * h * h * (1 + s / (6 * h) + v / (12 * h * l)), "Korthikanti Eq.7 (full square)"
    if "mpt" in row["id"].lower() or "mosaic" in source:
        return 6 * model.total_params() + 12 * l * h * s, "MosaicML (6N incl. embeddings + full square)"
    return model.model_flops_per_token(s, causal=False), "6N + full-square attention"


def build_specs(row: dict, notes: list[str] | None = None) -> tuple[ModelSpec, ClusterSpec, JobSpec, Layout]:
    """The planner's inputs for one published-runs CSV row (``read_runs``): (model, cluster, job, layout).

    What the row omits is completed and noted in ``notes`` (when given). Raises IncompleteRow or
    UnsupportedRow (the reason as message), or PlaitError from a spec constructor.
    """
    specs = row_specs(row, [] if notes is None else notes)
    return specs.model, specs.cluster, specs.job, specs.layout


def _source_peak(row: dict, gpu: GpuSpec, notes: list[str]) -> float:
    """The peak behind a source's MFU/HFU: the GPU's dense bf16 peak, or its fp8 peak when the
    source says it used that (then noted; plait rescores on the bf16 peak)."""
    words = f"{row.get('precision') or ''} {row.get('notes') or ''}".lower()
    if "fp8" in (row.get("precision") or "").lower() and ("fp8 peak" in words or "1979" in words) and gpu.fp8_flops:
        notes.append(f"the source's MFU used the fp8 peak ({gpu.fp8_flops / 1e12:.0f} TFLOP/s); "
                     f"rescored on plait's bf16 peak ({gpu.bf16_flops / 1e12:.0f})")
        return gpu.fp8_flops
    return gpu.bf16_flops


def _reported_tokens(row: dict, model: ModelSpec, seq_len: int, n_gpus: int, notes: list[str],
                     gpu: GpuSpec) -> float | None:
    tokens = num(row, "reported_tokens_per_s_per_gpu")
    if tokens:
        return tokens
    iteration = num(row, "reported_iter_time_s")
    gbs = num(row, "gbs")
    if iteration and gbs:
        return gbs * seq_len / n_gpus / iteration
    flops, convention = _source_flops_per_token(row, model, seq_len)
    tflops = num(row, "reported_tflops_per_gpu")
    if tflops:
        notes.append(f"throughput from TFLOP/s via {convention}")
        return tflops * 1e12 / flops
    for key in ("reported_mfu", "reported_hfu"):
        fraction = num(row, key)
        if fraction:
            peak = _source_peak(row, gpu, notes)
            notes.append(f"throughput from {key} via {convention}")
            return fraction * peak / flops
    return None


def predict_row(row: dict, params: CostParams = DEFAULT_PARAMS) -> RunResult:
    result = RunResult(id=str(row.get("id")), source=str(row.get("source") or ""), status="ok")
    problem = row_problem(row)
    if problem:
        result.status = f"invalid: {problem}"
        return result
    try:
        specs = row_specs(row, result.notes, params)
    except IncompleteRow as exc:
        result.status = f"incomplete: {exc}"
        return result
    except UnsupportedRow as exc:
        result.status = f"unsupported: {exc}"
        return result
    except PlaitError as exc:
        result.status = f"unsupported: {exc}"
        return result
    model, cluster, job, layout, params = specs.model, specs.cluster, specs.job, specs.layout, specs.params
    if specs.stack is not None and specs.stack.params:
        result.notes.append(f"{specs.stack.name} stack: " + ", ".join(
            f"{k}={v:.3g}" for k, v in specs.stack.param_values().items()))
    step = estimate_step(model, cluster, job, layout, params, runtime=specs.runtime)
    memory = estimate_memory(model, cluster, job, layout, params, runtime=specs.runtime)
    if specs.memory_of is not None:
        memory = specs.memory_of(layout, memory)
        result.notes.append("op-level selective checkpointing: memory of every second matmul output kept")
    result.seq_len = job.seq_len
    result.predicted_step_time_s = step.step_time
    result.predicted_mfu = step.mfu
    result.predicted_tokens_per_s_per_gpu = step.tokens_per_s_per_gpu
    result.predicted_mem_gb = memory.total / GIB
    result.reported_mem_gb = num(row, "reported_mem_gb")
    result.notes.append(f"layout {layout}")
    if not memory.fits:
        result.status = "oom"
        result.notes.append(f"predicted {memory.total / GIB:.1f} GiB > {memory.capacity / GIB:.1f} GiB")
    tokens = _reported_tokens(row, model, job.seq_len, cluster.n_gpus, result.notes, cluster.gpu)
    if tokens:
        result.reported_tokens_per_s_per_gpu = tokens
        result.reported_mfu = tokens * model.model_flops_per_token(job.seq_len) / cluster.gpu.bf16_flops
    else:
        result.notes.append("no reported throughput")
    return result


def predict_runs(path: str | Path, params: CostParams = DEFAULT_PARAMS) -> list[RunResult]:
    return [predict_row(row, params) for row in read_runs(path)]


def error_summary(results: list[RunResult]) -> dict:
    """Coverage and MFU error statistics, overall and per source."""
    complete = [r for r in results if r.complete]
    compared = [r for r in complete if r.mfu_error_points is not None]
    by_source: dict[str, list[float]] = defaultdict(list)
    for r in compared:
        by_source[r.source].append(abs(r.mfu_error_points))
    errors = [abs(r.mfu_error_points) for r in compared]

    def stats(values: list[float]) -> dict:
        return {"n": len(values), "median_abs_error": statistics.median(values) if values else None,
                "mean_abs_error": statistics.fmean(values) if values else None,
                "within_4_points": sum(v <= 4 for v in values) / len(values) if values else None}

    return {"rows": len(results), "complete": len(complete), "compared": len(compared),
            "coverage": len(compared) / len(complete) if complete else 0.0,
            "incomplete": sum(r.status.startswith("incomplete") for r in results),
            "unsupported": sum(r.status.startswith("unsupported") for r in results),
            "invalid": sum(r.status.startswith("invalid") for r in results),
            "oom": sum(r.status == "oom" for r in results),
            "overall": stats(errors), "per_source": {s: stats(v) for s, v in sorted(by_source.items())}}


ACCURACY_FILE = Path(__file__).resolve().parents[2] / "data" / "validation.json"
# The published runs plait ships (facts with sources: plait/data/published/README.md and SOURCES_2.md):
# the calibration set, dense and mixture-of-experts, both batches; ``plait validate`` checks them by default.
PUBLISHED_DIR = ACCURACY_FILE.parent / "published"
SHIPPED_RUNS = tuple(PUBLISHED_DIR / name for name in (
    "published_runs_calibration.csv", "published_runs_calibration_2.csv", "published_moe_runs.csv",
    "published_moe_runs_2.csv"))


def accuracy_record(summary: dict) -> dict:
    """The in-sample part of ``error_summary``, rounded as printed (``plait plan`` quotes the held-out
    record instead: ``plait.measure.validate.cross.CrossValidation.record``, shipped as
    ``plait/data/validation.json``; tests/measure/test_cross_validation.py checks it is current)."""
    overall = summary["overall"]
    return {"runs_compared": summary["compared"],
            "median_abs_error_points": round(overall["median_abs_error"], 1),
            "within_4_points": round(overall["within_4_points"], 2)}


def shipped_accuracy() -> dict | None:
    """``accuracy_record`` of the default cost model, as shipped (None when the file is missing)."""
    try:
        return json.loads(ACCURACY_FILE.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
