"""The micro-benchmarks of ``plait profile``, run inside the profile worker. Seconds, bytes, FLOPs.

Each function times one kind of work on this rank's device and returns plain dicts (the raw
measurements written to the calibration file). Timing: a warm-up call, then batches of calls
between device synchronizations, each batch long enough (``min_time_s``) for the clock; the
result is the median batch's time per call. Work whose ratio is fitted (attention's forward and
forward + backward) is timed in interleaved batches (``time_interleaved``), so that a busy spell of
a shared machine does not land on one side of the ratio. Collectives are timed the same way after a
barrier, and each size reports the slowest rank's time (what the other ranks wait for).
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn, device: torch.device, min_time_s: float, batches: int = 3, max_calls: int = 1000,
              agree=None) -> float:
    """Median seconds per call of ``fn()`` (after one warm-up call).

    ``agree(calls) -> calls`` makes every rank run the same number of calls (collectives).
    """
    return time_interleaved([fn], device, min_time_s, batches, max_calls, agree)[0]


def time_interleaved(fns: list, device: torch.device, min_time_s: float, batches: int = 3,
                     max_calls: int = 1000, agree=None) -> list[float]:
    """Median seconds per call of each of ``fns``: one warm-up call each, one timed call to size its
    batches (``min_time_s`` long; ``agree`` as in ``time_call``), then ``batches`` rounds of one batch
    per function in turn (fn 0, fn 1, ..., fn 0, ...): a busy spell of the machine slows every
    function's batch of that round, not one function's every batch, so their ratio stays the device's."""
    calls = []
    for fn in fns:
        fn()
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        n = int(min(max_calls, max(1, min_time_s / max(time.perf_counter() - start, 1e-7))))
        calls.append(agree(n) if agree is not None else n)
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(batches):
        for fn, n, out in zip(fns, calls, samples):
            start = time.perf_counter()
            for _ in range(n):
                fn()
            _sync(device)
            out.append((time.perf_counter() - start) / n)
    return [statistics.median(out) for out in samples]


