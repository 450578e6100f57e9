"""Units and small helpers shared by every layer (no torch, no other plait imports).

Sizes are bytes: ``GIB``/``MIB``/``KIB`` are binary (2**30, 2**20, 2**10), ``GB`` is decimal (1e9,
the unit of vendors' bandwidths). ``DEFAULT_GPU`` is the GpuSpec preset used to rank and predict
when a run names no GPU.
"""

from __future__ import annotations

KIB = 1024
MIB = 1024**2
GIB = 1024**3
MIB_BYTES = MIB  # older name of MIB, still imported from plait.spec.hardware
GB = 1e9

DEFAULT_GPU = "h100-sxm"


def divisors(n: int, limit: int | None = None) -> list[int]:
    """The positive divisors of ``n`` in increasing order, up to ``limit`` (default: ``n``); O(√n)."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return [x for x in small + large[::-1] if x <= (limit or n)]
