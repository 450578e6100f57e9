"""The calibration file: its format tag, its reader and its writer, in one place.

``plait profile`` and ``plait calibrate fit`` write it (``write_calibration``); ``plait plan``,
``validate``, ``sweep``, ``report`` and ``calibrate fit`` read it (``read_calibration``). It holds
the cost parameters to replace (``CostParams`` fields), GpuSpec and ClusterSpec link overrides,
the GPU preset it was measured on and the device, plus a record for people (measurements, fits,
machine, versions, date) that the reader ignores.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from plait.atomic import atomic_write_text
from plait.errors import PlaitError
from plait.plan.coverage import GemmCoverage, coverage_warning
from plait.plan.params import CLUSTER_RANGES, DEFAULT_PARAMS, GPU_RANGES, CostParams, Range, check_ranges
from plait.spec.serialize import read_json_file

FORMAT = "plait-calibration/1"

# GpuSpec / ClusterSpec fields a calibration may replace (what ``plait profile`` measures).
GPU_CALIBRATION_FIELDS = tuple(GPU_RANGES)
CLUSTER_CALIBRATION_FIELDS = tuple(CLUSTER_RANGES)
# The params ``plait profile`` measures on the device: a CPU profile's describe the CPU (its GEMM
# curve, fp32 memory items, overlap and runtime host time: ``plait.measure.profile.cpu_fit``).
DEVICE_MEASURED_PARAMS = ("gemm_half_flops", "gemm_bandwidth_factor", "flash_backward_factor", "cuda_context_bytes",
                          "comm_buffer_bytes",
                          "fragmentation", "dp_overlap", "offload_overlap", "cp_comm_overlap", "tp_comm_overlap",
                          "overlap_slowdown",
                          "layer_overhead_s", "tp_layer_overhead_s", "cp_layer_overhead_s", "fsdp_layer_overhead_s",
                          "sac_layer_overhead_s", "tp_ends_overhead_s", "cp_ends_overhead_s", "fsdp_ends_overhead_s",
                          "microbatch_overhead_s", "step_overhead_s", "layer_step_overhead_s", "elementwise_passes")


@dataclass(frozen=True)
class Calibration:
    """A calibration file, read and checked.

    Attributes:
        params: the cost parameters (defaults where the file names none).
        gpu_overrides: GpuSpec fields to replace (FLOP/s, bytes, bytes/s, fractions, seconds).
        cluster_overrides: ClusterSpec link fields to replace (bytes/s, seconds, fraction).
        gpu: the GPU preset it was measured on (None: a CPU profile, or a fit over several GPUs).
        device: "cuda", "cpu" (a CPU profile: the overrides describe the CPU) or "" (not measured).
        path: where it was read from (for messages).
        processes_per_node, threads_per_process: how a CPU profile ran (its compute rates are
            for that many processes sharing the cores, each with that many threads); None when
            the file does not say.
        gemm_coverage: the range of GEMMs the profile measured (None: the file does not say - an
            older profile, a fit or a hand-written file - and no coverage warning is given).
    """

    params: CostParams
    gpu_overrides: tuple[tuple[str, float], ...] = ()
    cluster_overrides: tuple[tuple[str, float], ...] = ()
    gpu: str | None = None
    device: str = ""
    path: str = ""
    processes_per_node: int | None = None
    threads_per_process: int | None = None
    gemm_coverage: GemmCoverage | None = None

    @property
    def cpu_profile(self) -> bool:
        return self.device == "cpu"

    def process_mismatch(self, processes: int, threads: int | None) -> str:
        """A warning line when a CPU profile ran another number of processes or threads per process
        than the runs it predicts ("" when they agree or the file does not say)."""
        if not self.cpu_profile or self.processes_per_node is None:
            return ""
        if self.processes_per_node == processes and (threads is None or self.threads_per_process in (None, threads)):
            return ""
        ran = f"{self.processes_per_node} process(es) x {self.threads_per_process or '?'} thread(s)"
        runs = f"{processes} x {threads if threads is not None else '?'}"
        return (f"calibration {self.path} was profiled with {ran}, these runs use {runs}: its compute rates "
                f"describe processes that share the cores differently; profile with --nproc-per-node {processes}")

    def coverage_warning(self, model, seq_len: int, global_batch: int | None = None,
                         model_arg: str | None = None) -> str:
        """One warning line (with the fix) when ``model``'s GEMMs at ``seq_len`` fall outside what the
        profile measured ("" when covered or not recorded; ``plait.plan.coverage``)."""
        return coverage_warning(self.gemm_coverage, model, seq_len, self.path, global_batch, model_arg)

    def apply(self, cluster):
        """(cluster with the overrides applied, warning lines). Overrides apply even on a mismatch."""
        warnings = []
        if self.cpu_profile:
            warnings.append(f"calibration {self.path} is a CPU profile: the planned {cluster.gpu.name} gets "
                            "the CPU's measured FLOP/s, memory and link bandwidths; profile the GPU instead")
        elif self.gpu and self.gpu != cluster.gpu.name:
            warnings.append(f"calibration {self.path} is for {self.gpu}, the cluster has {cluster.gpu.name}")
        try:
            gpu = dataclasses.replace(cluster.gpu, **dict(self.gpu_overrides))
        except TypeError as exc:
            raise PlaitError(f"{self.path}: bad gpu_overrides ({exc})") from None
        return dataclasses.replace(cluster, gpu=gpu, **dict(self.cluster_overrides)), warnings

    def params_for_runs_elsewhere(self) -> tuple[CostParams, list[str]]:
        """(params, warning lines) for runs on other hardware (``plait validate``: published GPU runs).

        The GPU and link overrides describe one machine and are not used. A CPU profile's
        device-measured params (``DEVICE_MEASURED_PARAMS``) describe the CPU: they are refused
        (the defaults are kept), and its other params are applied with a warning.
        """
        warnings = []
        params = self.params
        if self.cpu_profile:
            params = dataclasses.replace(params, **{n: getattr(DEFAULT_PARAMS, n) for n in DEVICE_MEASURED_PARAMS})
            others = [n for n in params.to_dict() if getattr(params, n) != getattr(DEFAULT_PARAMS, n)]
            measured = [n for n in DEVICE_MEASURED_PARAMS if getattr(self.params, n) != getattr(DEFAULT_PARAMS, n)]
            warnings.append(f"calibration {self.path} is a CPU profile: its CPU-measured params "
                            f"({', '.join(measured) or 'none'}) are not applied to GPU runs (defaults kept)"
                            + (f"; its other params ({', '.join(others)}) are, though they were fitted on a CPU"
                               if others else ""))
        if self.gpu_overrides or self.cluster_overrides:
            warnings.append(f"only the params of calibration {self.path} apply here; its GPU and link "
                            "overrides are for one machine and are not used")
        return params, warnings


def _overrides(path, data: dict, key: str, ranges: dict[str, Range]) -> tuple[tuple[str, float], ...]:
    known = tuple(ranges)
    values = data.get(key, {})
    if not isinstance(values, dict):
        raise PlaitError(f"{path}: {key} must be an object")
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise PlaitError(f"{path}: bad {key} (unknown fields {unknown}; known: {', '.join(known)})")
    bad = {k: v for k, v in values.items() if isinstance(v, bool) or not isinstance(v, (int, float))}
    if bad:
        raise PlaitError(f"{path}: {key} must be numbers, got {bad}")
    try:
        check_ranges(key, values, ranges)
    except PlaitError as exc:
        raise PlaitError(f"{path}: {exc}") from None
    return tuple(sorted((k, float(v)) for k, v in values.items()))


def _gpu_preset(path, gpu, device: str) -> str | None:
    """The file's "gpu": a known preset name (aliases resolved), or None; a CPU profile has none."""
    from plait.spec.hardware import GPUS, get_gpu

    if gpu is None:
        return None
    if not isinstance(gpu, str):
        raise PlaitError(f"{path}: \"gpu\" must be a GPU preset name or null, got {gpu!r}")
    if device == "cpu":
        raise PlaitError(f"{path}: a CPU profile (\"device\": \"cpu\") has \"gpu\": null, got {gpu!r}")
    try:
        return get_gpu(gpu).name
    except PlaitError:
        raise PlaitError(f"{path}: \"gpu\" {gpu!r} is not a GPU preset; use one of {', '.join(GPUS)} "
                         "(or null for a CPU profile)") from None


