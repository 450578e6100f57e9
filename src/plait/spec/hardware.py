"""GpuSpec and ClusterSpec: the hardware as plain data. Units: FLOP/s, bytes, bytes/s, seconds.

Peaks are the vendors' *dense* figures (sparse peaks are twice these and are never used).
Bandwidths are per GPU and per direction. ``gemm_efficiency`` and friends are the achievable
fractions that the cost model starts from; a calibration file (``plait profile``) replaces them.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

from plait.errors import PlaitError
from plait.spec.gpu_names import preset_name
from plait.spec.serialize import dataclass_from_dict, parse_json, read_json_file

from plait.spec.units import GB, GIB

# (lowest allowed, whether the lowest itself is allowed, highest) of each number field.
_POSITIVE, _NON_NEGATIVE, _FRACTION = (0.0, False, math.inf), (0.0, True, math.inf), (0.0, False, 1.0)
# collectives whose bus bandwidth a cluster may give relative to the all-reduce's: op -> ClusterSpec field
OP_BANDWIDTH_FACTORS = {op: f"{op}_bandwidth_factor" for op in ("all_gather", "reduce_scatter", "all_to_all", "send_recv")}


def _number_problems(spec, ranges: dict[str, tuple[float, bool, float]]) -> list[str]:
    """'field=value must be ...' for every field of ``spec`` that is not a finite number in range."""
    problems = []
    for field, (low, low_ok, high) in ranges.items():
        value = getattr(spec, field)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            problems.append(f"{field}={value!r} must be a number")
        elif not (math.isfinite(value) and (value >= low if low_ok else value > low) and value <= high):
            what = ("in (0, 1]" if high == 1.0 else f"in [{low:g}, {high:g}]" if math.isfinite(high)
                    else "at least 0" if low_ok else "positive")
            problems.append(f"{field}={value!r} must be finite and {what}")
    return problems


MAX_GPUS = 2**24  # GPUs in a job (and in a node): 16.7 M; more only overflows the planner's loops


def _count_problems(spec, fields: tuple[str, ...]) -> list[str]:
    """'field=value must be a positive integer' for every such field of ``spec`` that is not one."""
    return [f"{field}={getattr(spec, field)!r} must be a positive integer at most {MAX_GPUS}" for field in fields
            if isinstance(getattr(spec, field), bool) or not isinstance(getattr(spec, field), int)
            or not 1 <= getattr(spec, field) <= MAX_GPUS]


def _name_problems(spec) -> list[str]:
    return [] if isinstance(spec.name, str) and spec.name else [f"name={spec.name!r} must be a non-empty string"]


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator.

    Attributes:
        bf16_flops: dense bf16/fp16 tensor-core peak, FLOP/s (the MFU denominator).
        fp8_flops: dense fp8 peak, FLOP/s (0 when the GPU has no fp8 tensor cores).
        hbm_bytes: memory capacity visible to the framework, bytes.
        hbm_bandwidth: memory bandwidth, bytes/s.
        gemm_efficiency: fraction of the bf16 peak reached by large, well-shaped GEMMs.
        attention_efficiency: fraction of the peak reached by the FlashAttention forward kernel.
        memory_efficiency: fraction of ``hbm_bandwidth`` reached by element-wise kernels.
        kernel_overhead: fixed cost per kernel launch and tail, seconds.
        fp4_flops: dense fp4 peak (nvfp4 GEMMs), FLOP/s (0 when the GPU has no fp4 tensor cores).
        element_bytes: bytes per element of activations, GEMM operands and gathered weights in
            the dtype plait's runtime computes in on this device: 2 (bf16 autocast, every GPU
            preset); 4 on a CPU, where the runtime computes in fp32 (a CPU profile writes 4).
        power_derate: sustained tensor-core clock of this part under its power cap over the
            full-power part of its generation (1.0; the 500 W H100: 0.85). Its ``gemm_efficiency``
            and ``attention_efficiency`` already include it; it scales what is given per
            generation elsewhere: the low-precision GEMM rate (``CostParams.fp8_gemm_efficiency``
            is a full-power part's) and a software stack's attention efficiency (``Stack.gpu``).
    """

    name: str
    bf16_flops: float
    fp8_flops: float
    hbm_bytes: float
    hbm_bandwidth: float
    gemm_efficiency: float = 0.80
    attention_efficiency: float = 0.60
    memory_efficiency: float = 0.80
    kernel_overhead: float = 6e-6
    element_bytes: float = 2.0
    fp4_flops: float = 0.0
    power_derate: float = 1.0

    RANGES = {"fp4_flops": _NON_NEGATIVE, "bf16_flops": _POSITIVE, "fp8_flops": _NON_NEGATIVE, "hbm_bytes": _POSITIVE,
              "hbm_bandwidth": _POSITIVE, "gemm_efficiency": _FRACTION, "attention_efficiency": _FRACTION,
              "memory_efficiency": _FRACTION, "kernel_overhead": _NON_NEGATIVE,
              "element_bytes": (1.0, True, 8.0), "power_derate": _FRACTION}

    def __post_init__(self) -> None:
        problems = _name_problems(self) + _number_problems(self, self.RANGES)
        if problems:
            raise PlaitError(f"gpu {self.name!r}: " + "; ".join(problems))

    def peak_flops(self, precision: str = "bf16") -> float:
        """Dense peak for the GEMMs of a run in ``precision`` (bf16/fp16, fp8/mxfp8 or nvfp4), FLOP/s."""
        if precision == "nvfp4":
            if self.fp4_flops <= 0:
                raise PlaitError(f"{self.name} has no fp4 tensor cores; use precision=fp8 or bf16")
            return self.fp4_flops
        if precision in ("fp8", "mxfp8"):
            if self.fp8_flops <= 0:
                raise PlaitError(f"{self.name} has no fp8 tensor cores; use precision=bf16")
            return self.fp8_flops
        return self.bf16_flops


