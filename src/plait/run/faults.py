"""Fault injection for tests and drills: ``PLAIT_INJECT_FAULT="rank=R,step=S[,kind=K][,attempt=A][;…]"``.

Kinds (what rank R does at 0-based optimizer step S):

* ``raise``: raise an error before the step (the default);
* ``kill``: SIGKILL itself in the middle of the step, after the backward, before the optimizer;
* ``kill-in-save``: SIGKILL itself while writing the checkpoint of S completed steps, after its
  files are written and before the checkpoint is committed;
* ``nan``: make its loss NaN at that step (to exercise ``--on-nan``).

The fault fires only in torchrun attempt ``A`` (default 0, the first), so an elastic restart
does not fail again at the same place. Several faults are separated by ``;``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from plait.errors import PlaitError

KINDS = ("raise", "kill", "kill-in-save", "nan")


@dataclass(frozen=True)
class Fault:
    rank: int
    step: int
    kind: str = "raise"
    attempt: int = 0


def parse_fault(text: str) -> Fault:
    try:
        fields = dict(item.split("=", 1) for item in text.split(","))
        fault = Fault(rank=int(fields.pop("rank")), step=int(fields.pop("step")), kind=fields.pop("kind", "raise"),
                      attempt=int(fields.pop("attempt", "0")))
    except (KeyError, ValueError) as exc:
        raise PlaitError(f"PLAIT_INJECT_FAULT={text!r}: expected rank=R,step=S[,kind=K][,attempt=A] ({exc})") from None
    if fields or fault.kind not in KINDS:
        raise PlaitError(f"PLAIT_INJECT_FAULT={text!r}: unknown keys {sorted(fields)} or kind (one of {KINDS})")
    return fault


def injected_fault(rank: int, *kinds: str) -> Fault | None:
    """This rank's first fault in this attempt (of one of ``kinds``, if given), or None."""
    text = os.environ.get("PLAIT_INJECT_FAULT")
    if not text:
        return None
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    for item in text.split(";"):
        fault = parse_fault(item.strip())
        if fault.rank == rank and fault.attempt == attempt and (not kinds or fault.kind in kinds):
            return fault
    return None


def kill_self() -> None:
    """SIGKILL this process: no cleanup, no error file, like a machine failure."""
    os.kill(os.getpid(), 9)
