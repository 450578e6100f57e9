"""Benchmark (issue 5): checkpoint save/load time and size, and time to recovery after a failure.

Part 1 - save and load, one process (gloo on CPU, NCCL on GPU), layout dp=1: the model of
``--model`` (default llama3.2-1b, 1.24 B parameters) with its AdamW state, saved with
``plait.run.checkpoint.dcp.Checkpointer`` exactly as ``plait train`` saves it (DCP files, CRC-32 of
every file, manifest, rename), verified from the manifest, and loaded back:

  * size on disk (bytes) and bytes per parameter (fp32 weights + two fp32 Adam moments = 12);
  * save: synchronous wall time, split into the DCP write and the commit (checksums + manifest);
  * async save (GPU, or ``--async`` on CPU): the training stall (time until ``save`` returns:
    staging to host memory) and the time until the checkpoint is committed;
  * verify (re-reading and checksumming every file) and load (DCP read into the live tensors).

Part 2 - recovery drill (``--recovery``): the tiny model through ``plait train`` on 2 CPU
processes with ``--checkpoint-every 2 --max-restarts 1`` and a rank SIGKILLed in step 5; time
to recovery = wall time from the last step finished before the failure to the first step
finished after the restart (detection, torchrun restart, process start, checkpoint load and the
lost partial step), read from the JSONL log's timestamps.

Run (writes a dated section to bench/results/checkpoint.md)::

    python bench/checkpoint_bench.py --recovery                 # CPU, default ~1B model
    python bench/checkpoint_bench.py --device cuda --recovery   # GPU box: adds the async stall

``--model tiny --out DIR`` is the quick smoke run (tests/run/test_checkpoint_bench.py).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.distributed as dist

from plait.run.checkpoint import store
from plait.run.checkpoint.dcp import Checkpointer, ensure_optimizer_state, load_checkpoint
from plait.run.config import OptimConfig, RunConfig, RuntimeConfig, TrainJob
from plait.run.parallel.mesh import build_parallel_dims
from plait.run.optim import build_optimizer
from plait.run.parallel.parallelize import build_model_parts
from plait.spec.layout import Layout
from plait.spec.models import get_model

RESULTS = Path(__file__).parent / "results" / "checkpoint.md"


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{platform.node()}, {os.cpu_count()} CPU cores ({cpu}), {gpu}, torch {torch.__version__}"


def save_and_load(model_name: str, device: torch.device, use_async: bool, directory: Path) -> dict:
    spec = get_model(model_name)
    config = RunConfig(job=TrainJob(model=spec, layout=Layout(dp=1), global_batch=1,
                                    seq_len=min(128, spec.max_seq_len), steps=1),
                       optim=OptimConfig(), runtime=RuntimeConfig(device=device.type))
    layout = config.job.layout
    pdims = build_parallel_dims(layout, device.type)
    start = time.perf_counter()
    parts = build_model_parts(spec, pdims, device, seed=0, n_microbatches=1)
    optimizer = build_optimizer(parts.named_parameters(), config.optim)
    ensure_optimizer_state(optimizer)
    n_params = sum(p.numel() for p in {id(p): p for p in parts.parameters()}.values())
    build_s = time.perf_counter() - start
    out = {"model": model_name, "parameters": n_params, "device": device.type, "build_s": build_s}

    sync = Checkpointer(directory, every=0, keep=0, run=config.to_dict(), layout=str(layout),
                        use_async=False, device=device)
    start = time.perf_counter()
    sync.save(1, parts, optimizer)
    out["save_s"] = time.perf_counter() - start
    path = directory / store.final_name(1)
    manifest = store.read_manifest(path)
    out["bytes"] = sum(record["bytes"] for record in manifest["files"].values())
    out["files"] = len(manifest["files"])
    start = time.perf_counter()
    store.verify(path)
    out["verify_s"] = time.perf_counter() - start
    start = time.perf_counter()
    load_checkpoint(path, parts, optimizer)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    out["load_s"] = time.perf_counter() - start
    if use_async:
        checkpointer = Checkpointer(directory, every=0, keep=0, run=config.to_dict(), layout=str(layout),
                                    use_async=True, device=device)
        start = time.perf_counter()
        checkpointer.save(2, parts, optimizer)
        out["async_stall_s"] = time.perf_counter() - start
        checkpointer.finish()
        out["async_commit_s"] = time.perf_counter() - start
    return out


def recovery_drill(directory: Path) -> dict:
    log = directory / "drill.jsonl"
    command = [sys.executable, "-m", "plait.cli", "train", "--model", "tiny", "--layout", "dp=2", "--global-batch",
               "8", "--seq-len", "64", "--nproc-per-node", "2", "--steps", "8", "--device", "cpu",
               "--checkpoint-dir", str(directory / "drill-ckpt"), "--checkpoint-every", "2", "--max-restarts", "1",
               "--log", str(log)]
    env = {**os.environ, "PLAIT_INJECT_FAULT": "rank=1,step=5,kind=kill"}
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, env=env, check=False, timeout=600)
    total = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"recovery drill failed:\n{proc.stderr[-3000:]}")
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    resume_at = next(i for i, line in enumerate(lines) if line.get("event") == "resume")
    before = [line for line in lines[:resume_at] if "loss" in line and "summary" not in line]
    after = [line for line in lines[resume_at:] if "loss" in line and "summary" not in line]
    return {"time_to_recovery_s": after[0]["time"] - before[-1]["time"], "load_s": lines[resume_at]["load_s"],
            "resumed_at_step": lines[resume_at]["step"], "lost_steps": before[-1]["step"] - lines[resume_at]["step"],
            "drill_wall_s": total}


def table(result: dict, drill: dict | None) -> str:
    gib = 2**30
    size = (f"{result['bytes'] / gib:.2f} GiB in {result['files']} files "
            f"({result['bytes'] / result['parameters']:.1f} bytes/parameter)")
    save = f"{result['save_s']:.2f} s ({result['bytes'] / gib / result['save_s']:.2f} GiB/s)"
    load = f"{result['load_s']:.2f} s ({result['bytes'] / gib / result['load_s']:.2f} GiB/s)"
    rows = [
        ("model", f"{result['model']} ({result['parameters'] / 1e9:.3f} B parameters)"),
        ("device", result["device"]),
        ("checkpoint size", size),
        ("save (sync: DCP write + checksums + manifest + rename)", save),
        ("verify (re-read + CRC-32 of every file)", f"{result['verify_s']:.2f} s"),
        ("load (DCP read into the live tensors)", load),
    ]
    if "async_stall_s" in result:
        rows += [("async save: training stall", f"{result['async_stall_s']:.2f} s"),
                 ("async save: until committed", f"{result['async_commit_s']:.2f} s")]
    if drill:
        recovery = (f"{drill['time_to_recovery_s']:.1f} s (checkpoint load {drill['load_s']:.2f} s, "
                    f"{drill['lost_steps']} step(s) redone)")
        rows += [("recovery drill: time to recovery (kill → first step after restart)", recovery)]
    width = max(len(name) for name, _ in rows)
    return "\n".join([f"| {'measure':<{width}} | value |", f"|{'-' * (width + 2)}|-------|"]
                     + [f"| {name:<{width}} | {value} |" for name, value in rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="llama3.2-1b")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--async", dest="use_async", action="store_true", help="also time an async save (on CPU)")
    parser.add_argument("--recovery", action="store_true", help="also run the recovery drill")
    parser.add_argument("--dir", help="where to write the checkpoints (default: a temporary directory)")
    parser.add_argument("--out", help="write the results here instead of bench/results/checkpoint.md")
    args = parser.parse_args()
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        store_file = Path(tmp) / "store"
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                store=dist.FileStore(str(store_file), 1), rank=0, world_size=1)
        try:
            result = save_and_load(args.model, device, args.use_async or device.type == "cuda", Path(tmp) / "ckpt")
        finally:
            dist.destroy_process_group()
        drill = recovery_drill(Path(tmp)) if args.recovery else None
    text = table(result, drill)
    print(text)
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    section = f"\n## {stamp} - {machine()}\n\n`python bench/checkpoint_bench.py {' '.join(sys.argv[1:])}`\n\n{text}\n"
    out = Path(args.out) / "checkpoint.md" if args.out else RESULTS
    out.parent.mkdir(parents=True, exist_ok=True)
    if not out.exists():
        out.write_text("# Checkpoint benchmark (bench/checkpoint_bench.py)\n")
    with open(out, "a") as handle:
        handle.write(section)
    (out.with_suffix(".json")).write_text(json.dumps({"date": stamp, "machine": machine(), "result": result,
                                                      "recovery": drill}, indent=1))


if __name__ == "__main__":
    main()
