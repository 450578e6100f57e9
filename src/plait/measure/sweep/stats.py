"""Statistics of a sweep: Spearman rank correlation (numpy only) and the predicted-vs-measured summary.

The summary compares the planner's order of the swept layouts with their measured step times,
and (when predictions were recorded, i.e. on a GPU or with --gpu) the predicted step time,
memory and MFU with the measured ones. Relative errors are measured / predicted - 1.
"""

from __future__ import annotations

import statistics

import numpy as np

from plait.measure.sweep.csv_file import SweepRow

STATUSES = ("ok", "oom", "failed", "refused", "timeout", "invalid")


def average_ranks(values) -> np.ndarray:
    """Ranks 1..n of ``values``; tied values share the mean of the ranks they span."""
    data = np.asarray(values, dtype=float)
    order = np.argsort(data, kind="mergesort")
    ranks = np.empty(len(data), dtype=float)
    sorted_values = data[order]
    start = 0
    while start < len(data):
        end = start
        while end + 1 < len(data) and sorted_values[end + 1] == sorted_values[start]:
            end += 1
        ranks[order[start:end + 1]] = (start + end) / 2 + 1
        start = end + 1
    return ranks


def spearman(x, y) -> float | None:
    """Spearman's rho: the Pearson correlation of the average ranks; None when undefined
    (fewer than two pairs, or one side constant)."""
    if len(x) != len(y):
        raise ValueError(f"spearman needs pairs: {len(x)} x values, {len(y)} y values")
    if len(x) < 2:
        return None
    rx, ry = average_ranks(x), average_ranks(y)
    dx, dy = rx - rx.mean(), ry - ry.mean()
    denominator = float(np.sqrt((dx * dx).sum() * (dy * dy).sum()))
    if denominator == 0.0:
        return None
    return float((dx * dy).sum() / denominator)


def _error_stats(values: list[float]) -> dict:
    magnitudes = [abs(v) for v in values]
    return {"n": len(values),
            "median_abs": statistics.median(magnitudes) if magnitudes else None,
            "mean_abs": statistics.fmean(magnitudes) if magnitudes else None}


def summarize(rows: list[SweepRow], top1_tolerance: float = 0.03) -> dict:
    """Counts by status, rank correlation, step-time/memory/MFU errors and the top-1 check."""
    by_status = {s: sum(r.status == s for r in rows) for s in STATUSES}
    ok = [r for r in rows if r.status == "ok" and r.measured_step_time_s is not None]
    predicted = [r for r in ok if r.predicted_step_time_s is not None]
    ranked = [r for r in ok if r.planner_rank is not None]
    on_gpu = any(r.memory_kind == "cuda_allocated" for r in ok)
    if len(predicted) >= 2:
        rho = spearman([r.predicted_step_time_s for r in predicted], [r.measured_step_time_s for r in predicted])
        basis = "predicted vs measured step time"
        n_rho = len(predicted)
    else:
        rho = spearman([r.planner_rank for r in ranked], [r.measured_step_time_s for r in ranked])
        basis = "planner's order vs measured step time"
        n_rho = len(ranked)
    cpu_predicted = bool(predicted) and not any(r.gpu for r in predicted)
    if on_gpu:
        note = ""
    elif cpu_predicted:  # a CPU profile's calibration: the planner predicted this CPU
        counted = all(r.memory_kind == "host_tensors" for r in ok)
        note = ("measured on CPU, predicted for the CPU described by the calibration file; " + (
            "memory is the counted peak of tensor bytes per process, compared with the planner's itemized memory"
            if counted else "memory is host RSS, not compared with the planner's itemized memory"))
    else:
        note = ("measured on CPU: step times are not comparable with the planner's GPU predictions; the rank "
                "correlation compares the planner's order (for the GPU it was asked about) with CPU step times, "
                "and memory is counted host tensors or host RSS, so it is no test of the GPU cost model")
    summary = {
        "rows": len(rows), "by_status": by_status, "ok": len(ok),
        "rank_correlation": {"spearman": rho, "n": n_rho, "basis": basis},
        "step_time_error": _error_stats([r.step_time_error for r in ok if r.step_time_error is not None]),
        "memory_error": _error_stats([r.memory_error for r in ok if r.memory_error is not None]),
        "mfu_error": _error_stats([r.mfu_error for r in ok if r.mfu_error is not None]),
        "note": note,
        "noisy": [r.layout + (" +compile" if r.compile else "") for r in ok if r.noisy],
    }
    summary.update(top1_checks(rows, top1_tolerance))
    if not ok:
        summary["why_none_ran"] = failure_reasons(rows)
    return summary


def top1_checks(rows: list[SweepRow], tolerance: float) -> dict:
    """The planner's top-1 against the measured best, once per compile setting (each twin has its own
    prediction and rank; the check compares the rows of one setting: the setting's best-ranked row
    against its fastest measured one).

    The planner's top-1 of a setting is its row with the lowest planner rank, whatever its status:
    when it did not run ok, the check fails ("top-1 failed (status)"), it does not move on to the
    next rank. The top-level keys repeat the check of the eager setting (or the compiled one when
    the sweep has only compiled layouts); ``top1_checks`` lists every setting.
    """
    checks = []
    for compiled in (False, True):
        group = [r for r in rows if r.compile == compiled]
        ranked = [r for r in group if r.planner_rank is not None]
        if not ranked:
            continue
        top1 = min(ranked, key=lambda r: r.planner_rank)
        ran = [r for r in group if r.status == "ok" and r.measured_step_time_s is not None]
        check = {"compile": compiled, "planner_top1": top1.layout, "planner_top1_rank": top1.planner_rank,
                 "top1_status": top1.status, "best_measured": None, "top1_gap": None,
                 "top1_within_tolerance": False}
        if ran:
            best = min(ran, key=lambda r: r.measured_step_time_s)
            check["best_measured"] = best.layout
            if top1.status == "ok" and top1.measured_step_time_s is not None:
                gap = top1.measured_step_time_s / best.measured_step_time_s - 1
                check.update(top1_gap=gap, top1_within_tolerance=gap <= tolerance)
        checks.append(check)
    out = {"best_measured": None, "planner_top1": None, "top1_status": None, "top1_gap": None,
           "top1_tolerance": tolerance, "top1_within_tolerance": None, "top1_checks": checks}
    if checks:
        out.update({k: v for k, v in checks[0].items() if k in out})
    return out


def top1_text(check: dict, tolerance: float) -> str:
    """One line saying how the planner's top-1 of one compile setting did."""
    name = check["planner_top1"] + (" +compile" if check.get("compile") else "")
    if check.get("top1_status", "ok") != "ok":
        return f"top-1 failed ({check['top1_status']}): {name} did not run ok"
    if check["top1_gap"] is None:
        return f"{name}: not compared (no measured step time)"
    verdict = "within" if check["top1_within_tolerance"] else "NOT within"
    return (f"{name} is {100 * check['top1_gap']:.1f}% slower than the measured best {check['best_measured']} "
            f"({verdict} {100 * tolerance:g}%)")


def failure_reasons(rows: list[SweepRow]) -> dict[str, int]:
    """'status: reason' -> how many layouts ended so (reasons shortened to their first clause)."""
    counts: dict[str, int] = {}
    for r in rows:
        if r.status == "ok":
            continue
        reason = (r.reason or "no reason given").split(";")[0][:160]
        key = f"{r.status}: {reason}"
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))
