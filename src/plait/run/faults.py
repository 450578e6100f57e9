"""Fault injection for tests and drills: ``PLAIT_INJECT_FAULT="rank=R,step=S[,kind=K][,attempt=A][;…]"``.

Kinds (what rank R does at 0-based optimizer step S):

* ``raise``: raise an error before the step (the default);
* ``kill``: SIGKILL itself in the middle of the step, after the backward, before the optimizer;
* ``kill-in-save``: SIGKILL itself while writing the checkpoint of S completed steps, after its
  files are written and before the checkpoint is committed;
* ``nan``: make its loss NaN at that step (to exercise ``--on-nan``).

The fault fires only in torchrun attempt ``A`` (default 0, the first), so an elastic restart
does not fail again at the same place. Several faults are separated by ``;``.

The worker parses the variable once into a ``FaultPlan`` and hands it to the training loop and
the Checkpointer, which call ``FaultPlan.at`` at the points named above; without the variable
the plan is empty and ``at`` does nothing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from plait.errors import PlaitError
from plait.run.env import RankEnv

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


@dataclass(frozen=True)
class FaultPlan:
    """This rank's faults in this torchrun attempt, fired by ``at(step, point)`` (no fault: does nothing).

    The training loop calls ``at`` at the points "before-step" (``raise``) and "after-backward"
    (``kill``, ``nan``), the Checkpointer at "in-save" (``kill-in-save``). Only the rank's first
    fault of a loop kind and its first ``kill-in-save`` are planned.
    """

    rank: int = 0
    step_fault: Fault | None = None  # raise, kill or nan
    save_fault: Fault | None = None  # kill-in-save

    @classmethod
    def parse(cls, text: str | None, rank: int, attempt: int) -> FaultPlan:
        """The faults of ``text`` (PLAIT_INJECT_FAULT's syntax; None or empty: none) for ``rank`` in ``attempt``."""
        faults = [parse_fault(item.strip()) for item in text.split(";")] if text else []
        mine = [f for f in faults if f.rank == rank and f.attempt == attempt]
        return cls(rank=rank, step_fault=next((f for f in mine if f.kind != "kill-in-save"), None),
                   save_fault=next((f for f in mine if f.kind == "kill-in-save"), None))

    @classmethod
    def from_environ(cls, env: RankEnv, environ: Mapping[str, str] | None = None) -> FaultPlan:
        """The plan of PLAIT_INJECT_FAULT in ``environ`` (default: this process's) for ``env``'s rank and attempt."""
        text = (os.environ if environ is None else environ).get("PLAIT_INJECT_FAULT")
        return cls.parse(text, env.rank, env.restart_count)

    def __bool__(self) -> bool:
        return self.step_fault is not None or self.save_fault is not None

    def at(self, step: int, point: str, loss=None):
        """Fire the fault planned at ``point`` of 0-based optimizer step ``step`` (for "in-save": the
        checkpoint of ``step`` completed steps), if any; returns ``loss`` (this rank's loss of the
        step at "after-backward"), multiplied by NaN for a ``nan`` fault."""
        if point == "in-save":
            if self.save_fault is not None and self.save_fault.step == step:
                kill_self()  # the checkpoint's files are written, the checkpoint is not committed
            return loss
        fault = self.step_fault
        if fault is None or fault.step != step:
            return loss
        if point == "before-step" and fault.kind == "raise":
            raise RuntimeError(f"injected fault (PLAIT_INJECT_FAULT) on rank {self.rank} at step {step}")
        if point == "after-backward" and fault.kind == "nan":
            return loss * float("nan")
        if point == "after-backward" and fault.kind == "kill":
            kill_self()  # mid-step: gradients computed, optimizer not stepped
        return loss


NO_FAULTS = FaultPlan()


def kill_self() -> None:
    """SIGKILL this process: no cleanup, no error file, like a machine failure."""
    os.kill(os.getpid(), 9)
