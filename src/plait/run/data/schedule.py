"""Which source of a data mixture each global sample reads: an exact-proportion schedule (no torch).

Weights are exact fractions (``Fraction("0.3")`` is 3/10, never a binary float), normalized to
integers ``w_s`` with ``P = sum(w_s)`` and no common divisor. Sample ``i`` of one period of
``P`` samples goes to a source that lags its share, as Megatron's blended datasets do, with
Tijdeman's rule for the chairman assignment problem (1980) picking among the ``k`` sources: of
those at least ``1/(2k-2)`` sample behind ``weight * (i + 1)``, the one that would soonest fall
``1 - 1/(2k-2)`` behind (the lowest index on a tie). It keeps every source within
``1 - 1/(2k-2)`` samples of its share at every prefix (Megatron's plain largest-lag greedy can
drift just past one sample with many sources), so after ``P`` samples every source has exactly
``w_s``, and the period repeats: global sample ``g`` reads
source ``order[g % P]``, as its ``(g // P) * w_s + before[g % P]``-th sample. Both are pure
integer functions of ``g`` and the weights - independent of the layout, of the seed and of
which rank asks - so a run resumed on any layout reads the same samples; ``counts(n)`` (the
samples of each source among the first ``n``) stays within one sample of ``weight * n`` at
every prefix (tests/run/test_data_schedule.py checks it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from plait.errors import PlaitError

MAX_PERIOD = 100_000  # samples in one period of the schedule (weights with up to 5 decimals fit)


class Schedule:
    """The exact-proportion schedule of ``weights`` (positive fractions, normalized here)."""

    def __init__(self, weights: Sequence[Fraction]) -> None:
        if not weights:
            raise PlaitError("a data mixture needs at least one source")
        if any(w <= 0 for w in weights):
            raise PlaitError(f"data weights must be > 0, got {', '.join(str(float(w)) for w in weights)}")
        common = math.lcm(*(Fraction(w).denominator for w in weights))
        ints = [int(Fraction(w) * common) for w in weights]
        divisor = math.gcd(*ints)
        self.shares = [w // divisor for w in ints]  # w_s: source s's samples per period
        self.period = sum(self.shares)  # P
        if self.period > MAX_PERIOD:
            raise PlaitError(f"data weights {', '.join(str(float(w)) for w in weights)} need a schedule period of "
                             f"{self.period:,} samples (more than {MAX_PERIOD:,}); round them to fewer decimals")
        self.weights = [Fraction(w, self.period) for w in self.shares]  # normalized: they sum to 1
        k, period = len(self.shares), self.period
        order = np.empty(period, dtype=np.int32)
        before = np.empty(period, dtype=np.int64)  # samples of order[i]'s source among the period's first i
        count = [0] * k
        m = max(1, 2 * k - 2)
        for i in range(period):
            lag = [self.shares[s] * (i + 1) - period * count[s] for s in range(k)]  # in 1/P samples
            # Tijdeman's rule: of the sources at least 1/(2k-2) sample behind, the one that would
            # first fall 1 - 1/(2k-2) behind (the earliest deadline); the lowest index on a tie
            due = [s for s in range(k) if m * lag[s] >= period]
            s = min(due, key=lambda s: (Fraction((m - 1) * period - m * lag[s], self.shares[s]), s))
            order[i], before[i] = s, count[s]
            count[s] += 1
        self.order, self.before = order, before

    def locate(self, g: np.ndarray | Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(source, its sample index) of each global sample index in ``g`` (int64 arrays)."""
        g = np.asarray(g, dtype=np.int64)
        if g.size and int(g.min()) < 0:
            raise PlaitError(f"global sample index must be >= 0, got {int(g.min())}")
        rest = g % self.period
        source = self.order[rest].astype(np.int64)
        shares = np.asarray(self.shares, dtype=np.int64)
        return source, (g // self.period) * shares[source] + self.before[rest]

    def counts(self, n: int) -> list[int]:
        """Samples of each source among global samples 0..n-1."""
        full, rest = divmod(int(n), self.period)
        head = np.bincount(self.order[:rest], minlength=len(self.shares))
        return [full * w + int(c) for w, c in zip(self.shares, head)]
