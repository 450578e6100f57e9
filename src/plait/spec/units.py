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


_TOKEN_SUFFIXES = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}


def parse_token_count(text: str) -> float:
    """A positive number of tokens from e.g. 2T, 300B, 1.5e12, 1_000_000 (K, M, B or G, T: powers of
    1000); ValueError otherwise."""
    raw = text.strip().replace("_", "").replace(",", "")
    scale = _TOKEN_SUFFIXES.get(raw[-1:].upper(), 1.0) if raw else 1.0
    number = raw[:-1] if scale != 1.0 else raw
    try:
        value = float(number) * scale
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{text!r} is not a positive token count, e.g. 2T, 300B or 1e12")
    return value
