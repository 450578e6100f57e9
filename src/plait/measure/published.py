"""Predict published training runs (``shared/data`` CSV schema) and compare with what was reported.

Every comparison is on plait's one MFU basis: model FLOPs (causal attention counted explicitly)
over the dense bf16 peak. The reported side is first turned into tokens/s per GPU, from the most
direct figure the source gives: tokens/s/GPU, else iteration time (global batch · seq / GPUs /
time), else TFLOP/s/GPU divided by the source's own FLOPs per token (Narayanan et al. 2021,
Eq. 3, which counts the recompute forward and the full attention square), else MFU/HFU times the
peak over the source's FLOPs per token (torchtitan 6N + 12·L·h·s; Korthikanti et al. Eq. 7).

Inputs are never guessed silently: a row missing seq_len, micro-batch or recompute is
``incomplete``; defaults that are applied (8 GPUs per node, a vocabulary taken from the preset
with the same dimensions, FlashAttention when the column is blank) are written in the row's
notes. Two knobs are completed, each stated in the notes as ``completed: ...``: the recompute of
Narayanan et al. 2021's rows (Megatron-LM 2021 and DeepSpeed ZeRO-3 recompute every layer), and
the TP/PP split of a stated model-parallel size (n_gpus / dp) - the fastest split that fits.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from plait.errors import PlaitError
from plait.plan.cost import estimate_step
from plait.plan.memory import estimate_memory
from plait.plan.params import DEFAULT_PARAMS, CostParams
from plait.spec.hardware import GIB, ClusterSpec, cluster_for_gpu, get_gpu
from plait.spec.layout import JobSpec, Layout
from plait.spec.model import ModelSpec
from plait.spec.models import MODELS
from plait.spec.validate import errors_of, validate

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


COUNT_COLUMNS = ("n_layers", "hidden", "ffn_hidden", "n_heads", "n_kv_heads", "vocab", "seq_len", "n_gpus", "tp",
                 "pp", "dp", "mbs", "gbs", "cp", "vpp", "ep", "gpus_per_node")


def row_problem(row: dict) -> str | None:
    """Why a CSV row cannot be read (a short or long row, a count that is not a positive integer), or None."""
    if None in row or None in row.values():
        return f"the row has {'more' if None in row else 'fewer'} fields than the header"
    bad = [key for key in COUNT_COLUMNS if _count_text(row.get(key) or "") is False]
    return f"{bad[0]}={row[bad[0]].strip()!r} must be a positive integer" if bad else None


def _count_text(text: str) -> bool | None:
    """None when blank, else whether ``text`` is a positive integer (``8``, ``8.0``, ``1e3``)."""
    try:
        return float(text) >= 1 and float(text).is_integer() if text.strip() else None
    except ValueError:
        return False


def _num(row: dict, key: str) -> float | None:
    text = (row.get(key) or "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _int(row: dict, key: str) -> int | None:
    value = _num(row, key)
    return int(value) if value is not None else None


def _zero_stage(text: str) -> int | None:
    text = text.strip().lower()
    if text in ("0", "1", "2", "3"):
        return int(text)
    if "full shard" in text or "fsdp" in text:
        return 3
    return None


def _recompute(text: str, n_layers_per_stage: int) -> tuple[str, int] | None:
    """(policy, layers per stage) from the source's words; None when not stated."""
    text = text.strip().lower()
    if not text:
        return None
    if text.startswith("none"):
        return "none", 0
    if text.startswith("full"):
        return "full", 0
    if "per-layer" in text:  # torchtitan: checkpoint every second layer in full
        return "full", max(1, n_layers_per_stage // 2)
    if "op-level" in text:
        # torchtitan op-level SAC recomputes every second matmul and the element-wise work:
        # the same recompute FLOPs as full recomputation of half of the layers
        return "full", max(1, n_layers_per_stage // 2)
    if text.startswith("selective"):
        return "selective", 0
    return None


def _source_flops_per_token(row: dict, model: ModelSpec, seq_len: int) -> tuple[float, str]:
    """FLOPs per token behind a source's TFLOP/s or MFU figures."""
    source = row["source"].lower()
    l, h, v, s = model.n_layers, model.hidden, model.vocab, seq_len
    if "narayanan" in source:
        return 96 * l * h * h * (1 + s / (6 * h) + v / (16 * l * h)), "Megatron Eq.3 (recompute, full square)"
    if "korthikanti" in source:
        return 72 * l * h * h * (1 + s / (6 * h) + v / (12 * h * l)), "Korthikanti Eq.7 (full square)"
    if "mpt" in row["id"].lower() or "mosaic" in source:
        return 6 * model.total_params() + 12 * l * h * s, "MosaicML (6N incl. embeddings + full square)"
    return model.model_flops_per_token(s, causal=False), "6N + full-square attention"


def _model_for_row(row: dict, seq_len: int, notes: list[str]) -> ModelSpec:
    arch = row["arch"].strip().lower()
    dims = dict(n_layers=_int(row, "n_layers"), hidden=_int(row, "hidden"), ffn_hidden=_int(row, "ffn_hidden"),
                n_heads=_int(row, "n_heads"), n_kv_heads=_int(row, "n_kv_heads"))
    vocab = _int(row, "vocab")
    if vocab is None:
        preset = next((m for m in MODELS.values() if m.arch == arch and all(getattr(m, k) == v for k, v in dims.items())), None)
        if preset is None:
            raise IncompleteRow("vocab not given and no preset has these dimensions")
        vocab = preset.vocab
        notes.append(f"vocab {vocab} from preset {preset.name}")
    return ModelSpec(name=row["id"], arch=arch, vocab=vocab, max_seq_len=max(seq_len, 2048),
                     tied_embeddings=(arch == "gpt"), **dims)


class IncompleteRow(Exception):
    """A published row lacks an input plait needs (seq_len, micro-batch, recompute, the TP/PP split)."""


class UnsupportedRow(Exception):
    """A published row describes something plait does not model (a GPU without a spec, EP, a broken rule)."""


def build_specs(row: dict, notes: list[str] | None = None) -> tuple[ModelSpec, ClusterSpec, JobSpec, Layout]:
    """The planner's inputs for one published-runs CSV row (``read_runs``): (model, cluster, job, layout).

    Defaults it applies are appended to ``notes`` (when given). Raises IncompleteRow or
    UnsupportedRow (the reason as message), or PlaitError from a spec constructor.
    """
    notes = [] if notes is None else notes
    seq_len = _int(row, "seq_len")
    if seq_len is None:
        raise IncompleteRow("seq_len not given")
    model = _model_for_row(row, seq_len, notes)
    n_gpus = _int(row, "n_gpus")
    tp, pp, dp, mbs, gbs = (_int(row, k) for k in ("tp", "pp", "dp", "mbs", "gbs"))
    cp = _int(row, "cp") or 1
    if (tp is None or pp is None) and (n_gpus is None or dp is None):
        raise IncompleteRow("tp/pp split not given")
    if mbs is None:
        raise IncompleteRow("micro-batch size not given")
    if n_gpus is None or dp is None:
        raise IncompleteRow("n_gpus/dp not given")
    if gbs is None:
        gbs = dp * mbs
        notes.append(f"global batch not given: one micro-batch per rank ({gbs})")
    if (_int(row, "ep") or 1) > 1:
        raise UnsupportedRow("expert parallelism")
    zero = _zero_stage(row["zero_stage"])
    if zero is None:
        raise IncompleteRow(f"ZeRO stage {row['zero_stage']!r} not understood")
    split_given = tp is not None and pp is not None
    layers_per_stage = -(-model.n_layers // pp) if split_given else model.n_layers
    recompute = _recompute(row["recompute"], layers_per_stage)
    if recompute is None and "narayanan" in row["source"].lower():
        recompute = ("full", 0)
        notes.append("completed: ckpt=full (Megatron-LM 2021 / DeepSpeed ZeRO-3 recompute every layer)")
    if recompute is None:
        raise IncompleteRow("recompute not given")
    try:
        gpu = get_gpu(row["gpu_type"])
    except PlaitError:
        raise UnsupportedRow(f"GPU {row['gpu_type']!r} has no spec") from None
    per_node = _int(row, "gpus_per_node")
    if per_node is None:
        per_node = 8
        notes.append("8 GPUs per node assumed")
    cluster = cluster_for_gpu(gpu.name, n_gpus, per_node)
    vpp = _int(row, "vpp") or 1
    flash = (row.get("flash_attn") or "").strip().lower()
    if not flash:
        notes.append("FlashAttention assumed")
    attn = "eager" if flash == "no" else "flash"
    precision = "fp8" if "fp8" in (row.get("precision") or "").lower() else "bf16"
    sp = (row.get("seq_parallel") or "").strip().lower() == "yes"
    job = JobSpec(global_batch=gbs, seq_len=seq_len)

    def layout_of(tp: int, pp: int) -> Layout:
        return Layout(dp=dp, tp=tp, pp=pp, cp=cp, vpp=vpp, mbs=mbs, zero=zero, sp=sp or tp == 1,
                      ckpt=recompute[0], ckpt_layers=recompute[1],
                      schedule="interleaved-1f1b" if vpp > 1 else "1f1b",
                      split="even" if model.n_layers % (pp * vpp) == 0 else "uneven",
                      precision=precision, attn=attn)

    if split_given:
        layout = layout_of(tp, pp)
    elif n_gpus % (dp * cp):
        raise IncompleteRow(f"tp/pp split not given and n_gpus={n_gpus} is not a multiple of dp·cp={dp * cp}")
    else:
        layout = _fastest_split(model, cluster, job, n_gpus // (dp * cp), layout_of, _runtime(row), notes)
    errs = errors_of(validate(model, cluster, job, layout))
    if errs:
        raise UnsupportedRow("; ".join(e.message for e in errs))
    return model, cluster, job, layout


def _runtime(row: dict) -> str:
    """Megatron-LM saves the sharded sequence-parallel GEMM input; PyTorch runtimes save it gathered."""
    source = row.get("source", "").lower()
    return "megatron" if any(word in source for word in ("narayanan", "korthikanti", "megatron")) else "torch"


def _fastest_split(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, model_parallel: int, layout_of,
                   runtime: str, notes: list[str]) -> Layout:
    """The fastest (tp, pp) with tp·pp = ``model_parallel`` (tp inside a node) that fits; noted."""
    best = None
    for tp in (t for t in range(1, cluster.gpus_per_node + 1) if model_parallel % t == 0):
        pp = model_parallel // tp
        if pp > model.n_layers or model.n_heads % tp or model.n_kv_heads % tp or model.ffn_hidden % tp:
            continue
        layout = layout_of(tp, pp)
        if errors_of(validate(model, cluster, job, layout)):
            continue
        if not estimate_memory(model, cluster, job, layout, runtime=runtime).fits:
            continue
        tokens = estimate_step(model, cluster, job, layout, runtime=runtime).tokens_per_s_per_gpu
        if best is None or tokens > best[0]:
            best = (tokens, layout)
    if best is None:
        raise IncompleteRow(f"tp/pp split not given and no split of model-parallel size {model_parallel} fits")
    layout = best[1]
    notes.append(f"completed: tp={layout.tp},pp={layout.pp} (fastest fitting split of the stated "
                 f"model-parallel size {model_parallel}, by search)")
    return layout


def _reported_tokens(row: dict, model: ModelSpec, seq_len: int, n_gpus: int, notes: list[str]) -> float | None:
    tokens = _num(row, "reported_tokens_per_s_per_gpu")
    if tokens:
        return tokens
    iteration = _num(row, "reported_iter_time_s")
    gbs = _num(row, "gbs")
    if iteration and gbs:
        return gbs * seq_len / n_gpus / iteration
    flops, convention = _source_flops_per_token(row, model, seq_len)
    tflops = _num(row, "reported_tflops_per_gpu")
    if tflops:
        notes.append(f"throughput from TFLOP/s via {convention}")
        return tflops * 1e12 / flops
    peak = 312e12 if "a100" in row["gpu_type"].lower() else 989e12
    for key in ("reported_mfu", "reported_hfu"):
        fraction = _num(row, key)
        if fraction:
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
        model, cluster, job, layout = build_specs(row, result.notes)
    except IncompleteRow as exc:
        result.status = f"incomplete: {exc}"
        return result
    except UnsupportedRow as exc:
        result.status = f"unsupported: {exc}"
        return result
    except PlaitError as exc:
        result.status = f"unsupported: {exc}"
        return result
    step = estimate_step(model, cluster, job, layout, params, runtime=_runtime(row))
    memory = estimate_memory(model, cluster, job, layout, params, runtime=_runtime(row))
    result.seq_len = job.seq_len
    result.predicted_step_time_s = step.step_time
    result.predicted_mfu = step.mfu
    result.predicted_tokens_per_s_per_gpu = step.tokens_per_s_per_gpu
    result.predicted_mem_gb = memory.total / GIB
    result.reported_mem_gb = _num(row, "reported_mem_gb")
    result.notes.append(f"layout {layout}")
    if not memory.fits:
        result.status = "oom"
        result.notes.append(f"predicted {memory.total / GIB:.1f} GiB > {memory.capacity / GIB:.1f} GiB")
    tokens = _reported_tokens(row, model, job.seq_len, cluster.n_gpus, result.notes)
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


ACCURACY_FILE = Path(__file__).resolve().parents[1] / "data" / "validation.json"


def accuracy_record(summary: dict) -> dict:
    """The part of ``error_summary`` that ``plait plan`` quotes ("how sure"), rounded as printed.

    Shipped as ``plait/data/validation.json`` (the calibration set is not in the package);
    tests/measure/test_published_runs.py checks it equals the current model's record on
    shared/data, so the quoted numbers cannot go stale."""
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
