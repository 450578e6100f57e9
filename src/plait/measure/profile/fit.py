"""Turn ``plait profile``'s raw measurements into the planner's fields. No torch.

Each fit uses the planner's own formula, so what is measured lands where the planner reads it:

- GEMMs (``plait.plan.kernels.gemm_time``): the roofline t = max((F + F_half) / (peak · e_max),
  bytes / B) + overhead, fitted by least squares on relative error (``gemm_fit.fit_roofline``):
  peak · e_max gives ``gpu_overrides.gemm_efficiency``, F_half ``params.gemm_half_flops``, B over
  the planner's element-wise rate ``params.gemm_bandwidth_factor`` (its worst and median residuals
  are reported, the worst warned about when large); the range of GEMMs measured is written as
  ``gemm_coverage`` (``plait.plan.coverage``). Raw GEMMs without shapes (only FLOPs) get the
  FLOP-only line of ``fit_gemm``. An efficiency above 1 (the device beats the preset's peak: a
  wrong ``--gpu``) is warned about and written as 1.0.
- Attention forward: the same line with F_half fixed gives ``attention_efficiency``; backward
  over forward time gives ``params.flash_backward_factor``.
- Copies: bytes moved / time over the spec's HBM bandwidth gives ``memory_efficiency``.
- One-element kernels back to back give ``kernel_overhead``.
- Collectives (``plait.plan.comm``): t = steps · (S / n / B + L) with steps = 2(n-1) for
  all-reduce and n-1 for all-gather / reduce-scatter, a line in S: B is the bus bandwidth, L the
  per-step latency. The all-reduce's B inside a node (the median of the three when it was not
  measured), over ``link_efficiency``, gives ``intra_node_bandwidth`` (across nodes, with one rank
  per node: ``inter_node_bandwidth``), the median L the latency, and every other op's B over it
  its ``ClusterSpec.<op>_bandwidth_factor`` (all-gather, reduce-scatter, all-to-all, send/recv;
  from inside a node when measured there). Pinned host copies give ``host_link_bandwidth``.

A CPU has no vendor peak in plait: a CPU profile describes the CPU as the device, with the
fastest GEMM rate measured as its peak (``bf16_flops``: the denominator of MFU, which no step can
exceed) and the fitted curve's large-GEMM rate over it as ``gemm_efficiency``, the copy bandwidth as its
memory bandwidth, and its RAM share per process as capacity; what else describes a CPU (fp32
elements, no CUDA context, measured overlap and host time per layer) is
``plait.measure.profile.cpu_fit``.
"""

from __future__ import annotations

import math
import statistics

from plait.measure.profile.cpu_fit import ELEMENT_BYTES, cpu_device_params
from plait.measure.profile.gemm_fit import fit_roofline
from plait.plan.coverage import GemmCoverage
from plait.spec.hardware import OP_BANDWIDTH_FACTORS, GpuSpec
from plait.spec.model import ModelSpec

FIT_OPS = ("all_reduce", "all_gather", "reduce_scatter")


