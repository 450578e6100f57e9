"""Leave-one-layout-family-out: is a fit a property of the hardware, or of the layouts it saw? No torch.

A sweep row's *family* is its layout's dominant parallelism, the first that applies of:

  offload   activations (``offload > 0``) or optimizer states (``opt_offload``) on the host or disk
  pp <schedule>  pipeline parallel (``pp > 1``), one family per schedule (``pp 1f1b``, ``pp gpipe``, ...)
  cp        context parallel (``cp > 1``)
  tp        tensor parallel (``tp > 1``)
  ckpt      activation checkpointing (``ckpt`` other than none) on data parallel alone
  dp/zero   data parallel alone (DDP or ZeRO 1-3), no checkpointing

A published row's family is its source (paper, code base). For each family the parameters are
fitted again on the other families' rows and its rows are predicted with that fit: its held-out
error beside its in-sample error shows whether the fit learnt the machine or the family (a
parameter only one family exercises is fitted to it in-sample and left at the start without it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from plait.spec.layout import Layout

FAMILY_HOLDOUT = "leave-one-family-out"


def family_of(case) -> str:
    """A FitCase's family: the one it was given (a sweep row's layout family), else its source."""
    return case.family or case.source


def families_from_sources(per_source) -> list[FamilyErrors]:
    """The family table of published runs when the fit already held out each source (families are
    the sources: no second refit)."""
    return [FamilyErrors(s.source, s.rows, s.default, s.in_sample, s.leave_out, dict(s.leave_out_params))
            for s in per_source]


def layout_family(layout: Layout) -> str:
    """The family of a layout (see the module docstring)."""
    if layout.offload > 0 or layout.opt_offload:
        return "offload"
    if layout.pp > 1:
        return f"pp {layout.schedule}"
    if layout.cp > 1:
        return "cp"
    if layout.tp > 1:
        return "tp"
    if layout.ckpt != "none":
        return "ckpt"
    return "dp/zero"


@dataclass
class FamilyErrors:
    """One family's errors (fractions; NaN where not computed) and the fit without it."""

    family: str
    rows: int
    start: float  # with the starting parameters
    in_sample: float  # with the parameters fitted on every row
    held_out: float  # with the parameters fitted on the other families' rows
    held_out_params: dict = field(default_factory=dict)

    def to_dict(self, number) -> dict:
        return {"family": self.family, "rows": self.rows, "start": number(self.start),
                "in_sample": number(self.in_sample), "held_out": number(self.held_out),
                "held_out_params": self.held_out_params}


def leave_one_family_out(problem, names: tuple[str, ...], start, params, fit, error, aggregate,
                         notify=lambda text: None) -> tuple[list[FamilyErrors], int]:
    """(errors per family, evaluations) of ``problem``'s cases grouped by ``FitCase.family``.

    ``fit(subproblem) -> (params, evaluations)`` refits on the other families; ``error(case, params)``
    is one case's relative error; ``aggregate(errors)`` the objective. Empty with fewer than two
    families (nothing to hold out).
    """
    families = list(dict.fromkeys(family_of(case) for case in problem.cases))
    if len(families) < 2:
        return [], 0
    out, evaluations = [], 0
    for family in families:
        own = [case for case in problem.cases if family_of(case) == family]
        notify(f"refitting without the {family} family ({len(own)} rows)")
        refit, n = fit(problem.subset(lambda case, f=family: family_of(case) != f))
        evaluations += n
        out.append(FamilyErrors(family, len(own), aggregate([error(c, start) for c in own]),
                                aggregate([error(c, params) for c in own]), aggregate([error(c, refit) for c in own]),
                                {name: getattr(refit, name) for name in names}))
    return out, evaluations