def gemm(cases: list[dict], device: torch.device, dtype: torch.dtype, min_time_s: float, tick) -> list[dict]:
    """(m×k)·(k×n) matmuls; ``cases``: dicts with name, m, k, n, tp."""
    out = []
    for case in cases:
        m, k, n = case["m"], case["k"], case["n"]
        a = torch.randn(m, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        c = torch.empty(m, n, device=device, dtype=dtype)
        seconds = time_call(lambda a=a, b=b, c=c: torch.mm(a, b, out=c), device, min_time_s)
        flops = 2.0 * m * k * n
        out.append({**case, "flops": flops, "time_s": seconds, "flops_per_s": flops / seconds})
        tick(f"gemm {case['name']} {m}x{k}x{n}")
    return out


def attention(cases: list[dict], device: torch.device, dtype: torch.dtype, min_time_s: float, tick) -> list[dict]:
    """Causal ``scaled_dot_product_attention`` forward, and forward + backward.

    ``cases``: dicts with batch, heads, seq_len, head_dim. ``flops`` is the planner's causal count
    of the forward (4·b·heads·d·s·(s+1)/2), so the fitted efficiency is on the planner's basis.
    """
    import torch.nn.functional as F

    out = []
    for case in cases:
        b, heads, s, d = case["batch"], case["heads"], case["seq_len"], case["head_dim"]
        q, k, v = (torch.randn(b, heads, s, d, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
        grad = torch.randn(b, heads, s, d, device=device, dtype=dtype)

        def forward(q=q, k=k, v=v):
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, is_causal=True)

        def forward_backward(q=q, k=k, v=v, grad=grad):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            torch.autograd.grad(y, (q, k, v), grad)

        fwd, fwd_bwd = time_interleaved([forward, forward_backward], device, min_time_s)  # their ratio is fitted
        flops = 4.0 * b * heads * d * s * (s + 1) / 2.0
        out.append({**case, "flops": flops, "fwd_s": fwd, "fwd_bwd_s": fwd_bwd, "fwd_flops_per_s": flops / fwd})
        tick(f"attention s={s}")
    return out


def memory(sizes: list[int], device: torch.device, min_time_s: float, tick) -> list[dict]:
    """Device-to-device copies of ``sizes`` bytes; bandwidth counts the read and the write."""
    out = []
    for nbytes in sizes:
        src = torch.empty(nbytes // 4, device=device, dtype=torch.float32).fill_(1.0)
        dst = torch.empty_like(src)
        seconds = time_call(lambda src=src, dst=dst: dst.copy_(src), device, min_time_s)
        out.append({"bytes": nbytes, "time_s": seconds, "bytes_per_s": 2.0 * nbytes / seconds})
        tick(f"memory copy {nbytes >> 20} MiB")
    return out


def kernel_overhead(device: torch.device, min_time_s: float) -> float:
    """Seconds per launch of a one-element kernel, back to back (launch cost and tail)."""
    x = torch.zeros(1, device=device)
    return time_call(lambda: x.add_(1.0), device, min_time_s, max_calls=10000)


def host_link(nbytes: int, device: torch.device, min_time_s: float) -> list[dict]:
    """Pinned host <-> GPU copies (PCIe or C2C), one direction at a time."""
    host = torch.empty(nbytes // 4, dtype=torch.float32, pin_memory=True)
    dev = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
    to_device = time_call(lambda: dev.copy_(host, non_blocking=True), device, min_time_s)
    to_host = time_call(lambda: host.copy_(dev, non_blocking=True), device, min_time_s)
    return [{"direction": "host_to_device", "bytes": nbytes, "time_s": to_device, "bytes_per_s": nbytes / to_device},
            {"direction": "device_to_host", "bytes": nbytes, "time_s": to_host, "bytes_per_s": nbytes / to_host}]


def _all_gather(output, tensor, group):
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(output, tensor, group=group)


def _reduce_scatter(output, tensor, group):
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    fn(output, tensor, group=group)


def _operation(op: str, nbytes: int, group, ranks: list[int], device: torch.device):
    """A zero-argument function running ``op`` over ``group`` on a ``nbytes`` (full) buffer."""
    n = len(ranks)
    elements = max(n, nbytes // 4 // n * n)
    full = torch.ones(elements, device=device, dtype=torch.float32)
    part = torch.ones(elements // n, device=device, dtype=torch.float32)
    if op == "all_reduce":
        return lambda: dist.all_reduce(full, group=group)
    if op == "all_gather":
        return lambda: _all_gather(full, part, group)
    if op == "reduce_scatter":
        return lambda: _reduce_scatter(part, full, group)
    if op == "all_to_all":
        other = torch.empty_like(full)
        return lambda: dist.all_to_all_single(other, full, group=group)
    if op == "send_recv":  # every rank sends to the next in the group and receives from the previous
        me = ranks.index(dist.get_rank())
        dst, src = ranks[(me + 1) % n], ranks[(me - 1) % n]
        incoming = torch.empty_like(full)

        def exchange():  # batched: NCCL would deadlock on two unbatched sends issued first
            ops = [dist.P2POp(dist.isend, full, dst, group), dist.P2POp(dist.irecv, incoming, src, group)]
            for request in dist.batch_isend_irecv(ops):
                request.wait()
        return exchange
    raise ValueError(op)


def agree_calls(calls: int, device: torch.device) -> int:
    """The largest call count any rank chose (every rank must run the same collectives)."""
    count = torch.tensor([calls], device=device, dtype=torch.float32)
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    return int(count.item())


def collectives(ops: list[str], sizes: list[int], groups: list[tuple[str, list[list[int]]]], device: torch.device,
                min_time_s: float, tick) -> list[dict]:
    """Time every op and size over each scope's groups (all groups of a scope run at once).

    ``groups``: (scope name, list of rank lists); every rank must be in exactly one list of a scope.
    """
    out = []
    rank = dist.get_rank()
    for scope, rank_lists in groups:
        handles = dist.new_subgroups_by_enumeration(rank_lists)[0] if len(rank_lists) > 1 else None
        mine = next(r for r in rank_lists if rank in r)
        group = handles if handles is not None else dist.new_group(mine)
        for op in ops:
            for nbytes in sizes:
                fn = _operation(op, nbytes, group, mine, device)
                dist.barrier()
                seconds = time_call(fn, device, min_time_s, max_calls=200, agree=lambda c: agree_calls(c, device))
                seconds = torch.tensor([seconds], device=device)
                dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
                out.append({"op": op, "scope": scope, "group_size": len(mine), "bytes": nbytes,
                            "time_s": float(seconds.item())})
                tick(f"{op} {scope} {nbytes >> 10} KiB")
    return out
