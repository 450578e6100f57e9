"""``plait profile``: its flags, the command, and what it prints (the work is in ``plait.measure.profile.machine``)."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from plait.cli.support.common import warn
from plait.errors import PlaitError
from plait.spec.hardware import OP_BANDWIDTH_FACTORS

HELP = "micro-benchmark this machine and write a calibration file"


def add_arguments(profile: argparse.ArgumentParser) -> None:
    profile.add_argument("--out", required=True, help="calibration JSON to write (for plait plan --calibration)")
    profile.add_argument("--model", default="llama3-8b", help="model whose GEMM and attention shapes to time")
    profile.add_argument("--seq-len", type=int, help="planned sequence length (default: min(model's, 4096))")
    profile.add_argument("--nproc-per-node", "--nproc", type=int, default=None,
                         help="processes for the collectives (default: GPUs of the node, or 2 on CPU)")
    profile.add_argument("--nnodes", type=int, default=1, help="nodes (run the same command on each)")
    profile.add_argument("--rdzv-endpoint", help="host:port of the rendezvous, for several nodes")
    profile.add_argument("--rdzv-id", default="plait-profile", help="job id shared by the nodes")
    profile.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="default: cuda if present")
    profile.add_argument("--gpu", help="GPU preset of this machine when its device name is not unambiguous")
    profile.add_argument("--quick", action="store_true",
                         help="fewer, smaller sizes and shorter training runs (for tests and a first look); on "
                              "a CPU every size is capped anyway (the command prints what it will measure)")
    profile.add_argument("--timeout", type=float, default=300.0,
                         help="collective timeout in seconds (the other ranks wait longer for rank 0's compute "
                              "benchmarks)")


def run(args) -> int:
    from plait.plan.calibration import write_calibration as write_json
    from plait.measure.profile.machine import (
        build_calibration,
        profile_config,
        resolve_where,
        run_workers,
        workload,
    )
    from plait.spec.models import get_model

    if not str(args.out).endswith(".json"):
        raise PlaitError(f"--out {args.out}: a calibration file is JSON; name it *.json")
    if args.timeout <= 0:
        raise PlaitError(f"--timeout {args.timeout}: must be positive (seconds)")
    model = get_model(args.model)
    seq_len = args.seq_len or min(model.max_seq_len, 4096)
    if seq_len < 16:
        raise PlaitError(f"--seq-len {seq_len}: need at least 16 tokens")
    where = resolve_where(args.device, args.nproc_per_node, args.nnodes, args.gpu)
    config = profile_config(model, seq_len, where, args.quick, args.timeout)
    what = f"{where.gpu} ({where.device_name})" if where.gpu else "CPU (gloo)"
    print(f"profiling {what}: {where.nproc_per_node} process(es) x {where.nnodes} node(s), shapes of "
          f"{model.name} at seq_len {seq_len}{' (quick)' if args.quick else ''}", flush=True)
    if config["limits"]:
        print(config["limits"], flush=True)
    print(workload(config), flush=True)
    with tempfile.TemporaryDirectory(prefix="plait-profile-") as directory:
        raw = run_workers(config, where, Path(directory), args.rdzv_endpoint, args.rdzv_id)
    if not raw:
        print("this node's measurements went to node 0's rank 0; node 0 writes the calibration file")
        return 0
    data = build_calibration(raw, where, model, seq_len, args.quick, config["limits"])
    write_json(args.out, data)
    _print_summary(data, args.out)
    return 0


def _print_summary(data: dict, out: str) -> None:
    fits, overrides, links = data["fits"], data["gpu_overrides"], data["cluster_overrides"]
    gemm = fits["gemm"]
    streams = f", operands at {gemm['bytes_per_s'] / 1e9:.3g} GB/s" if gemm.get("bytes_per_s") else ""
    covered = data.get("gemm_coverage")
    covered = (f"; {len(data['measurements']['gemm'])} shapes measured, "
               f"{covered['flops'][0]:.3g}..{covered['flops'][1]:.3g} FLOPs" if covered else "")
    lines = [(f"GEMM: {gemm['rate'] / 1e12:.3g} TFLOP/s large-GEMM rate, half rate at {gemm['half_flops']:.3g} FLOPs"
              f"{streams} (fit: {gemm['fit']}; worst residual {100 * gemm['max_error']:.0f}%{covered})"),
             f"memory copy: {fits['memory_bytes_per_s'] / 1e9:.3g} GB/s; kernel launch {overrides['kernel_overhead'] * 1e6:.3g} us"]
    if fits.get("attention"):
        lines.append(f"attention forward: {fits['attention']['rate'] / 1e12:.3g} TFLOP/s (causal), "
                     f"backward {fits['attention']['backward_factor']:.2f}x forward")
    for key in ("intra_node_bandwidth", "inter_node_bandwidth"):
        if key in links:
            scope = key.split("_")[0]
            latency = links[f"{scope}_node_latency"]
            lines.append(f"{scope}-node links: {links[key] * links['link_efficiency'] / 1e9:.3g} GB/s bus bandwidth, "
                         f"{latency * 1e6:.3g} us per step")
    factors = [f"{op.replace('_', '-')} {links[field]:.2f}x" for op, field in OP_BANDWIDTH_FACTORS.items() if field in links]
    if factors:
        lines.append("bus bandwidth against the all-reduce's: " + ", ".join(factors))
    lines += data["notes"]
    lines.append(f"wrote {out} (use: plait plan ... --calibration {out})")
    print("\n".join(lines), flush=True)
    for warning in data.get("warnings", []):
        warn(warning)