def read_calibration(path: str | Path) -> Calibration:
    """Read a calibration JSON (``plait profile``, ``plait calibrate fit`` or hand-written)::

        {"gpu": "h100-sxm" | null, "device": "cuda" | "cpu", "params": {CostParams fields},
         "processes_per_node": P, "threads_per_process": T,
         "gpu_overrides": {GpuSpec fields}, "cluster_overrides": {ClusterSpec link fields}, ...}

    Every key is optional; other keys (measurements, machine, versions) are kept for people. A
    ``"format"`` other than ``FORMAT`` is refused; a file without one (hand-written, or older) is read.
    Files written before the GEMM roofline (no ``params.gemm_bandwidth_factor``, no
    ``"gemm_coverage"``: {"flops", "bytes", "m": [low, high], "element_bytes"}) read as before: the
    factor defaults to 1.0 (the GEMMs' bytes at the element-wise rate, the old behaviour) and no
    coverage warning is given.
    Values are range-checked (``PARAM_RANGES``, ``GPU_RANGES``, ``CLUSTER_RANGES``: finite, positive
    rates and capacities, efficiencies in (0, 1]) and "gpu" must be a known preset or null.
    """
    data = read_json_file(path, "calibration file", finite=False)  # every number is range-checked by name below
    if not isinstance(data, dict) or not isinstance(data.get("params", {}), dict):
        raise PlaitError(f"{path}: a calibration file holds a JSON object with a \"params\" object")
    if data.get("format", FORMAT) != FORMAT:
        raise PlaitError(f"{path}: not a plait calibration file (format {data['format']!r}, expected {FORMAT!r})")
    try:
        params = CostParams.from_dict(data.get("params", {}))
    except PlaitError as exc:
        raise PlaitError(f"{path}: {exc}") from None
    device = data.get("device", "")
    if device not in ("", "cuda", "cpu"):
        raise PlaitError(f"{path}: \"device\" must be \"cuda\" or \"cpu\", got {device!r}")
    gpu = _gpu_preset(path, data.get("gpu"), device)
    counts = {}
    for key in ("processes_per_node", "threads_per_process"):
        value = data.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise PlaitError(f"{path}: \"{key}\" must be a positive whole number, got {value!r}")
        counts[key] = value
    coverage = None
    if data.get("gemm_coverage") is not None:
        try:
            coverage = GemmCoverage.from_dict(data["gemm_coverage"])
        except ValueError as exc:
            raise PlaitError(f"{path}: bad gemm_coverage ({exc})") from None
    return Calibration(params=params, gpu=gpu, device=device, path=str(path), **counts, gemm_coverage=coverage,
                       gpu_overrides=_overrides(path, data, "gpu_overrides", GPU_RANGES),
                       cluster_overrides=_overrides(path, data, "cluster_overrides", CLUSTER_RANGES))


def write_calibration(path: str | Path, data: dict) -> None:
    """Write a calibration file (``data`` as built by ``plait profile`` / ``plait calibrate fit``,
    tagged with ``FORMAT``); the parent directory is created; one-line PlaitError on failure."""
    if data.get("format", FORMAT) != FORMAT:
        raise PlaitError(f"cannot write {path}: format {data['format']!r} is not {FORMAT!r}")
    body = {"format": FORMAT, **data}
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PlaitError(f"cannot write {path}: {exc}") from None
    atomic_write_text(path, json.dumps(body, indent=2) + "\n", "calibration file")
