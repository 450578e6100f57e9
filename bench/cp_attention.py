"""Benchmark (issue 4): the context-parallel attention kernels, forward + backward, per sequence length.

Spawns ``--cp`` processes (gloo on CPU, NCCL with one GPU each), gives each its head-tail share of
a batch of sequences, and times forward + backward of every kernel of ``Layout.cp_impl``
(ring, allgather, torch, ulysses) against one-process causal SDPA on the full sequence (the
single-rank time, divided by cp, is what perfect scaling would give). Median of ``--repeats``
after one warm-up; the max over ranks. Prints a table and appends it, with machine and date, to
bench/results/cp_attention.md.

    python bench/cp_attention.py --device cpu --cp 2 --seq 512,2048             # what was recorded
    python bench/cp_attention.py --device cuda --cp 8 --seq 8192,32768,131072 --dtype bf16

The CUDA run has not been done yet (no GPU in the session that wrote it). ``ring`` and
``allgather`` materialize each block's scores in fp32: expect them to be slow on GPU; ``torch``
(Flash per block) is the GPU kernel.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import socket
import statistics
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "cp_attention.md"
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # also in the spawned ranks
KERNELS = ("ring", "allgather", "torch", "ulysses")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _time(fn, repeats: int, sync) -> float:
    fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _worker(rank: int, args, port: int, queue) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh

    from plait.run.parallel.context.ring import cp_kernel
    from plait.run.parallel.context.shard import SequenceShard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // args.cp))
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=args.cp)
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    mesh = init_device_mesh(device.type, (args.cp,), mesh_dim_names=("cp",))
    shard = SequenceShard(rank, args.cp)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    rows = []
    for seq in args.seq:
        gen = torch.Generator(device=device).manual_seed(0)
        shape_q = (args.batch, args.heads, seq, args.head_dim)
        shape_kv = (args.batch, args.kv_heads, seq, args.head_dim)
        q, k, v = (torch.randn(s, generator=gen, device=device, dtype=dtype) for s in (shape_q, shape_kv, shape_kv))
        row = {"seq": seq}
        if rank == 0:
            full = [t.clone().requires_grad_() for t in (q, k, v)]

            def single(full=full):
                out = F.scaled_dot_product_attention(*full, is_causal=True, enable_gqa=args.heads != args.kv_heads)
                out.sum().backward()

            row["1 rank"] = _time(single, args.repeats, sync)
        local = [shard.shard(t, dim=2).clone().requires_grad_() for t in (q, k, v)]
        for impl in args.kernels:
            kernel = cp_kernel(impl, mesh)

            def step(kernel=kernel, local=local):
                kernel(*local, 0.0).sum().backward()

            seconds = torch.tensor(_time(step, args.repeats, sync), device=device)
            dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
            row[impl] = float(seconds)
        rows.append(row)
    if rank == 0:
        queue.put(rows)
    dist.barrier()
    dist.destroy_process_group()


def table(rows: list[dict], kernels: list[str], cp: int) -> str:
    head = "| seq | 1 rank (s) | 1 rank / cp (s) | " + " | ".join(f"{k} (s)" for k in kernels) + " |"
    lines = [head, "|" + "---|" * (3 + len(kernels))]
    for row in rows:
        cells = [str(row["seq"]), f"{row['1 rank']:.4f}", f"{row['1 rank'] / cp:.4f}"]
        cells += [f"{row[k]:.4f}" for k in kernels]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--cp", type=int, default=2)
    parser.add_argument("--seq", type=lambda s: [int(x) for x in s.split(",")], default=[512, 2048])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--kernels", type=lambda s: s.split(","), default=list(KERNELS))
    parser.add_argument("--no-record", action="store_true", help="print only; do not append to the results file")
    args = parser.parse_args()
    import torch.multiprocessing as mp

    queue = mp.get_context("spawn").SimpleQueue()
    mp.spawn(_worker, args=(args, _free_port(), queue), nprocs=args.cp, join=True)
    rows = queue.get()
    text = table(rows, args.kernels, args.cp)
    print(text)
    if args.no_record:
        return
    import torch

    machine = (torch.cuda.get_device_name(0) if args.device == "cuda" else platform.processor() or platform.machine())
    header = (f"\n## {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC - {platform.node()}, "
              f"{machine}, {os.cpu_count()} CPUs, torch {torch.__version__}\n\n"
              f"cp={args.cp} on {args.device} ({'NCCL' if args.device == 'cuda' else 'gloo'}), batch {args.batch}, "
              f"{args.heads} heads / {args.kv_heads} K/V heads × {args.head_dim}, {args.dtype}; forward + backward, "
              f"median of {args.repeats}, max over ranks\n\n")
    if not RESULTS.exists():
        RESULTS.write_text("# Context-parallel attention kernels (bench/cp_attention.py)\n\n"
                           "GPU: **not run yet** (no GPU in the session that wrote the benchmark).\n")
    with RESULTS.open("a") as handle:
        handle.write(header + text + "\n")


if __name__ == "__main__":
    main()
