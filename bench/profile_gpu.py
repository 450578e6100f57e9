"""Profile this machine's GPUs into ``calibrations/<gpu>.json`` and show what it changes in a plan.

    python bench/profile_gpu.py                 # all GPUs of the node, llama3-8b shapes
    python bench/profile_gpu.py --gpu h100-sxm  # when the device name is ambiguous
    python bench/profile_gpu.py --cpu           # the same code path on the CPU (gloo, --quick, tiny model)
    python bench/profile_gpu.py --cpu --full    # the interface form on the CPU: llama3-8b, no --quick (capped sizes)
    python bench/profile_gpu.py --gpu h100-sxm --model llama3.2-1b --seq-len 2048 --nproc-per-node 1 \
        --out DIR/h100-sxm.json --results DIR/profile_gpu.md   # bench/gpu_proof.sh's form

Runs ``plait profile`` (the command that writes the committed calibration), then ``plait plan``
for llama3-8b on one node with the defaults and with the new file, and appends a table (machine,
date, measured efficiencies and bandwidths, predicted step time and MFU with both) to
``bench/results/profile_gpu.md``. It has not run on a GPU yet.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def plan(args: list[str]) -> dict:
    from plait.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(args)
    if code != 0:
        raise SystemExit(f"plait {' '.join(args)} exited {code}")
    return json.loads(out.getvalue())[0]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", help="GPU preset when the device name is ambiguous")
    parser.add_argument("--cpu", action="store_true", help="run the code path on the CPU (quick, tiny model)")
    parser.add_argument("--full", action="store_true", help="with --cpu: llama3-8b without --quick (what "
                        "`plait profile --out cal.json` does on a CPU box)")
    parser.add_argument("--nproc-per-node", type=int, help="default: every GPU of the node (CPU: 2)")
    parser.add_argument("--out", help="calibration file (default calibrations/<gpu>.json)")
    parser.add_argument("--model", help="model whose shapes are profiled and planned (default llama3-8b; "
                        "--cpu: tiny)")
    parser.add_argument("--seq-len", type=int, help="planned sequence length (default: plait profile's; "
                        "the plan below: 8192 on GPU, 256 on CPU)")
    parser.add_argument("--quick", action="store_true", help="plait profile --quick on the GPU too")
    parser.add_argument("--results", type=Path, help="markdown file the table is appended to (default "
                        "bench/results/profile_gpu.md, or profile_cpu.md with --cpu)")
    args = parser.parse_args(argv)
    from plait.cli import main as plait

    model = args.model or ("tiny" if args.cpu and not args.full else "llama3-8b")
    out = Path(args.out or (ROOT / "calibrations" / f"{args.gpu or 'local'}.json"))
    command = ["profile", "--model", model, "--out", str(out)]
    command += (["--device", "cpu"] + ([] if args.full else ["--quick"])) if args.cpu else ["--device", "cuda"]
    command += ["--quick"] if args.quick and not args.cpu else []
    command += ["--seq-len", str(args.seq_len)] if args.seq_len else []
    command += ["--gpu", args.gpu] if args.gpu else []
    command += ["--nproc-per-node", str(args.nproc_per_node)] if args.nproc_per_node else []
    started = time.perf_counter()
    if plait(command) != 0:
        raise SystemExit("plait profile failed")
    elapsed = time.perf_counter() - started
    model = args.model or ("tiny" if args.cpu else model)  # the plan below: tiny on a CPU profile (small RAM share)
    data = json.loads(out.read_text())
    if not args.out and data["gpu"] and out.name == "local.json":
        final = out.with_name(f"{data['gpu']}.json")
        out.rename(final)
        out = final
    n = data["machine"].get("nproc_per_node", 1)
    seq = str(args.seq_len) if args.seq_len else ("256" if args.cpu else "8192")
    job = ["plan", "--model", model, "--cluster", "dgx-h100" if not data["gpu"] else _cluster(data["gpu"]),
           "--gpus", str(n), "--global-batch", str(8 * n), "--seq-len", seq, "--layout", f"dp={n},zero=3", "--json"]
    default, calibrated = plan(job), plan([*job, "--calibration", str(out)])
    over, links, fits = data["gpu_overrides"], data["cluster_overrides"], data["fits"]
    rows = [("GEMM efficiency (of peak)", over.get("gemm_efficiency")),
            ("GEMM half-rate size, FLOPs", data["params"].get("gemm_half_flops")),
            ("attention efficiency", over.get("attention_efficiency")),
            ("flash backward / forward", data["params"].get("flash_backward_factor")),
            ("memory efficiency", over.get("memory_efficiency")),
            ("kernel launch, s", over.get("kernel_overhead")),
            ("intra-node bus bandwidth, B/s", links.get("intra_node_bandwidth", 0) * links.get("link_efficiency", 1) or None),
            ("intra-node latency per step, s", links.get("intra_node_latency")),
            ("host link, B/s", links.get("host_link_bandwidth")),
            ("GEMM fit worst residual", fits["gemm"].get("max_error")),
            ("profile wall time, s", elapsed)]
    lines = [(f"\n## {data['machine'].get('device_name') or data['machine'].get('cpu')} x {n} "
              f"({data['gpu'] or 'CPU profile'}), {datetime.now(timezone.utc).isoformat(timespec='seconds')}"),
             f"\nhost {data['machine'].get('hostname')}, versions {data['versions']}, file `{out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}`",
             f"\ncommand `plait {' '.join(command)}` (seq_len {data['seq_len']}, quick {data['quick']})\n",
             "| measured | value |", "|---|---|"]
    lines += [f"| {name} | {value:.4g} |" if value is not None else f"| {name} | - |" for name, value in rows]
    lines += ["", f"plan `{' '.join(job[:-1])}`:", "", "| | step time s | MFU |", "|---|---|---|"]
    for name, p in (("defaults", default), ("calibrated", calibrated)):
        lines.append(f"| {name} | {p['prediction']['step_time_s']:.4g} | {p['prediction']['mfu']:.3f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    results = args.results or ROOT / "bench" / "results" / ("profile_cpu.md" if args.cpu else "profile_gpu.md")
    results.parent.mkdir(parents=True, exist_ok=True)
    if not results.exists():
        results.write_text("# plait profile results\n\nWritten by `python bench/profile_gpu.py`.\n")
    with results.open("a") as handle:
        handle.write(text)


def _cluster(gpu: str) -> str:
    from plait.spec.hardware import DEFAULT_CLUSTER_FOR_GPU

    return DEFAULT_CLUSTER_FOR_GPU[gpu]


if __name__ == "__main__":
    sys.exit(main())