def weighted_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(slope, intercept) minimizing the squared *relative* residuals sum(((y - a·x - b) / y)²)."""
    w = [1.0 / (y * y) for y in ys]
    sw = sum(w)
    sx = sum(wi * x for wi, x in zip(w, xs))
    sy = sum(wi * y for wi, y in zip(w, ys))
    sxx = sum(wi * x * x for wi, x in zip(w, xs))
    sxy = sum(wi * x * y for wi, x, y in zip(w, xs, ys))
    det = sw * sxx - sx * sx
    if len(xs) < 2 or det <= 0:
        return (sy / sx if sx else math.nan), 0.0
    slope = (sw * sxy - sx * sy) / det
    return slope, (sy - slope * sx) / sw


def _gemm_residuals(xs, ys, rate: float, half: float, overhead_s: float) -> float:
    """Worst relative residual |predicted / measured - 1| of the curve t = (F + half) / rate + overhead."""
    return max(abs(((x + half) / rate + overhead_s) / y - 1.0) for x, y in zip(xs, ys))


def fit_gemm(points: list[dict], overhead_s: float) -> dict:
    """{"rate": large-GEMM FLOP/s, "half_flops": F_half, "max_error": worst relative residual, "fit": how,
    "fastest": the fastest measured GEMM's FLOP/s}.

    The curve is the planner's t = (F + F_half) / rate + overhead, fitted by least squares on
    relative error: what was measured, even where single GEMMs ran faster than the curve (on a CPU
    the rate varies with the shape, and a lucky call is not the rate the model's GEMMs reach).
    Both numbers come from one fit: a free line (``fit: "line"``); if its F_half is negative, the
    line through the launch overhead (F_half = 0, ``"through overhead"``); if no line fits (a
    slope that is not positive), the fastest GEMM's rate with F_half fitted for it.
    """
    xs, ys = [p["flops"] for p in points], [p["time_s"] for p in points]
    w = [1.0 / (y * y) for y in ys]
    best = max(p["flops_per_s"] for p in points)
    rate, half, how = math.nan, 0.0, "rate from the fastest GEMM (line fit failed)"
    slope, intercept = weighted_line(xs, ys)
    if slope and slope > 0 and math.isfinite(slope):
        rate, half, how = 1.0 / slope, (intercept - overhead_s) / slope, "line"
        if half < 0:  # the line through the launch overhead (F_half = 0)
            slope = sum(wi * x * (y - overhead_s) for wi, x, y in zip(w, xs, ys)) / sum(wi * x * x for wi, x in zip(w, xs))
            rate, half, how = (1.0 / slope, 0.0, "through overhead") if slope > 0 else (math.nan, 0.0, how)
    if not math.isfinite(rate):  # no line: the fastest rate, and F_half fitted for it
        rate = best
        half = max(0.0, rate * sum(wi * (y - overhead_s - x / rate) for wi, x, y in zip(w, xs, ys)) / sum(w))
    return {"rate": rate, "half_flops": half, "max_error": _gemm_residuals(xs, ys, rate, half, overhead_s),
            "fit": how, "fastest": best}


def fit_attention(points: list[dict], half_flops: float, overhead_s: float) -> dict:
    """{"rate": causal forward FLOP/s, "backward_factor": bwd / fwd time (median)}."""
    xs = [p["flops"] + half_flops for p in points]
    ys = [max(p["fwd_s"] - overhead_s, 1e-9) for p in points]
    w = [1.0 / (y * y) for y in ys]
    slope = sum(wi * x * y for wi, x, y in zip(w, xs, ys)) / sum(wi * x * x for wi, x in zip(w, xs))
    backward = statistics.median((p["fwd_bwd_s"] - p["fwd_s"]) / p["fwd_s"] for p in points)
    return {"rate": 1.0 / slope, "backward_factor": max(1.0, backward)}


def fit_collective(points: list[dict]) -> dict:
    """{"bus_bytes_per_s": B, "latency_s": L} of one op over one scope (plait.plan.comm's model)."""
    op, n = points[0]["op"], points[0]["group_size"]
    if op == "send_recv":
        steps, per_step = 1.0, 1.0
    else:
        steps = 2.0 * (n - 1) if op == "all_reduce" else float(n - 1)
        per_step = 1.0 / n
    xs, ys = [p["bytes"] for p in points], [p["time_s"] for p in points]
    slope, intercept = weighted_line(xs, ys)
    if not slope or slope <= 0 or not math.isfinite(slope):
        largest = max(points, key=lambda p: p["bytes"])
        slope, intercept = largest["time_s"] / largest["bytes"], 0.0
    latency = intercept / steps if intercept > 0 else min(ys) / steps
    return {"op": op, "scope": points[0]["scope"], "group_size": n,
            "bus_bytes_per_s": steps * per_step / slope, "latency_s": latency}


def _links(raw: dict, efficiency: float) -> tuple[dict, list[dict], list[str]]:
    overrides, fits, notes = {}, [], []
    by_key: dict[tuple[str, str], list[dict]] = {}
    for point in raw.get("collectives", []):
        if point["group_size"] > 1:
            by_key.setdefault((point["op"], point["scope"]), []).append(point)
    fits = [fit_collective(points) for points in by_key.values()]
    # the per-op factors come from one scope: inside a node when measured there
    factor_scope = "intra" if any(f["scope"] == "intra" for f in fits) else "inter"
    for scope, bandwidth_field, latency_field in (("intra", "intra_node_bandwidth", "intra_node_latency"),
                                                   ("inter", "inter_node_bandwidth", "inter_node_latency")):
        used = [f for f in fits if f["scope"] == scope and f["op"] in FIT_OPS]
        if not used:
            continue
        reference = next((f["bus_bytes_per_s"] for f in used if f["op"] == "all_reduce"), None)
        if reference is None:
            reference = statistics.median(f["bus_bytes_per_s"] for f in used)
        overrides[bandwidth_field] = reference / efficiency
        overrides[latency_field] = statistics.median(f["latency_s"] for f in used)
        if scope == factor_scope:
            overrides.update({OP_BANDWIDTH_FACTORS[f["op"]]: f["bus_bytes_per_s"] / reference
                              for f in fits if f["scope"] == scope and f["op"] in OP_BANDWIDTH_FACTORS})
    if overrides:
        overrides["link_efficiency"] = efficiency  # bandwidth · link_efficiency = the measured bus bandwidth
    else:
        notes.append("no collectives measured (one process): link bandwidths and latencies keep their defaults")
    if raw.get("host_link"):
        overrides["host_link_bandwidth"] = min(p["bytes_per_s"] for p in raw["host_link"])
    return overrides, fits, notes


def calibration_fields(raw: dict, gpu: GpuSpec | None, link_efficiency: float,
                       ram_bytes_per_process: float = 0.0, host_spec: ModelSpec | None = None) -> dict:
    """{"params", "gpu_overrides", "cluster_overrides", "fits", "notes"} from the raw measurements.

    ``gpu``: the GPU preset measured (None for a CPU profile); ``link_efficiency``: the fraction
    (written to the file) that turns a measured bus bandwidth into the link bandwidth it reaches;
    ``host_spec``: the model whose blocks ``raw["layer_host_s"]`` timed (a CPU profile).
    """
    overhead = raw["kernel_overhead_s"]
    element_bytes = ELEMENT_BYTES[raw.get("dtype", "bfloat16" if gpu is not None else "float32")]
    shaped = all(k in p for p in raw["gemm"] for k in ("m", "k", "n"))
    gemm = fit_roofline(raw["gemm"], overhead, element_bytes) if shaped else fit_gemm(raw["gemm"], overhead)
    attention = fit_attention(raw["attention"], gemm["half_flops"], overhead) if raw.get("attention") else None
    copy_rate = max(p["bytes_per_s"] for p in raw["memory"])
    params = {"gemm_half_flops": gemm["half_flops"]}
    if attention:
        params["flash_backward_factor"] = attention["backward_factor"]
    if gpu is None:  # a CPU profile: the CPU is the device, its peak the fastest rate measured
        peak = max(gemm["rate"], gemm["fastest"])
        gpu_overrides = {"bf16_flops": peak, "gemm_efficiency": gemm["rate"] / peak, "hbm_bandwidth": copy_rate,
                         "memory_efficiency": 1.0, "kernel_overhead": overhead}
        if ram_bytes_per_process > 0:
            gpu_overrides["hbm_bytes"] = ram_bytes_per_process
    else:
        peak = gpu.bf16_flops
        gpu_overrides = {"gemm_efficiency": gemm["rate"] / peak,
                         "memory_efficiency": copy_rate / gpu.hbm_bandwidth, "kernel_overhead": overhead}
    if attention:
        gpu_overrides["attention_efficiency"] = attention["rate"] / peak
    cluster_overrides, link_fits, notes = _links(raw, link_efficiency)
    warnings = []
    if gemm["max_error"] > GEMM_RESIDUAL_WARN:
        typical = f", {100 * gemm['median_error']:.0f}% typically" if "median_error" in gemm else ""
        warnings.append(f"the GEMM curve misses a measured GEMM by {100 * gemm['max_error']:.0f}%{typical} (fit: "
                        f"{gemm['fit']}); the timings are noisy or the shapes do not follow "
                        "max((F+F_half)/R, bytes/B) + launch")
    over_preset: dict[str, float] = {}
    if gpu is not None:
        warnings += _cap_efficiencies(gpu_overrides, gpu.name, over_preset)
    if gemm.get("bytes_per_s"):  # the roofline's bytes side, as a factor of the planner's element-wise rate
        hbm = gpu_overrides.get("hbm_bandwidth", gpu.hbm_bandwidth if gpu else copy_rate)
        params["gemm_bandwidth_factor"] = min(1000.0, gemm["bytes_per_s"] / (hbm * gpu_overrides["memory_efficiency"]))
    elif gpu_overrides.get("attention_efficiency", 0.0) > 1.0:  # the CPU's "peak" is its GEMM rate
        over_preset["attention_efficiency"] = gpu_overrides["attention_efficiency"]
        gpu_overrides["attention_efficiency"] = 1.0
        notes.append(f"attention ran {over_preset['attention_efficiency']:.2f}x faster than the fitted GEMM rate "
                     "(this CPU profile's peak): attention_efficiency written as 1.0")
    if gpu is None:
        cpu_params, cpu_fits, cpu_notes = cpu_device_params(raw, gpu_overrides, cluster_overrides, params, host_spec)
        params.update(cpu_params)
        notes += cpu_notes
    else:
        cpu_fits = {}
    coverage = GemmCoverage.of(raw["gemm"], element_bytes).to_dict() if shaped else None
    fits = {"gemm": gemm, "attention": attention, "memory_bytes_per_s": copy_rate, "collectives": link_fits,
            **cpu_fits}
    if over_preset:
        fits["efficiencies_above_1"] = over_preset
    return {"params": params, "gpu_overrides": gpu_overrides, "cluster_overrides": cluster_overrides,
            "fits": fits, "notes": notes, "warnings": warnings, "gemm_coverage": coverage}


GEMM_RESIDUAL_WARN = 0.25  # worst relative residual of the GEMM curve above which the profile warns


def _cap_efficiencies(gpu_overrides: dict, gpu_name: str, measured: dict) -> list[str]:
    """Cap efficiencies above 1 (faster than the preset's peak or bandwidth) at 1.0, with a warning
    each: the GPU preset is probably wrong. ``measured`` receives the uncapped values."""
    warnings = []
    for name in ("gemm_efficiency", "attention_efficiency", "memory_efficiency"):
        value = gpu_overrides.get(name)
        if value is not None and value > 1.0:
            measured[name] = value
            gpu_overrides[name] = 1.0
            warnings.append(f"measured {name} {value:.2f} is above 1: this device is faster than the {gpu_name} "
                            f"preset's peak; is --gpu right? (written as 1.0; the measured value is in fits)")
    return warnings
