"""Benchmark (issue 12): the planner's memory per process against the tensor bytes a CPU run counts.

For every layout of the CPU loop (``bench/cpu_loop.py`` CASES: the tiny model at sequence 128
and 256, the 60M Llama; 2 processes and 1 process) this runs ``plait train`` on the CPU for a few
steps and reads ``peak_tensor_bytes`` from its summary (max over ranks of the counted peak of
torch tensor storage in the run's second step, ``plait.run.memory.counted``), and predicts the
same layout with the planner for a CPU: ``GpuSpec.element_bytes = 4`` (the runtime computes in
fp32 there) and no CUDA context, NCCL buffers or fragmentation reserve (what a CPU profile
writes), i.e. ``MemoryBreakdown.allocated``. It prints predicted vs counted per layout, and the
planner's items of the worst ones.

    python bench/cpu_memory.py                         # every case, appended to bench/results/cpu_memory.md
    python bench/cpu_memory.py --cases tiny --no-record
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from cpu_loop import CASES  # noqa: E402

from results_file import append_result  # noqa: E402
from plait.plan.memory import estimate_memory  # noqa: E402
from plait.plan.params import DEFAULT_PARAMS  # noqa: E402
from plait.spec.hardware import cluster_for_gpu  # noqa: E402
from plait.spec.layout import JobSpec, Layout  # noqa: E402
from plait.spec.models import get_model  # noqa: E402

BAR = 0.15  # issue 12: memory per process within 15% of the prediction
CPU_PARAMS = dataclasses.replace(DEFAULT_PARAMS, cuda_context_bytes=0.0, comm_buffer_bytes=0.0, fragmentation=0.0)


def cpu_cluster(n_procs: int):
    """A cluster whose device computes in fp32 with room for anything (the CPU's host memory)."""
    cluster = cluster_for_gpu("h100-sxm", n_procs)
    gpu = dataclasses.replace(cluster.gpu, element_bytes=4.0, hbm_bytes=1e15)
    return dataclasses.replace(cluster, gpu=gpu)


def predict(model_arg: str, layout_text: str, n_procs: int, seq_len: int, batch: int):
    layout = Layout.parse(layout_text)
    job = JobSpec(global_batch=batch, seq_len=seq_len)
    return estimate_memory(get_model(model_arg), cpu_cluster(n_procs), job, layout, CPU_PARAMS)


def counted(model_arg: str, layout_text: str, n_procs: int, seq_len: int, batch: int, steps: int,
            work: Path) -> int | None:
    """``peak_tensor_bytes`` of a ``plait train`` run on the CPU (None when it failed)."""
    log = work / f"run-{abs(hash((model_arg, layout_text, n_procs, seq_len)))}.jsonl"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // n_procs)))
    done = subprocess.run([sys.executable, "-m", "plait.cli", "train", "--model", model_arg, "--layout", layout_text,
                           "--global-batch", str(batch), "--seq-len", str(seq_len), "--steps", str(steps),
                           "--device", "cpu", "--nproc-per-node", str(n_procs), "--log", str(log)],
                          capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        print(done.stdout[-2000:], done.stderr[-2000:], file=sys.stderr)
        return None
    summary = [json.loads(line) for line in log.read_text().splitlines() if '"summary"' in line][-1]
    return summary.get("peak_tensor_bytes")


def items_text(memory) -> str:
    return ", ".join(f"{k} {v / 2**20:.2f}" for k, v in memory.items().items() if v)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--layouts", nargs="*", help="only these layouts (as written in CASES)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--no-record", action="store_true", help="do not append to bench/results/cpu_memory.md")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="plait-cpu-memory-"))
    header = ["| case | procs | layout | predicted MiB | counted MiB | error | planner items (MiB) |",
              "|---|---|---|---|---|---|---|"]
    print("\n".join(header), flush=True)
    rows, errors = [], []
    for name in args.cases:
        model_arg, seq_len, batch, two, one = CASES[name]
        for n_procs, layouts in ((2, two), (1, one)):
            for layout_text in layouts:
                if args.layouts and layout_text not in args.layouts:
                    continue
                memory = predict(model_arg, layout_text, n_procs, seq_len, batch)
                measured = counted(model_arg, layout_text, n_procs, seq_len, batch, args.steps, work)
                error = measured / memory.allocated - 1 if measured else None
                if error is not None:
                    errors.append(error)
                row = (f"| {name} | {n_procs} | `{layout_text}` | {memory.allocated / 2**20:.2f} | "
                       f"{measured / 2**20 if measured else float('nan'):.2f} | "
                       f"{'' if error is None else f'{error:+.1%}'} | {items_text(memory)} |")
                rows.append(row)
                print(row, flush=True)
    within = sum(abs(e) <= BAR for e in errors)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = "\n".join([f"## {now} - {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                      f"python {platform.python_version()}", "",
                      f"`python bench/cpu_memory.py --cases {' '.join(args.cases)} --steps {args.steps}`", "",
                      f"{within} of {len(errors)} layouts within {BAR:.0%} (counted / predicted - 1); "
                      f"largest |error| {max((abs(e) for e in errors), default=float('nan')):.1%}.", "",
                      *header, *rows]) + "\n"
    print("\n" + text)
    if not args.no_record:
        append_result("cpu_memory.md", "CPU memory: the planner's itemized memory against counted tensor bytes (issue 12)", "cpu_memory.py", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
