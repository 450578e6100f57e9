"""The GPU proof's check of the expert overlap's CUDA side stream (issue 33, item 3), on one GPU.

``moe_overlap=chunked`` and ``shared`` issue their all-to-alls on a side stream on CUDA
(``plait.run.parallel.expert_overlap``): the side stream first waits for the current one, the send
and receive buffers are ``record_stream``-ed on it, and the wait makes the current stream wait for
the side stream. A missing wait shows as rows read before their all-to-all filled them (or sent
before the expert GEMMs wrote them); a missing ``record_stream`` as a buffer reused while in flight.

NCCL refuses two ranks on one GPU, so the two ep ranks run here as two processes on the one GPU
with gloo, whose CUDA all-to-all stages through host memory on a stream of its own and is waited
from the issuing stream, the same contract NCCL's work handles keep. Each rank runs one MoE exchange
(8 experts, ep=2, random rows; forward and backward; fp32 with TF32 off) through the plain
``AllToAllDispatcher`` and through ``OverlappedDispatcher`` in each mode, several times (the
allocator reuses freed blocks, so a buffer released too early is overwritten by the next round),
and compares the output and every gradient with the plain dispatcher's: they may differ only by
the order of the expert weight gradients' sums (chunked sums them per chunk), at most
2·n·2^-24 of the largest value with n = max(FFN, 2·ROWS) terms per sum (the linear worst case of
fp32 summation). It also checks that the CUDA runs used the side stream. What this cannot show:
NCCL's kernels overlapping the expert GEMMs, which needs two GPUs.

A dry run (``--dry-run``) runs the same code on the CPU with gloo's CPU all-to-all (no side stream).
"""

from __future__ import annotations

import os
import socket
import traceback
from datetime import timedelta

HIDDEN, FFN, EXPERTS, ROWS = 64, 96, 8, 96  # ROWS per rank, before routing
ROUNDS = 3
FP32_UNIT = 2.0**-24
MODES = ("chunked", "shared")


def bound() -> float:
    """The largest allowed difference, relative to the largest value (module docstring)."""
    return 2 * max(FFN, 2 * ROWS) * FP32_UNIT


def _inputs(rank: int, device):
    import torch

    generator = torch.Generator().manual_seed(100 + rank)
    counts = torch.bincount(torch.randint(0, EXPERTS, (ROWS,), generator=generator), minlength=EXPERTS)
    rows = torch.randn(int(counts.sum()), HIDDEN, generator=generator)
    side_in, probe = torch.randn(ROWS, HIDDEN, generator=generator), torch.randn(int(counts.sum()), HIDDEN,
                                                                                 generator=generator)
    generator.manual_seed(7)
    weights = [torch.randn(EXPERTS, HIDDEN, FFN, generator=generator) / HIDDEN ** 0.5,
               torch.randn(EXPERTS, HIDDEN, FFN, generator=generator) / HIDDEN ** 0.5,
               torch.randn(EXPERTS, FFN, HIDDEN, generator=generator) / FFN ** 0.5]
    shared = torch.randn(HIDDEN, HIDDEN, generator=generator) / HIDDEN ** 0.5
    local = EXPERTS // 2
    mine = [w[rank * local:(rank + 1) * local].to(device).requires_grad_() for w in weights]
    return (rows.to(device).requires_grad_(), counts.to(device), mine, side_in.to(device).requires_grad_(),
            shared.to(device), probe.to(device))


def _run(dispatcher, rank: int, device) -> dict:
    """One exchange (forward and backward) on fresh inputs: the output and every gradient, on the CPU."""
    import torch

    from plait.run.modules.experts import expert_forward

    rows, counts, weights, side_in, shared_w, probe = _inputs(rank, device)
    out, extra = dispatcher.exchange(rows, counts, lambda x, c: expert_forward(x, c, *weights, grouped=False),
                                     lambda: torch.tanh(side_in @ shared_w) @ shared_w)
    ((out * probe).sum() + extra.square().sum()).backward()
    values = {"out": out.detach(), "shared": extra.detach(), "rows": rows.grad, "side": side_in.grad,
              **{f"w{i}": w.grad for i, w in enumerate(weights)}}
    return {key: value.cpu() for key, value in values.items()}


