"""``plait profile``: micro-benchmark the machine at hand and write a calibration file.

What is measured (sizes from the planned model and sequence length; ``--quick``: fewer, smaller):
GEMMs of the model's QKV, attention-output and MLP projections at several token counts (and at
a tensor-parallel split when the node has several devices), causal attention (sdpa; Flash on
GPU) at the planned sequence lengths, device copies, kernel launches, pinned host copies (GPU),
and all-reduce, all-gather, reduce-scatter, all-to-all and send/recv over each node's processes
and, with several nodes, across nodes. The workers run through torchrun
(``plait.measure.profile.worker``), NCCL on GPU and gloo on CPU.

The file (``FORMAT``) holds what ``plait plan --calibration`` reads (``gpu``, ``device``,
``params``, ``gpu_overrides``, ``cluster_overrides``; see ``plait.measure.profile.fit``) and the
raw measurements, the fits, the machine, the versions and the date. On CPU, ``gpu`` is null and
``device`` is "cpu": a CPU profile, which the planner applies with a warning to a GPU cluster.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from plait.errors import PlaitError
from plait.plan.calibration import FORMAT
from plait.plan.coverage import gemm_bytes, gemm_flops, projection_shapes
from plait.spec.model import ModelSpec
from plait.spec.units import KIB, MIB

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
COMPUTE_WAIT_S = 3600.0  # extra patience of the other ranks during rank 0's compute benchmarks


@dataclass(frozen=True)
class Where:
    """Where the profile runs: device, processes per node, nodes, and the GPU preset (None on CPU)."""

    device: str  # "cpu" | "cuda"
    nproc_per_node: int
    nnodes: int = 1
    gpu: str | None = None
    device_name: str | None = None


# On a CPU every size is capped to keep ``plait profile`` short (one GEMM or attention call <= this
# many FLOPs; ~20 GFLOP/s per process; how long it takes is not promised: ``workload`` says what it
# runs, and its short training runs take most of a CPU profile's minutes): a CPU profile tests
# the pipeline and describes the CPU, it does not need the planned model's full-size shapes.
CPU_MAX_FLOPS = 2.5e9
CPU_QUICK_MAX_FLOPS = 2.5e8
CPU_MAX_BYTES = 256 * MIB  # and its fp32 operands at most this (an 8B model's LM head: 2 GiB)
CPU_TOKENS = [1, 4, 16, 64, 128, 256, 512, 1024, 2048]
CPU_QUICK_TOKENS = [16, 128, 1024]


# The default shape set (every profile measures it beside the planned model's): the projections of
# these presets, so that a profile covers tiny through 8B GEMMs whatever --model names.
REFERENCE_MODELS = ("tiny", "llama3-8b")
# The planned model's projections are also measured with k and n each scaled by these: k·n x1/4 and x4.
SHAPE_SPREAD = (0.5, 2.0)


def _kept_tokens(tokens: list[int], k: int, n: int, max_flops: float, max_bytes: float,
                 element_bytes: float) -> list[int]:
    """The token counts whose (m×k)·(k×n) GEMM is at most ``max_flops`` (the two smallest always, so
    that each shape has a curve) and its operands at most ``max_bytes``."""
    counts = sorted(set(tokens))
    return [t for i, t in enumerate(counts)
            if (i < 2 or gemm_flops(t, k, n) <= max_flops) and gemm_bytes(t, k, n, element_bytes) <= max_bytes]


def gemm_cases(model: ModelSpec, tokens: list[int], tps: list[int], max_flops: float = math.inf,
               max_bytes: float = math.inf, element_bytes: float = 2.0, spread: tuple[float, ...] = (),
               references: tuple[str, ...] = ()) -> list[dict]:
    """The GEMMs to time: ``model``'s projections and LM head (``plait.plan.coverage.projection_shapes``,
    as the planner prices them) per tp split, each also with k and n scaled by every factor of
    ``spread`` (tp=1), and the projections of the ``references`` presets (tp=1), at each token count
    of ``tokens`` that ``_kept_tokens`` keeps under ``max_flops`` FLOPs and ``max_bytes`` operand
    bytes; dicts with name, m, k, n, tp, model, scale (k·n over the model's), each shape once."""
    from plait.spec.models import get_model

    cases, seen = [], set()
    specs = [(model, tps, spread)] + [(get_model(r), [1], ()) for r in references if r != model.name]
    for spec, spec_tps, factors in specs:
        for tp in spec_tps:
            if spec.n_kv_heads % tp or spec.ffn_hidden % tp:
                continue
            for name, k, n in projection_shapes(spec, tp):
                scaled = [(k, n, 1.0)] + ([(max(1, round(k * f)), max(1, round(n * f)), f * f) for f in factors]
                                          if tp == 1 else [])
                for kk, nn, scale in scaled:
                    for t in _kept_tokens(tokens, kk, nn, max_flops, max_bytes, element_bytes):
                        if (t, kk, nn) not in seen:
                            seen.add((t, kk, nn))
                            cases.append({"name": name, "m": t, "k": kk, "n": nn, "tp": tp, "model": spec.name,
                                          "scale": scale})
    order = {name: i for i, name in enumerate(("qkv", "attn_out", "mlp_up", "mlp_down", "head"))}
    return sorted(cases, key=lambda c: (c["tp"], c["m"], order[c["name"]], c["k"] * c["n"]))


def attention_flops(case: dict) -> float:
    """The planner's causal count of one attention forward: 4·b·heads·d·s·(s+1)/2 FLOPs."""
    s = case["seq_len"]
    return 4.0 * case["batch"] * case["heads"] * case["head_dim"] * s * (s + 1) / 2.0


def attention_cases(model: ModelSpec, seq_len: int, tokens: int, quick: bool,
                    max_flops: float = math.inf) -> list[dict]:
    """Causal attention at the planned length and its halvings: the largest 2 (quick) or 3 whose
    forward is at most ``max_flops`` (the batch halves first, to ``tokens`` / s at most)."""
    wanted, cases, s = (2 if quick else 3), [], seq_len
    while len(cases) < wanted and s >= 16:
        case = {"batch": max(1, tokens // s), "heads": model.n_heads, "seq_len": s, "head_dim": model.head_dim}
        while case["batch"] > 1 and attention_flops(case) > max_flops:
            case["batch"] //= 2
        if attention_flops(case) <= max_flops:
            cases.append(case)
        s //= 2
    if not cases:  # even s=16 is over the cap: time the shortest anyway
        cases = [{"batch": 1, "heads": model.n_heads, "seq_len": max(16, s * 2), "head_dim": model.head_dim}]
    return sorted(cases, key=lambda c: c["seq_len"])


HOST_OVERHEAD_TOKENS = 32  # sequence length (batch 1) of runtime_cost.layer_host_seconds: tiny kernels


def host_overhead_spec(model: ModelSpec) -> ModelSpec:
    """The model whose blocks ``runtime_cost.layer_host_seconds`` times: the ``tiny`` preset, whatever
    is planned - the runtime's host time per op hardly depends on the sizes, and tiny kernels keep
    the planner's kernel terms (and their errors) out of what is measured as host time."""
    from plait.spec.models import get_model

    tiny = get_model("tiny")
    return dataclasses.replace(tiny, max_seq_len=max(tiny.max_seq_len, HOST_OVERHEAD_TOKENS))


# One layout per runtime mechanism whose host time a CPU profile measures over every rank
# (runtime_cost.layer_host_seconds), "{n}" = the profile's processes; a layout the planner's
# rules refuse for the timed model (e.g. tp not dividing its heads) is left out.
HOST_OVERHEAD_LAYOUTS = {"plain": "dp={n}", "tp": "tp={n}", "cp": "cp={n}", "fsdp": "dp={n},zero=2",
                         "sac": "dp={n},ckpt=balanced"}
SINGLE_PROCESS_MECHANISMS = ("plain", "sac")  # the others need two processes or more


def host_overhead_layouts(model: ModelSpec, world: int) -> dict[str, str]:
    """Mechanism -> layout over ``world`` processes for the host-time measurement (for one process
    only those in ``SINGLE_PROCESS_MECHANISMS``)."""
    from plait.spec.hardware import get_cluster
    from plait.spec.layout import JobSpec, Layout
    from plait.spec.validate import errors_of, validate

    cluster = dataclasses.replace(get_cluster("dgx-h100").with_gpus(world), gpus_per_node=world)
    job = JobSpec(global_batch=world, seq_len=HOST_OVERHEAD_TOKENS)
    out = {}
    for mechanism, text in HOST_OVERHEAD_LAYOUTS.items():
        if world < 2 and mechanism not in SINGLE_PROCESS_MECHANISMS:
            continue
        layout = Layout.parse(text.format(n=world))
        if not errors_of(validate(model, cluster, job, layout)):
            out[mechanism] = str(layout)
    return out


DDP_BUCKET_BYTES = 25 * MIB  # torch DistributedDataParallel's default bucket_cap_mb, which plait's runtime keeps
BUCKET_COMPUTE_OVER_COMM = 3.0  # the bucket trial's compute against its all-reduces: the compute is the longer side


def gradient_bucket_bytes(model: ModelSpec, element_bytes: int = 4) -> int:
    """Bytes of one gradient all-reduce that DDP overlaps with the backward on a CPU run: a full
    bucket, or all of ``model``'s fp32 gradients when they fit in one."""
    return min(DDP_BUCKET_BYTES, element_bytes * model.total_params())


def scope_groups(where: Where) -> list[tuple[str, list[list[int]]]]:
    """Rank lists of each scope: 'intra' (each node's processes) and 'inter' (one per node)."""
    n, nodes = where.nproc_per_node, where.nnodes
    scopes = []
    if n > 1:
        scopes.append(("intra", [[node * n + i for i in range(n)] for node in range(nodes)]))
    if nodes > 1:
        scopes.append(("inter", [[node * n + i for node in range(nodes)] for i in range(n)]))
    return scopes


def profile_config(model: ModelSpec, seq_len: int, where: Where, quick: bool, timeout_s: float) -> dict:
    """What the workers measure, as JSON-ready data (``limits``: what was capped on a CPU, in words)."""
    gpu = where.device == "cuda"
    if gpu:
        tokens = [1024, 8192] if quick else [1, 64, 512, 2048, 8192, 32768]
        tps = [1] if quick or where.nproc_per_node == 1 else [1, where.nproc_per_node]
        memory = [256 * MIB] if quick else [256 * MIB, 1024 * MIB]
        sizes = [64 * KIB, 4 * MIB, 64 * MIB] if quick else [KIB * 4**k for k in range(10)]
        attention_tokens = 8192 if quick else 32768
        cap = math.inf
    else:
        tokens = CPU_QUICK_TOKENS if quick else CPU_TOKENS
        tps = [1]
        memory = [8 * MIB, 32 * MIB] if quick else [16 * MIB, 64 * MIB]
        sizes = [16 * KIB, 1 * MIB] if quick else [4 * KIB * 4**k for k in range(7)]
        attention_tokens = 1024 if quick else 4096
        cap = CPU_QUICK_MAX_FLOPS if quick else CPU_MAX_FLOPS
    # the planned model's micro-batches (one and four sequences) beside the spread of token counts
    tokens = sorted(set(tokens) | {seq_len, 4 * seq_len})
    gemm = gemm_cases(model, tokens, tps, cap, CPU_MAX_BYTES if not gpu else math.inf, 2.0 if gpu else 4.0,
                      () if quick else SHAPE_SPREAD, () if quick else REFERENCE_MODELS)
    attention = attention_cases(model, seq_len, attention_tokens, quick, cap)
    limits = ""
    if not gpu:
        longest = max(a["seq_len"] for a in attention)
        limits = (f"CPU: sizes capped at {cap / 1e9:.3g} GFLOP per call (GEMMs at {min(g['m'] for g in gemm)}.."
                  f"{max(g['m'] for g in gemm)} tokens, attention up to s={longest} of the planned {seq_len}) "
                  "to keep the profile short")
    # GEMMs and all-reduces at once (runtime_cost.overlap): each side some tens of milliseconds
    overlap = ({"gemm_size": 8192, "reduce_bytes": 64 * MIB, "repeats": 8} if gpu else
               {"gemm_size": 512, "reduce_bytes": 1 * MIB, "repeats": 8})
    # CPU: what hides depends on the size; DDP's gradient buckets behind a longer backward get their own
    buckets = {"gemm_size": 512, "reduce_bytes": gradient_bucket_bytes(model), "repeats": 2,
               "compute_over_comm": BUCKET_COMPUTE_OVER_COMM}
    from plait.measure.profile.cpu_fit import BLOCK_BATCHES

    host_model = host_overhead_spec(model)
    extra = {} if gpu else {"overlap_buckets": buckets,
                            "host_overhead_model": host_model.to_dict(),  # runtime_cost.layer_host_seconds
                            "block_model": host_model.to_dict(),  # runtime_cost.block_seconds
                            "block_batches": list(BLOCK_BATCHES),
                            "host_overhead_tokens": HOST_OVERHEAD_TOKENS,
                            "host_steps": 8 if quick else 24,  # steps of each timed training run
                            "host_rounds": 1 if quick else 3,  # interleaved rounds of them (median)
                            "host_overhead_layouts": host_overhead_layouts(host_model,
                                                                           where.nproc_per_node * where.nnodes)}
    return {
        **extra, "overlap": overlap,
        "device": where.device, "timeout_s": timeout_s, "dtype": "bfloat16" if gpu else "float32",
        # ranks other than 0 wait this long (seconds) while rank 0 times the compute benchmarks
        "compute_wait_s": timeout_s + COMPUTE_WAIT_S,
        "min_time_s": (0.01 if quick else 0.05) if gpu else (0.005 if quick else 0.05),
        "gemm": gemm, "attention": attention, "limits": limits,
        "memory_bytes": memory, "host_link_bytes": (64 if quick else 256) * MIB if gpu else 0,
        "collective_ops": list(OPS), "collective_sizes": sizes, "collective_groups": scope_groups(where),
    }


def workload(config: dict) -> str:
    """What the workers of ``config`` will run, in words (counts, not a time: how long each takes is
    what is being measured)."""
    from plait.measure.profile.cpu_fit import HOST_LAYERS

    parts = [f"{len(config['gemm'])} GEMM and {len(config['attention'])} attention shapes "
             f"(each timed for at least {config['min_time_s'] * 1e3:.3g} ms)",
             f"{len(config['collective_sizes'])} sizes of each of {len(config['collective_ops'])} collectives"]
    layouts = config.get("host_overhead_layouts")
    if layouts:
        # each mechanism at both layer counts; plain also with more micro-batches
        runs = sum(len(HOST_LAYERS) * (2 if mechanism == "plain" else 1) for mechanism in layouts) * config["host_rounds"]
        parts.append(f"{runs} short training runs of {config['host_steps']} steps (the host overhead; most of "
                     "the time on a CPU)")
    return "it measures " + ", ".join(parts)


def compute_flops(config: dict) -> float:
    """FLOPs of one call of every GEMM and attention forward of ``config`` (a size budget, not a time)."""
    return (sum(2.0 * g["m"] * g["k"] * g["n"] for g in config["gemm"])
            + sum(attention_flops(a) for a in config["attention"]))


def resolve_where(device: str, nproc_per_node: int | None, nnodes: int, gpu: str | None) -> Where:
    """Device, process count and GPU preset, checked (one clear error each)."""
    from plait.run.device import gpu_from_device_name, local_accelerator
    from plait.spec.hardware import GPUS, get_gpu

    if nnodes < 1:
        raise PlaitError(f"--nnodes {nnodes}: need at least one node")
    name = local_accelerator() if device != "cpu" else None
    if device == "cuda" and name is None:
        raise PlaitError("--device cuda but torch sees no GPU on this machine")
    if name is None:
        if gpu:
            raise PlaitError(f"--gpu {gpu} names the GPU of a GPU profile, but this profile runs on the CPU "
                             "(it is written as a CPU profile, gpu null); drop --gpu or run on a GPU")
        n = 2 if nproc_per_node is None else nproc_per_node
        if n < 1:
            raise PlaitError(f"--nproc-per-node {n}: need at least one process")
        return Where("cpu", n, nnodes)
    import torch

    count = torch.cuda.device_count()
    n = count if nproc_per_node is None else nproc_per_node
    if not 1 <= n <= count:
        raise PlaitError(f"--nproc-per-node {n}: this node has {count} GPU(s); use 1..{count} (one process per GPU)")
    preset = get_gpu(gpu).name if gpu else gpu_from_device_name(name)
    if preset is None:
        raise PlaitError(f"GPU {name!r} does not name one plait GPU preset without doubt; give --gpu NAME "
                         f"(one of {', '.join(GPUS)})")
    return Where("cuda", n, nnodes, preset, name)


def run_workers(config: dict, where: Where, run_dir: Path, rdzv_endpoint: str | None, rdzv_id: str) -> dict:
    """Run the profile workers under torchrun (rendezvous at ``rdzv_endpoint`` host:port for several
    nodes); returns rank 0's raw measurements, or {} on the other nodes."""
    from plait.run.launcher.launch import LaunchOptions, run_torchrun, torchrun_args

    options = LaunchOptions(nproc_per_node=where.nproc_per_node, nnodes=where.nnodes,
                            rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id)
    if where.nnodes > 1 and not options.rdzv_endpoint:
        raise PlaitError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT (the same on every node)")
    flags = torchrun_args(options, str(run_dir))
    flags = flags[: flags.index("-m")] + ["-m", "plait.measure.profile.worker", str(run_dir)]
    (run_dir / "profile-config.json").write_text(json.dumps(config))
    run_torchrun(flags, run_dir, where.nproc_per_node, what="profiling", cpu=where.device == "cpu")
    raw_file = run_dir / "raw.json"
    if not raw_file.is_file():  # another node's rank 0 writes it
        return {}
    return json.loads(raw_file.read_text())


def build_calibration(raw: dict, where: Where, model: ModelSpec, seq_len: int, quick: bool, limits: str = "") -> dict:
    """The calibration file's content from rank 0's raw measurements (``limits``: the CPU caps, in words)."""
    from plait.measure.profile.fit import calibration_fields
    from plait.spec.hardware import CLUSTERS, DEFAULT_CLUSTER_FOR_GPU, get_gpu

    gpu = get_gpu(where.gpu) if where.gpu else None
    efficiency = CLUSTERS[DEFAULT_CLUSTER_FOR_GPU[gpu.name]].link_efficiency if gpu else 1.0
    ram = 0.0
    if gpu is None and hasattr(os, "sysconf"):
        try:
            ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / where.nproc_per_node
        except (ValueError, OSError):
            ram = 0.0
    fields = calibration_fields(raw, gpu, efficiency, ram, host_overhead_spec(model))
    notes = fields["notes"]
    if limits:
        notes.insert(0, limits)
    if gpu is None:
        notes.insert(0, "CPU profile: gpu_overrides describe this CPU (peak = fastest GEMM measured, "
                        "gemm_efficiency = the fitted curve's rate over it); planning a GPU cluster with it is only a test of the pipeline")
    return {
        "format": FORMAT, "kind": "profile", "gpu": where.gpu, "device": where.device,
        "cpu_profile": gpu is None, "model": model.name, "seq_len": seq_len, "quick": quick,
        "processes_per_node": where.nproc_per_node,
        "threads_per_process": raw.get("machine", {}).get("threads_per_process"),
        "params": fields["params"], "gpu_overrides": fields["gpu_overrides"], "gemm_coverage": fields["gemm_coverage"],
        "cluster_overrides": fields["cluster_overrides"], "notes": notes, "warnings": fields["warnings"],
        "fits": fields["fits"],
        "machine": {**raw.get("machine", {}), "device_name": where.device_name},
        "versions": raw.get("versions", {}),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "measurements": {k: raw[k] for k in ("dtype", "gemm", "attention", "memory", "kernel_overhead_s",
                                              "host_link", "collectives", "overlap", "overlap_buckets",
                                              "block_s", "layer_host_s") if k in raw},
    }
