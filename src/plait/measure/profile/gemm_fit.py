"""The GEMM roofline of ``plait profile``: measured GEMM times -> the planner's ``gemm_time``. No torch.

The planner (``plait.plan.kernels.gemm_time``) times an (m×k)·(k×n) GEMM of F = 2·m·k·n FLOPs and
D = element_bytes·(m·k + k·n + m·n) operand bytes as

    t = max((F + F_half) / R, D / B) + overhead

R: the large-GEMM FLOP/s (``gemm_efficiency`` of the peak), F_half: the half-rate size
(``params.gemm_half_flops``; F_half / R is the fixed cost of a GEMM call beyond a kernel launch),
B: the rate at which a GEMM streams its operands (``params.gemm_bandwidth_factor`` times the
device's ``hbm_bandwidth · memory_efficiency``). A GEMM at m=1 is a matrix-vector product, bound by
its weights' bytes: a FLOP-only curve fitted on such GEMMs reads them as "small GEMMs are slow" and
prices a small model's cache-resident GEMMs 10x too slow.

``fit_roofline`` fits R, F_half and B together by least squares on relative error: each GEMM is
either on the compute side or on the bytes side; every split of the GEMMs by arithmetic intensity
(F / D) is tried (a line in F on the compute side, a line through 0 in D on the bytes side), the
best is refined by moving each GEMM to the side the fit says binds until no GEMM moves, and the
split whose full curve misses the measurements least is kept. Timings made by the curve itself
are recovered to rounding (``tests/measure/test_gemm_roofline.py``). Points without shapes (only
"flops", older raw files) get the FLOP-only fit (``fit.fit_gemm``).
"""

from __future__ import annotations

import math
import statistics

from plait.plan.coverage import gemm_bytes

MAX_REFINE = 20  # reassignment rounds of the best split (each moves at least one GEMM, or stops)


def _line(xs: list[float], ys: list[float], ws: list[float]) -> tuple[float, float]:
    """(slope, intercept) minimizing sum(w · (y - slope·x - intercept)²); (nan, nan) when degenerate."""
    sw, sx, sy = sum(ws), sum(w * x for w, x in zip(ws, xs)), sum(w * y for w, y in zip(ws, ys))
    sxx = sum(w * x * x for w, x in zip(ws, xs))
    sxy = sum(w * x * y for w, x, y in zip(ws, xs, ys))
    det = sw * sxx - sx * sx
    if det <= 1e-12 * sw * sxx:
        return math.nan, math.nan
    slope = (sw * sxy - sx * sy) / det
    return slope, (sy - slope * sx) / sw


def _compute_side(xs: list[float], ys: list[float], ws: list[float]) -> tuple[float, float] | None:
    """(R, F_half) of t - overhead = (F + F_half) / R on these GEMMs (F_half >= 0), or None."""
    if not xs:
        return None
    if len(xs) >= 2:
        slope, intercept = _line(xs, ys, ws)
        if slope > 0 and math.isfinite(slope) and intercept >= 0:
            return 1.0 / slope, intercept / slope
    # one GEMM, or a negative F_half: the line through 0
    slope = sum(w * x * y for w, x, y in zip(ws, xs, ys)) / sum(w * x * x for w, x in zip(ws, xs))
    return (1.0 / slope, 0.0) if slope > 0 else None


def _bytes_side(ds: list[float], ys: list[float], ws: list[float]) -> float | None:
    """B of t - overhead = D / B on these GEMMs (a line through 0), or None."""
    if not ds:
        return None
    slope = sum(w * d * y for w, d, y in zip(ws, ds, ys)) / sum(w * d * d for w, d in zip(ws, ds))
    return 1.0 / slope if slope > 0 else None


def predict(flops: float, nbytes: float, rate: float, half: float, bandwidth: float | None, overhead_s: float) -> float:
    """The roofline's seconds for one GEMM (``bandwidth`` None: no bytes side)."""
    compute = (flops + half) / rate
    memory = nbytes / bandwidth if bandwidth else 0.0
    return max(compute, memory) + overhead_s


def _fit_split(memory: set[int], fs, ds, ys, ws, ts, overhead_s):
    """(loss, R, F_half, B) with the GEMMs of ``memory`` on the bytes side, or None when no curve fits."""
    compute = [i for i in range(len(fs)) if i not in memory]
    side = _compute_side([fs[i] for i in compute], [ys[i] for i in compute], [ws[i] for i in compute])
    if side is None:
        return None
    rate, half = side
    bandwidth = _bytes_side([ds[i] for i in memory], [ys[i] for i in memory], [ws[i] for i in memory])
    if memory and bandwidth is None:
        return None
    loss = sum((predict(f, d, rate, half, bandwidth, overhead_s) / t - 1.0) ** 2 for f, d, t in zip(fs, ds, ts))
    return loss, rate, half, bandwidth


def fit_roofline(points: list[dict], overhead_s: float, element_bytes: float) -> dict:
    """{"rate": R FLOP/s, "half_flops": F_half, "bytes_per_s": B (None: no GEMM was bytes-bound),
    "max_error" / "median_error": |predicted / measured - 1| over the GEMMs, "memory_bound": how many
    GEMMs the bytes side times, "fit": "roofline", "fastest": the fastest measured GEMM's FLOP/s}.

    ``points``: dicts with m, k, n, flops, time_s (seconds per call); ``overhead_s``: the launch
    overhead (seconds) the planner adds to every kernel.
    """
    fs = [float(p["flops"]) for p in points]
    ds = [gemm_bytes(p["m"], p["k"], p["n"], element_bytes) for p in points]
    ts = [float(p["time_s"]) for p in points]
    ys = [max(t - overhead_s, 1e-12) for t in ts]
    ws = [1.0 / (t * t) for t in ts]
    order = sorted(range(len(fs)), key=lambda i: fs[i] / ds[i])  # lowest arithmetic intensity first
    best = None
    for j in range(len(order) + 1):
        fit = _fit_split(set(order[:j]), fs, ds, ys, ws, ts, overhead_s)
        if fit is not None and (best is None or fit[0] < best[0][0]):
            best = (fit, set(order[:j]))
    if best is None:  # not even one compute-side line: the fastest rate, no bytes side
        rate = max(f / y for f, y in zip(fs, ys))
        best = ((math.nan, rate, 0.0, None), set())
    (loss, rate, half, bandwidth), memory = best
    for _ in range(MAX_REFINE):  # move each GEMM to the side that binds under the current fit
        moved = {i for i in range(len(fs)) if bandwidth and ds[i] / bandwidth > (fs[i] + half) / rate}
        if moved == memory:
            break
        fit = _fit_split(moved, fs, ds, ys, ws, ts, overhead_s)
        if fit is None or not fit[0] < loss:
            break
        (loss, rate, half, bandwidth), memory = fit, moved
    errors = [abs(predict(f, d, rate, half, bandwidth, overhead_s) / t - 1.0) for f, d, t in zip(fs, ds, ts)]
    return {"rate": rate, "half_flops": half, "bytes_per_s": bandwidth, "max_error": max(errors),
            "median_error": statistics.median(errors), "memory_bound": len(memory), "fit": "roofline",
            "fastest": max(f / t for f, t in zip(fs, ts))}