def _worker(rank: int, port: int, cuda: bool, queue) -> None:
    """One ep rank: every round, the plain exchange and each mode's; rank 0 puts the worst relative
    difference per mode (and whether CUDA used the side stream) on ``queue``; an error as text."""
    try:
        import torch
        import torch.distributed as dist

        from plait.run.parallel.expert import AllToAllDispatcher
        from plait.run.parallel.expert_overlap import OverlappedDispatcher

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.backends.cuda.matmul.allow_tf32 = False
        device = torch.device("cuda", 0) if cuda else torch.device("cpu")
        dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=120))
        group = dist.group.WORLD
        plain_dispatcher = AllToAllDispatcher(group, 2, EXPERTS)
        dispatchers = {mode: OverlappedDispatcher(group, 2, EXPERTS, mode) for mode in MODES}
        worst = {mode: 0.0 for mode in MODES}
        for _ in range(ROUNDS):
            plain = _run(plain_dispatcher, rank, device)
            for mode, dispatcher in dispatchers.items():
                got = _run(dispatcher, rank, device)
                for key, want in plain.items():
                    scale = want.abs().max().item() or 1.0
                    worst[mode] = max(worst[mode], (got[key] - want).abs().max().item() / scale)
        if cuda:
            torch.cuda.synchronize()
        streams = {mode: dispatcher._stream is not None for mode, dispatcher in dispatchers.items()}
        if rank == 0:
            queue.put({"worst": worst, "side_stream": streams})
        dist.barrier()
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - the parent reports it as the check's failure
        queue.put({"error": traceback.format_exc(limit=6)})


def two_ranks(worker, args: tuple, timeout_s: float) -> dict:
    """Run ``worker(rank, port, *args, queue)`` as two spawned processes (gloo on 127.0.0.1, a free
    port); what the first puts on ``queue``, or {"error": ...} when none comes within ``timeout_s``.
    Also used by bench/moe_overlap.py."""
    import torch.multiprocessing as mp

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = mp.get_context("spawn")
    queue = context.Queue()
    ranks = [context.Process(target=worker, args=(rank, port, *args, queue)) for rank in range(2)]
    for process in ranks:
        process.start()
    try:
        result = queue.get(timeout=timeout_s)
    except Exception:  # noqa: BLE001 - queue.Empty: a rank hung or died
        result = {"error": f"no result within {timeout_s:.0f} s"}
    for process in ranks:
        process.join(timeout=10)
        if process.is_alive():
            process.kill()
    return result


def side_stream_check(cuda: bool, timeout_s: float = 90.0) -> dict:
    """Run the two ranks (module docstring): {"worst": {mode: relative difference}, "side_stream":
    {mode: used}, "bound": ...} or {"error": text}."""
    return {**two_ranks(_worker, (cuda,), timeout_s), "bound": bound()}


def check(record, cuda: bool) -> None:
    """Record the check as ``moe: overlap side stream`` (ok, or failed with what went wrong)."""
    name = "moe: overlap side stream (2 ranks, gloo, one GPU)"
    result = side_stream_check(cuda)
    if "error" in result:
        record.check(name, "failed", result["error"].strip().splitlines()[-1], result)
        return
    worst, limit = result["worst"], result["bound"]
    used = all(result["side_stream"].values()) if cuda else True
    ok = used and all(value <= limit for value in worst.values())
    where = "CUDA tensors, side stream" if cuda else "CPU (dry run), no side stream"
    detail = (f"{where}: chunked and shared = plain all-to-all over {ROUNDS} rounds, largest relative difference "
              + ", ".join(f"{mode} {value:.2g}" for mode, value in worst.items()) + f" (bound {limit:.2g})")
    if not used:
        detail += f"; the side stream was not used: {result['side_stream']}"
    record.check(name, "ok" if ok else "failed", detail, result)
