"""Communication hidden behind compute: what is left on the critical path. Seconds."""

from __future__ import annotations

from plait.plan.params import CostParams


def exposed(comm_time: float, window: float, params: CostParams, overlap: float | None = None) -> float:
    """Seconds of ``comm_time`` left on the critical path when it may hide behind ``overlap``
    (default ``params.dp_overlap``) of ``window`` seconds of compute; the hidden part still slows
    that compute by ``params.overlap_slowdown`` of itself."""
    hidden_capacity = (params.dp_overlap if overlap is None else overlap) * window
    return max(0.0, comm_time - hidden_capacity) + params.overlap_slowdown * min(comm_time, hidden_capacity)
