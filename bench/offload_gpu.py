"""Benchmark (issue 4): activation offload and recomputation policies on one GPU, 8K-64K tokens.

For each sequence length and policy (``--policies``), trains ``--model`` (default llama2-7b) with
layout ``dp=1,mbs=1,<policy>`` for ``--steps`` steps on a one-rank process group (NCCL, file store),
bf16 autocast, and records: median step time (steps after the first two), peak allocated memory
(``torch.cuda.max_memory_allocated``), the activation peak = peak - 16 bytes × parameters (fp32
weights, gradients and AdamW states: exact for dp=1 without FSDP), the offload counters (bytes
per step, transfer time hidden and exposed), and the planner's prediction of the same layout on
a one-GPU cluster of ``--gpu`` (activations item and step time).

Goal (issue 4): offload to host cuts the activation peak by >= 40% at <= 5% slowdown against
the same recomputation policy without offload.

    python bench/offload_gpu.py --gpu h100-sxm            # appends to bench/results/offload_gpu.md
    python bench/offload_gpu.py --smoke                   # CPU, tiny model, seq 64: exercises the code

Not run on a GPU yet (no GPU in the session that wrote it).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "offload_gpu.md"
POLICIES = ("ckpt=none", "ckpt=selective", "ckpt=balanced", "ckpt=full",
            "ckpt=none,offload=cpu:1", "ckpt=selective,offload=cpu:1", "ckpt=selective,offload=cpu:0.5",
            "ckpt=selective,offload=disk:0.5")


def measure(model: str, seq: int, policy: str, steps: int, device: str, gpu: str | None, offload_dir: str) -> dict:
    """Train one configuration in this process; the measured and predicted figures."""
    import torch
    import torch.distributed as dist

    from plait.plan.plan import evaluate
    from plait.run.config import LogConfig, OptimConfig, RunConfig, RuntimeConfig, TrainJob
    from plait.run.trainer import run_training
    from plait.spec.hardware import get_cluster, get_gpu
    from plait.spec.layout import JobSpec, Layout
    from plait.spec.models import get_model

    spec = get_model(model)
    layout = Layout.parse(f"dp=1,mbs=1,{policy}")
    config = RunConfig(job=TrainJob(model=spec, layout=layout, global_batch=1, seq_len=seq, steps=steps),
                       optim=OptimConfig(warmup_steps=1),
                       runtime=RuntimeConfig(device=device, gpu=gpu, offload_dir=offload_dir),
                       observe=LogConfig(log_every=10**6))
    with tempfile.TemporaryDirectory() as tmp:
        store = dist.FileStore(os.path.join(tmp, "store"), 1)
        if device == "cuda":
            torch.cuda.set_device(0)
        dist.init_process_group("nccl" if device == "cuda" else "gloo", store=store, rank=0, world_size=1)
        try:
            if device == "cuda":
                torch.cuda.empty_cache()
            result = run_training(config, device=torch.device(device, 0) if device == "cuda" else None)
        finally:
            dist.destroy_process_group()
    steady = result.records[2:] or result.records
    step_time = statistics.median(r.step_time_s for r in steady)
    peak = result.summary.peak_memory_bytes
    activations = peak - 16 * spec.total_params() if peak is not None else None
    base = get_cluster("dgx-h200" if gpu == "h200" else "dgx-h100", n_gpus=1)
    cluster = dataclasses.replace(base, gpu=get_gpu(gpu or "h100-sxm"), gpus_per_node=1)
    plan = evaluate(spec, cluster, JobSpec(global_batch=1, seq_len=seq), layout)
    offload = [r.offload for r in steady if r.offload]
    return {"seq": seq, "policy": policy, "step_s": step_time, "peak": peak, "activations": activations,
            "pred_activations": plan.memory.activations, "pred_step_s": plan.step.step_time,
            "offload_bytes": statistics.median(o["offload_bytes_out"] for o in offload) if offload else 0,
            "hidden_s": statistics.median(o["offload_hidden_s"] for o in offload) if offload else 0.0,
            "exposed_s": statistics.median(o["offload_exposed_s"] for o in offload) if offload else 0.0}


def table(rows: list[dict]) -> str:
    gib = 2**30
    lines = ["| seq | policy | step s (pred) | peak GiB | activations GiB (pred) | vs no offload | offload GiB/step | hidden / exposed s |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        base_policy = row["policy"].split(",offload")[0]
        base = next((r for r in rows if r["seq"] == row["seq"] and r["policy"] == base_policy), None)
        versus = ""
        if base is not None and base is not row and row["activations"] and base["activations"]:
            versus = (f"act {100 * (1 - row['activations'] / base['activations']):+.0f}% less, "
                      f"time {100 * (row['step_s'] / base['step_s'] - 1):+.1f}%")
        peak = f"{row['peak'] / gib:.2f}" if row["peak"] is not None else "n/a"
        acts = f"{row['activations'] / gib:.2f}" if row["activations"] is not None else "n/a"
        lines.append(f"| {row['seq']} | {row['policy']} | {row['step_s']:.3f} ({row['pred_step_s']:.3f}) | {peak} | "
                     f"{acts} ({row['pred_activations'] / gib:.2f}) | {versus} | {row['offload_bytes'] / gib:.3f} | "
                     f"{row['hidden_s']:.3f} / {row['exposed_s']:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpu", help="GPU spec for the prediction (e.g. h100-sxm, h200)")
    parser.add_argument("--model", default="llama2-7b", help="model preset (default llama2-7b)")
    parser.add_argument("--seqs", default="8192,16384,32768,65536", help="sequence lengths")
    parser.add_argument("--policies", default=";".join(POLICIES),
                        help="';'-separated layout suffixes")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--offload-dir", default=None, help="disk offload directory (default: temp dir)")
    parser.add_argument("--out", type=Path, default=None, help=f"results file (default {RESULTS}; smoke: none)")
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny model, seq 64, 3 steps (tests)")
    args = parser.parse_args(argv)
    policies = [p for p in args.policies.split(";") if p]
    if args.smoke:
        device, model, seqs, steps = "cpu", "tiny", [64], 3
    else:
        import torch

        if not torch.cuda.is_available():
            print("error: torch sees no GPU; run with --smoke to exercise the script on CPU", file=sys.stderr)
            return 2
        device, model, seqs, steps = "cuda", args.model, [int(s) for s in args.seqs.split(",")], args.steps
    rows = []
    for seq in seqs:
        for policy in policies:
            try:
                rows.append(measure(model, seq, policy, steps, device, args.gpu, args.offload_dir))
            except Exception as exc:  # noqa: BLE001 - an OOM of one configuration is a result too
                print(f"seq {seq} {policy}: {type(exc).__name__}: {str(exc).splitlines()[0]}", file=sys.stderr)
    text = table(rows)
    print(text)
    out = args.out if args.out else (None if args.smoke else RESULTS)
    if out is not None:
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        header = f"\n## {stamp}, {platform.node()}, {device} {args.gpu or ''}, model {model}\n\n"
        with open(out, "a", encoding="utf-8") as handle:
            handle.write(header + text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
