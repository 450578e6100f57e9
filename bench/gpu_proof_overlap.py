"""The GPU proof's check of the expert overlap's CUDA side stream (issue 33, item 3), on one GPU.

``moe_overlap=chunked`` and ``shared`` issue their all-to-alls on a side stream on CUDA
(``plait.run.parallel.expert_overlap``): the side stream first waits for the current one, the send
and receive buffers are ``record_stream``-ed on it, and the wait makes the current stream wait for
the side stream. The backend's own work handle already keeps the same ordering around the stream it
is issued from: NCCL runs the collective on its own stream after waiting for the issuing stream,
and ``work.wait()`` makes the current stream wait for it; gloo's CUDA all-to-all does the same with
a private stream that stages the rows through pinned host memory (PyTorch's ``ProcessGroupGloo``,
``AsyncAlltoallCUDAWork``: an event recorded on the issuing stream, the buffers recorded on its
stream, the caller's current stream blocked on the copy back at the wait). So the side stream adds
no overlap under either backend, and its final wait and ``record_stream`` duplicate the handle's.
What can go wrong is the first wait: the backend waits for the *side* stream, so a side stream that
did not wait for the current one lets the all-to-all read rows the expert GEMMs have not written
yet (or the previous round's). That shows here as a difference; a missing final wait or
``record_stream`` does not (the handle covers them).

NCCL refuses two ranks on one GPU, so the two ep ranks run here as two processes on the one GPU
with gloo. Each rank runs one MoE exchange (8 experts, ep=2, random rows; forward and backward; fp32
with TF32 off) through the plain ``AllToAllDispatcher`` and through ``OverlappedDispatcher`` in each
mode, several times (the allocator reuses freed blocks, so rows read early come from the previous
round), and compares the output and every gradient with the plain dispatcher's: they may differ
only by the order of the expert weight gradients' sums (chunked sums them per chunk), at most
2·n·2^-24 of the largest value with n = max(FFN, 2·ROWS) terms per sum (the linear worst case of
fp32 summation). It also checks that the CUDA runs used the side stream. What this cannot show:
NCCL's kernels overlapping the expert GEMMs, which needs two GPUs.

Time: the moe step runs this last, with what is left of its limit (``check``'s ``budget_s``): the
wait for the ranks' result stops ``CLEANUP_S`` before it, and the two processes are ended in a
``finally`` (terminate, a short join, kill) whatever happens, the step's ``StepTimeout`` included,
so no rank outlives the step on the GPU. On a 2-core CPU the dry run's check took 7.1 s when quiet,
19.5 s when shared with other jobs: the two processes' spawn and imports (torch, plait) 9-14 s of
it, gloo's set-up 0.4 s, the three rounds 4.0, 0.9 and 0.5 s. On an H100 it has not run yet; estimated 8-13 s from those parts: the imports
3-5 s (16 cores, both at once, files cached by the step's own import), a CUDA context per process
1-2 s, the first round's first use of each kernel and of cuBLAS 2-4 s, the later rounds (tensors of
at most 192 x 96) well under a second each, the exit 1 s. The moe step leaves it about 29 s.

A dry run (``--dry-run``) runs the same code on the CPU with gloo's CPU all-to-all (no side stream).
"""

from __future__ import annotations

import os
import socket
import time
import traceback
from datetime import timedelta

HIDDEN, FFN, EXPERTS, ROWS = 64, 96, 8, 96  # ROWS per rank, before routing
ROUNDS = 3
FP32_UNIT = 2.0**-24
MODES = ("chunked", "shared")
JOIN_S, KILL_JOIN_S = 2.0, 1.0  # stop(): a polite join, then SIGTERM and a join, then SIGKILL and a join
CLEANUP_S = 2 * JOIN_S + KILL_JOIN_S + 1.0  # check(): the wait ends this long before the budget (1 s: spawn)
MIN_WAIT_S = 12.0  # check(): less left to wait is not worth two CUDA processes (estimated 8-13 s on an H100)


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
    The processes are gone on return and on any exception (``stop``): at most ``timeout_s`` +
    ``CLEANUP_S`` in all. Also used by bench/moe_overlap.py."""
    import queue as queues

    import torch.multiprocessing as mp

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = mp.get_context("spawn")
    results = context.Queue()
    ranks, result = [], None
    try:
        for rank in range(2):
            process = context.Process(target=worker, args=(rank, port, *args, results))
            process.start()
            ranks.append(process)
        try:
            result = results.get(timeout=timeout_s)
        except queues.Empty:  # a rank hung or died
            result = {"error": f"no result within {timeout_s:.0f} s"}
    finally:  # also on StepTimeout (a BaseException): no rank may keep the GPU into the next step
        stop(ranks, polite=result is not None and "error" not in result)
    return result


def stop(processes, polite: bool) -> None:
    """End ``processes`` in at most ``CLEANUP_S``: when ``polite`` (they sent their result and are
    leaving: barrier, gloo's teardown) a join of up to ``JOIN_S`` first; then SIGTERM, a join of up
    to ``JOIN_S``, SIGKILL and a last join."""
    def join_all(seconds: float) -> None:
        deadline = time.monotonic() + seconds
        for process in processes:
            process.join(timeout=max(0.0, deadline - time.monotonic()))

    if polite:
        join_all(JOIN_S)
    alive = [p for p in processes if p.is_alive()]
    for process in alive:
        process.terminate()
    join_all(JOIN_S)
    for process in alive:
        if process.is_alive():
            process.kill()
    join_all(KILL_JOIN_S)


def side_stream_check(cuda: bool, timeout_s: float = 90.0) -> dict:
    """Run the two ranks (module docstring): {"worst": {mode: relative difference}, "side_stream":
    {mode: used}, "bound": ...} or {"error": text}."""
    return {**two_ranks(_worker, (cuda,), timeout_s), "bound": bound()}


def check(record, cuda: bool, budget_s: float | None = None) -> None:
    """Record the check as ``moe: overlap side stream`` (ok, or failed with what went wrong), ending
    within ``budget_s`` seconds (what is left of the step's limit; None: no limit, 90 s to wait);
    skipped, saying so, when that leaves under ``MIN_WAIT_S`` to wait for the ranks."""
    name = "moe: overlap side stream (2 ranks, gloo, one GPU)"
    wait = 90.0 if budget_s is None else budget_s - CLEANUP_S
    if wait < MIN_WAIT_S:
        record.check(name, "skipped", f"not run: {budget_s:.0f} s of the step's limit left, it needs "
                     f"{MIN_WAIT_S + CLEANUP_S:.0f} (GPU_PROOF_LIMITS=moe=... raises the limit)")
        return
    result = side_stream_check(cuda, wait)
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