@dataclass(frozen=True)
class ClusterSpec:
    """N GPUs of one type, ``gpus_per_node`` per node.

    Attributes:
        intra_node_bandwidth: NVLink/NVSwitch (or Infinity Fabric) bandwidth per GPU per
            direction, bytes/s.
        inter_node_bandwidth: bandwidth of one network NIC per direction, bytes/s (what one GPU
            alone reaches across nodes: ``plait profile`` measures it with one rank per node).
        gpus_per_nic: GPUs that share one NIC (1 on DGX A100/H100/B200: one 200/400 Gb/s NIC per
            GPU; 2 on a Frontier node: 4 NICs for 8 GCDs). A GPU's network bandwidth - its NIC
            share - is ``inter_node_bandwidth / gpus_per_nic`` (``nic_share``).
        intra_node_latency / inter_node_latency: per-hop latency of a collective step, seconds.
        host_link_bandwidth: GPU <-> host (PCIe) bandwidth per GPU per direction, bytes/s.
        link_efficiency: fraction of link bandwidth a large collective reaches (bus bandwidth).
        n_gpus: GPUs in the job (``plait plan --gpus`` sets it).
        all_gather_bandwidth_factor / reduce_scatter_bandwidth_factor / all_to_all_bandwidth_factor /
            send_recv_bandwidth_factor: the bus bandwidth that op reaches as a multiple of the
            all-reduce's (which the link fields above describe), on every level. 1.0 on every
            preset: NCCL reaches about the same bus bandwidth on each op. ``plait profile`` writes
            what it measured (gloo on a 2-core CPU: reduce-scatter 0.3-0.4x the all-reduce's).
    """

    name: str
    gpu: GpuSpec
    gpus_per_node: int
    intra_node_bandwidth: float
    inter_node_bandwidth: float
    intra_node_latency: float = 5e-6
    inter_node_latency: float = 12e-6
    host_link_bandwidth: float = 25 * GB
    link_efficiency: float = 0.80
    n_gpus: int = 8
    gpus_per_nic: int = 1
    all_gather_bandwidth_factor: float = 1.0
    reduce_scatter_bandwidth_factor: float = 1.0
    all_to_all_bandwidth_factor: float = 1.0
    send_recv_bandwidth_factor: float = 1.0

    RANGES = {"intra_node_bandwidth": _POSITIVE, "inter_node_bandwidth": _POSITIVE,
              **{field: _POSITIVE for field in OP_BANDWIDTH_FACTORS.values()},
              "intra_node_latency": _NON_NEGATIVE, "inter_node_latency": _NON_NEGATIVE,
              "host_link_bandwidth": _POSITIVE, "link_efficiency": _FRACTION}

    def __post_init__(self) -> None:
        problems = _name_problems(self) + _count_problems(self, ("gpus_per_node", "n_gpus", "gpus_per_nic"))
        if not isinstance(self.gpu, GpuSpec):
            problems.append(f"gpu={self.gpu!r} must be a GPU preset name or an object of GPU fields")
        problems += _number_problems(self, self.RANGES)
        if problems:
            raise PlaitError(f"cluster {self.name!r}: " + "; ".join(problems))
        value = self.gpus_per_nic
        if value > self.gpus_per_node:
            raise PlaitError(f"cluster {self.name}: gpus_per_nic={value} is more than the node's "
                             f"{self.gpus_per_node} GPUs")

    @property
    def nic_share(self) -> float:
        """Network bandwidth of one GPU per direction: its share of its NIC, bytes/s."""
        return self.inter_node_bandwidth / self.gpus_per_nic

    def with_gpus(self, n_gpus: int) -> ClusterSpec:
        return dataclasses.replace(self, n_gpus=int(n_gpus))

    @property
    def n_nodes(self) -> int:
        return max(1, -(-self.n_gpus // self.gpus_per_node))

    # --------------------------------------------------------- serialization
    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ClusterSpec:
        if not isinstance(data, dict):
            raise PlaitError("cluster spec must be a JSON object")
        data = dict(data)
        gpu = data.pop("gpu", None)
        if isinstance(gpu, str):
            gpu_spec = get_gpu(gpu)
        elif isinstance(gpu, dict):
            gpu_spec = dataclass_from_dict(GpuSpec, gpu, "gpu")
        else:
            raise PlaitError("cluster spec needs a 'gpu': a preset name or an object of GPU fields")
        return dataclass_from_dict(cls, {**data, "gpu": gpu_spec}, "cluster")

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text: str) -> ClusterSpec:
        return cls.from_dict(parse_json(text))


# ------------------------------------------------------------------------------------ presets
# Peaks and capacities from the vendors' data sheets (dense, no sparsity):
#   A100 SXM: 312 TFLOP/s bf16, 40 GiB HBM2 1.555 TB/s or 80 GiB HBM2e 2.039 TB/s, NVLink3 600 GB/s.
#   A800: A100 80 GB with NVLink cut to 400 GB/s.  H800: H100 SXM with NVLink cut to 400 GB/s.
#   H100 SXM: 989 TFLOP/s bf16, 1979 fp8, 80 GiB HBM3 3.35 TB/s, NVLink4 900 GB/s.
#   H100 96 GB HBM2e, 500 W (Meta Grand Teton): same chip, 2.4 TB/s, power-capped clocks.
#   H200: H100 silicon with 141 GB HBM3e at 4.8 TB/s.
#   B200 (HGX, 1000 W): 2250 TFLOP/s bf16, 4500 fp8, 9000 fp4 (HGX B200: 144 PFLOP/s sparse FP4 for 8 GPUs),
#   180 GB HBM3e 8 TB/s, NVLink5 1.8 TB/s.
#   A100 80GB PCIe: 312 TFLOP/s, 80 GiB HBM2e 1.935 TB/s (A100 PCIe datasheet); no NVSwitch (PCIe Gen4,
#   32 GB/s per direction between cards; NVLink bridges join pairs only).
#   H100 PCIe: 756 TFLOP/s bf16, 1513 fp8, 80 GiB HBM2e 2.0 TB/s, PCIe Gen5 64 GB/s (H100 datasheet).
#   H100 NVL: 835 TFLOP/s bf16, 1671 fp8 (lower clocks, 350-400 W), 94 GB HBM3 3.9 TB/s, PCIe Gen5.
#   The 96 GB HBM2e H100 of Meta's Grand Teton (torchtitan benchmarks: 2.4 TB/s, 500 W cap) is the SXM
#   chip with HBM2e: same peak, less bandwidth, clocks lowered by the power cap (derated efficiencies).
#   GB200 (NVL72 datasheet, per Blackwell GPU): 2.5 PFLOP/s bf16, 5 fp8, 10 fp4 (1440 PFLOP/s sparse FP4
#   / 72 / 2), 186 GB HBM3e (13.4 TB / 72)
#   8 TB/s, NVLink5 1.8 TB/s bidirectional; its 72-GPU NVLink domain is modelled as nodes of 64 (what
#   jobs use of a rack).
#   GB300 (Blackwell Ultra, NVL72 datasheet, per GPU): 2.5 PFLOP/s bf16 (360 PFLOP/s sparse / 72 / 2), 5 fp8
#   (720 / 72 / 2), 15 fp4 (1080 PFLOP/s dense FP4 / 72), 288 GB HBM3e (20.7 TB / 72) 8 TB/s, NVLink5 as
#   GB200; one ConnectX-8 800 Gb/s NIC per GPU. Its doubled softmax exponent rate is not priced (the
#   attention efficiency stays Blackwell's).
#   MI300X: 1307 TFLOP/s bf16, 2615 fp8 dense, 192 GB HBM3 5.3 TB/s, 7 Infinity Fabric links of
#   64 GB/s per direction to the other 7 GPUs (448 GB/s per GPU; AMD MI300X datasheet).
#   V100 SXM2: 125 TFLOP/s fp16 tensor (no bf16: fp16 is its mixed precision), 32 or 16 GB HBM2 900 GB/s,
#   NVLink2 300 GB/s bidirectional; DGX-1: 8 GPUs in a hybrid cube mesh, 4x EDR 100 Gb/s NICs (2 GPUs
#   per 12.5 GB/s NIC). Efficiencies unvalidated (as for the other parts without calibration rows).
#   MI250X, per GCD (what the framework sees as one device): 191.5 TFLOP/s bf16, 64 GiB at
#   1.6 TB/s; GCDs of a node talk over Infinity Fabric (~100 GB/s per GCD per direction).
# NVLink bandwidths quoted bidirectional are halved to per-direction.
# Achievable fractions (gemm_efficiency, attention_efficiency) are sustained end-to-end values,
# fitted once on the published-runs calibration set (shared/data) with one value per GPU
# generation: A100 GEMMs 0.74 of peak (~230 TFLOP/s), H100 0.65 (~640 TFLOP/s, power-limited),
# FlashAttention forward 0.35 (A100) and 0.22 (H100) of peak on causal FLOPs - the kernels of
# 2021-2024 (Megatron softmax, Triton and FlashAttention-2). The 500 W H100 is derated by its
# power cap (x0.85, ``H100_500W_DERATE``: every tensor-core rate, bf16, attention and fp8 alike). Newer parts (H200, B200) and MI250X use the same reasoning, unvalidated:
# run ``plait profile`` to replace them with measurements.
_A100 = dict(gemm_efficiency=0.74, attention_efficiency=0.35)
_H100 = dict(gemm_efficiency=0.65, attention_efficiency=0.22)
H100_500W_DERATE = 0.85
_H100_500W = dict(gemm_efficiency=round(_H100["gemm_efficiency"] * H100_500W_DERATE, 2),
                  attention_efficiency=round(_H100["attention_efficiency"] * H100_500W_DERATE, 2),
                  power_derate=H100_500W_DERATE)
# GPU generations (what a software stack's kernel rates are given for: ``plait.spec.stack``), by preset
GPU_GENERATIONS = {"a100": ("a100-40g", "a100-80g", "a800", "a100-80g-pcie"),
                   "h100": ("h100-sxm", "h100-96g-500w", "h800", "h200", "h100-pcie", "h100-nvl"),
                   "b200": ("b200", "gb200", "gb300")}
GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in [
        GpuSpec("a100-40g", 312e12, 0.0, 40 * GIB, 1.555e12, **_A100),
        GpuSpec("a100-80g", 312e12, 0.0, 80 * GIB, 2.039e12, **_A100),
        GpuSpec("a800", 312e12, 0.0, 80 * GIB, 2.039e12, **_A100),
        GpuSpec("h100-sxm", 989e12, 1979e12, 80 * GIB, 3.35e12, **_H100),
        GpuSpec("h100-96g-500w", 989e12, 1979e12, 96 * GB, 2.4e12, **_H100_500W),
        GpuSpec("h800", 989e12, 1979e12, 80 * GIB, 3.35e12, **_H100),
        GpuSpec("h200", 989e12, 1979e12, 141 * GB, 4.8e12, **_H100),
        GpuSpec("b200", 2250e12, 4500e12, 180 * GB, 8.0e12, gemm_efficiency=0.62, attention_efficiency=0.22,
                fp4_flops=9000e12),
        GpuSpec("a100-80g-pcie", 312e12, 0.0, 80 * GIB, 1.935e12, **_A100),
        GpuSpec("h100-pcie", 756e12, 1513e12, 80 * GIB, 2.0e12, **_H100),
        GpuSpec("h100-nvl", 835e12, 1671e12, 94 * GB, 3.9e12, **_H100),
        GpuSpec("gb200", 2500e12, 5000e12, 186 * GB, 8.0e12, gemm_efficiency=0.62, attention_efficiency=0.22,
                fp4_flops=10000e12),
        GpuSpec("gb300", 2500e12, 5000e12, 288 * GB, 8.0e12, gemm_efficiency=0.62, attention_efficiency=0.22,
                fp4_flops=15000e12),
        GpuSpec("mi300x", 1307e12, 2615e12, 192 * GB, 5.3e12, gemm_efficiency=0.50, attention_efficiency=0.20),
        GpuSpec("v100-32g", 125e12, 0.0, 32 * GIB, 0.9e12, gemm_efficiency=0.70, attention_efficiency=0.30),
        GpuSpec("v100-16g", 125e12, 0.0, 16 * GIB, 0.9e12, gemm_efficiency=0.70, attention_efficiency=0.30),
        GpuSpec("mi250x", 191.5e12, 0.0, 64 * GIB, 1.6e12, gemm_efficiency=0.55, attention_efficiency=0.25),
    ]
}

