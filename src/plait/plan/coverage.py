"""A model's GEMM shapes, and whether the GEMMs a profile measured cover them. No torch. FLOPs, bytes.

``plait profile`` measures the shapes of ``model_gemms`` (``plait.measure.profile.machine``) and records
the range it measured in the calibration file (``gemm_coverage``: min and max FLOPs, operand bytes and
m); ``plait plan`` / ``sweep`` / ``report`` print one warning line (``coverage_warning``) when the model's
GEMMs fall outside it: the fitted GEMM curve would be extrapolated, and on a CPU a curve fitted on an
8B model's memory-bound GEMVs is 10x off for a tiny model's cache-resident GEMMs.

Shapes are the layer's four projections as ``plait.plan.kernels.layer_times`` prices them
(QKV, attention output, MLP up - gate and up together for Llama - and MLP down) and the LM head, as
(m, k, n) of an (m×k)·(k×n) GEMM. Bytes are the planner's operand traffic (``kernels.gemm_time``):
element_bytes · (m·k + k·n + m·n).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from plait.spec.model import ModelSpec

# A GEMM within this factor outside the measured range still counts as covered (the fitted curve is
# smooth: its rate saturates above the range, its bytes side is a straight line); farther is extrapolation.
COVERAGE_SLACK = 2.0
PROJECTIONS = ("qkv", "attn_out", "mlp_up", "mlp_down")


def projection_shapes(model: ModelSpec, tp: int = 1, head: bool = True) -> list[tuple[str, int, int]]:
    """(name, k, n) of the layer's projections at tensor-parallel degree ``tp`` (and the LM head's)."""
    h, f, kv, q = model.hidden, model.ffn_hidden, model.kv_hidden, model.q_hidden
    up = 2 * f if model.arch == "llama" else f
    shapes = [("qkv", h, (q + 2 * kv) // tp), ("attn_out", q // tp, h), ("mlp_up", h, up // tp),
              ("mlp_down", f // tp, h)]
    if head:
        shapes.append(("head", h, model.vocab // tp))
    return shapes


def gemm_flops(m: float, k: float, n: float) -> float:
    """FLOPs of an (m×k)·(k×n) GEMM."""
    return 2.0 * m * k * n


def gemm_bytes(m: float, k: float, n: float, element_bytes: float) -> float:
    """Operand bytes the planner counts for an (m×k)·(k×n) GEMM (read both, write the result)."""
    return element_bytes * (m * k + k * n + m * n)


def model_gemms(model: ModelSpec, tokens: list[int], tp: int = 1, head: bool = True) -> list[dict]:
    """{"name", "m", "k", "n"} of every projection (and the head) at each token count ``m`` in ``tokens``."""
    return [{"name": name, "m": m, "k": k, "n": n} for m in tokens for name, k, n in projection_shapes(model, tp, head)]


@dataclass(frozen=True)
class GemmCoverage:
    """The GEMMs a profile measured: [low, high] of FLOPs, operand bytes (at ``element_bytes`` bytes
    per element, the profile's dtype) and m (rows)."""

    flops: tuple[float, float]
    bytes: tuple[float, float]
    m: tuple[float, float]
    element_bytes: float

    @classmethod
    def of(cls, points: list[dict], element_bytes: float) -> GemmCoverage:
        """The range of measured GEMMs (dicts with m, k, n)."""
        flops = [gemm_flops(p["m"], p["k"], p["n"]) for p in points]
        moved = [gemm_bytes(p["m"], p["k"], p["n"], element_bytes) for p in points]
        rows = [float(p["m"]) for p in points]
        return cls((min(flops), max(flops)), (min(moved), max(moved)), (min(rows), max(rows)), float(element_bytes))

    @classmethod
    def from_dict(cls, data: dict) -> GemmCoverage:
        """The file's ``gemm_coverage`` object; ValueError naming what is wrong."""
        if not isinstance(data, dict):
            raise ValueError("must be an object with flops, bytes, m and element_bytes")
        spans = {}
        for key in ("flops", "bytes", "m"):
            span = data.get(key)
            if (not isinstance(span, list) or len(span) != 2
                    or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < math.inf
                               for v in span)
                    or span[0] > span[1]):
                raise ValueError(f"{key} must be [low, high], positive numbers, low <= high; got {span!r}")
            spans[key] = (float(span[0]), float(span[1]))
        size = data.get("element_bytes")
        if isinstance(size, bool) or not isinstance(size, (int, float)) or not 1 <= size <= 8:
            raise ValueError(f"element_bytes must be a number in [1, 8], got {size!r}")
        return cls(spans["flops"], spans["bytes"], spans["m"], float(size))

    def to_dict(self) -> dict:
        return {"flops": list(self.flops), "bytes": list(self.bytes), "m": list(self.m),
                "element_bytes": self.element_bytes}

    def outside(self, gemms: list[dict], slack: float = COVERAGE_SLACK) -> list[dict]:
        """The GEMMs whose FLOPs or bytes lie more than ``slack`` times outside the measured range."""
        def out(value: float, span: tuple[float, float]) -> bool:
            return value < span[0] / slack or value > span[1] * slack

        return [g for g in gemms if out(gemm_flops(g["m"], g["k"], g["n"]), self.flops)
                or out(gemm_bytes(g["m"], g["k"], g["n"], self.element_bytes), self.bytes)]


def planned_tokens(seq_len: int, global_batch: int | None = None) -> list[int]:
    """Token counts (m) of the micro-batches a plan of ``seq_len`` would run: one sequence, and the
    largest micro-batch the global batch allows up to 8 sequences (the checked extremes)."""
    most = max(1, min(8, global_batch or 1))
    return sorted({seq_len, seq_len * most})


def coverage_warning(coverage: GemmCoverage | None, model: ModelSpec, seq_len: int, path: str,
                     global_batch: int | None = None, model_arg: str | None = None) -> str:
    """One warning line naming the fix when ``model``'s GEMMs at ``seq_len`` fall outside ``coverage``
    ("" when covered, or when the calibration records no coverage: an older file). ``model_arg``: the
    --model the user gave (a preset or a JSON file; default the model's name)."""
    if coverage is None:
        return ""
    gemms = model_gemms(model, planned_tokens(seq_len, global_batch))
    missed = coverage.outside(gemms)
    if not missed:
        return ""
    low = min(gemm_flops(g["m"], g["k"], g["n"]) for g in missed)
    high = max(gemm_flops(g["m"], g["k"], g["n"]) for g in missed)
    return (f"calibration {path} did not measure GEMMs like {model.name}'s ({len(missed)} of {len(gemms)} "
            f"shapes, {low:.3g}..{high:.3g} FLOPs, outside its measured {coverage.flops[0]:.3g}..{coverage.flops[1]:.3g} "
            f"FLOPs / {coverage.bytes[0]:.3g}..{coverage.bytes[1]:.3g} bytes): its GEMM times are extrapolated; "
            f"profile this model: plait profile --model {model_arg or model.name} --seq-len {seq_len} ...")