CLUSTERS: dict[str, ClusterSpec] = {
    c.name: c
    for c in [
        # Network: ``inter_node_bandwidth`` is one NIC; ``gpus_per_nic`` how many GPUs share it.
        # DGX A100: 8 GPUs, NVSwitch, 8x HDR 200 Gb/s InfiniBand compute NICs, one per GPU
        # (25 GB/s per GPU; NVIDIA DGX A100 user guide / SuperPOD reference architecture), PCIe Gen4.
        ClusterSpec("dgx-a100", GPUS["a100-80g"], 8, 300 * GB, 25 * GB, host_link_bandwidth=25 * GB),
        ClusterSpec("dgx-a100-40g", GPUS["a100-40g"], 8, 300 * GB, 25 * GB, host_link_bandwidth=25 * GB),
        ClusterSpec("hgx-a800", GPUS["a800"], 8, 200 * GB, 25 * GB, host_link_bandwidth=25 * GB),
        # DGX H100: NVLink4 via NVSwitch, 8x NDR 400 Gb/s ConnectX-7, one per GPU (50 GB/s per GPU;
        # DGX H100 user guide), PCIe Gen5. HGX A800/H800 boards: one NIC per GPU assumed.
        ClusterSpec("dgx-h100", GPUS["h100-sxm"], 8, 450 * GB, 50 * GB, host_link_bandwidth=50 * GB),
        ClusterSpec("hgx-h800", GPUS["h800"], 8, 200 * GB, 50 * GB, host_link_bandwidth=50 * GB),
        # Meta Grand Teton: 8x H100 96 GB HBM2e (500 W), one 400 Gb/s RoCE NIC per GPU (Llama 3 paper).
        ClusterSpec("grand-teton-h100", GPUS["h100-96g-500w"], 8, 450 * GB, 50 * GB, host_link_bandwidth=50 * GB),
        ClusterSpec("dgx-h200", GPUS["h200"], 8, 450 * GB, 50 * GB, host_link_bandwidth=50 * GB),
        # DGX B200: NVLink5 1.8 TB/s bidirectional, 8x 400 Gb/s ConnectX-7, one per GPU.
        ClusterSpec("dgx-b200", GPUS["b200"], 8, 900 * GB, 50 * GB, host_link_bandwidth=50 * GB),
        # PCIe servers: 8 cards, collectives over PCIe (Gen4 32 GB/s, Gen5 64 GB/s per direction), one NIC per GPU.
        ClusterSpec("pcie-a100", GPUS["a100-80g-pcie"], 8, 32 * GB, 25 * GB, host_link_bandwidth=25 * GB),
        ClusterSpec("pcie-h100", GPUS["h100-pcie"], 8, 64 * GB, 50 * GB, host_link_bandwidth=50 * GB),
        ClusterSpec("pcie-h100-nvl", GPUS["h100-nvl"], 8, 64 * GB, 50 * GB, host_link_bandwidth=50 * GB),
        # GB200 NVL72: one NVLink5 domain per rack, of which jobs use 64 GPUs (plait.measure.validate.moe.
        # nvlink_domain reads published GB200 runs the same way), one 400 Gb/s NIC per GPU.
        # host link: NVLink-C2C between each Grace CPU and its two Blackwell GPUs, 900 GB/s bidirectional
        # per superchip (GB200 NVL72 datasheet): 225 GB/s per GPU and direction, not PCIe
        ClusterSpec("gb200-nvl72", GPUS["gb200"], 64, 900 * GB, 50 * GB, host_link_bandwidth=225 * GB),
        # GB300 NVL72: the same rack and C2C host link, one ConnectX-8 800 Gb/s NIC per GPU (100 GB/s).
        ClusterSpec("gb300-nvl72", GPUS["gb300"], 64, 900 * GB, 100 * GB, host_link_bandwidth=225 * GB),
        # 8x MI300X (OAM, Infinity Fabric mesh), one 400 Gb/s NIC per GPU.
        ClusterSpec("mi300x-8", GPUS["mi300x"], 8, 448 * GB, 50 * GB, host_link_bandwidth=50 * GB),
        ClusterSpec("dgx1-v100", GPUS["v100-32g"], 8, 150 * GB, 12.5 * GB, host_link_bandwidth=12 * GB,
                    gpus_per_nic=2),
        ClusterSpec("dgx1-v100-16g", GPUS["v100-16g"], 8, 150 * GB, 12.5 * GB, host_link_bandwidth=12 * GB,
                    gpus_per_nic=2),
        # Frontier node: 4 MI250X = 8 GCDs, 4 Slingshot-11 NICs of 25 GB/s, one per MI250X, so
        # 2 GCDs per NIC (12.5 GB/s per GCD; OLCF Frontier user guide).
        ClusterSpec("frontier", GPUS["mi250x"], 8, 50 * GB, 25 * GB, host_link_bandwidth=36 * GB, gpus_per_nic=2),
    ]
}

# Cluster preset used for a GPU when only the GPU is known.
DEFAULT_CLUSTER_FOR_GPU: dict[str, str] = {
    "a100-40g": "dgx-a100-40g",
    "a100-80g": "dgx-a100",
    "a800": "hgx-a800",
    "h100-sxm": "dgx-h100",
    "h100-96g-500w": "grand-teton-h100",
    "h800": "hgx-h800",
    "h200": "dgx-h200",
    "b200": "dgx-b200",
    "mi250x": "frontier",
    "a100-80g-pcie": "pcie-a100",
    "h100-pcie": "pcie-h100",
    "h100-nvl": "pcie-h100-nvl",
    "gb200": "gb200-nvl72",
    "gb300": "gb300-nvl72",
    "mi300x": "mi300x-8",
    "v100-32g": "dgx1-v100",
    "v100-16g": "dgx1-v100-16g",
}


def get_gpu(name: str) -> GpuSpec:
    """A GPU preset by its name or by a name as sources write it (``plait.spec.gpu_names``)."""
    key = preset_name(name, GPUS)
    if key in GPUS:
        return GPUS[key]
    raise PlaitError(f"unknown GPU {name!r}; known GPUs: {', '.join(GPUS)}")


def get_cluster(name: str, n_gpus: int | None = None) -> ClusterSpec:
    """A cluster preset by name, or a JSON file of ClusterSpec fields (``gpu`` may be a preset name)."""
    if name in CLUSTERS:
        cluster = CLUSTERS[name]
    elif name.endswith(".json") or Path(name).is_file():
        data = read_json_file(name, "cluster file")
        if not isinstance(data, dict):
            raise PlaitError(f"{name}: a cluster file holds a JSON object")
        cluster = ClusterSpec.from_dict(data)
    else:
        raise PlaitError(f"unknown cluster {name!r}; known clusters: {', '.join(CLUSTERS)} (or a JSON file)")
    return cluster.with_gpus(n_gpus) if n_gpus is not None else cluster


def cluster_for_gpu(gpu_name: str, n_gpus: int, gpus_per_node: int | None = None) -> ClusterSpec:
    """The default cluster of a GPU type (used by the published-runs validator)."""
    gpu = get_gpu(gpu_name)
    cluster = CLUSTERS[DEFAULT_CLUSTER_FOR_GPU[gpu.name]].with_gpus(n_gpus)
    if gpus_per_node and gpus_per_node != cluster.gpus_per_node:
        cluster = dataclasses.replace(cluster, gpus_per_node=int(gpus_per_node))
    return cluster
