"""Accuracy on runs the model was not fitted to: leave one source out, for each source in turn. No torch.

A *source* here is a code base or paper (``code_base``): every table of Megatron-Bridge (dense and
MoE, all releases) is one source, both torchtitan batches are one, so a held-out source shares no
software with what the fit saw. For each source the fittable defaults (``FIT_PARAMS``:
``plait.measure.calibrate.fit``) are fitted again on every other source's rows (median relative
MFU error), and the source's rows are predicted with that fit; the rows' software stacks
(``plait.spec.stack``) are fixed numbers with sources, never fitted. The error is reported in MFU
points on plait's one basis (model FLOPs over the dense bf16 peak), per source and overall.

The search starts at the shipped defaults, which were themselves chosen on the first calibration
batch: read the held-out numbers as "how far the defaults carry to software they were not adjusted
to", the number ``plait plan`` quotes as how sure it is.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

from plait.errors import PlaitError
from plait.measure.calibrate.fit import FitProblem, minimize, usable_cases
from plait.plan.params import DEFAULT_PARAMS, CostParams

# (words of a row's source, the code base it names), first match wins; other sources are their own
CODE_BASES = (
    ("megatron-bridge", "Megatron-Bridge (NVIDIA)"),
    ("megatron-moe-modelzoo", "Megatron-MoE-ModelZoo (NVIDIA)"),
    ("nemo", "NeMo (NVIDIA)"),
    ("torchtitan", "torchtitan"),
    ("llm-foundry", "llm-foundry (MosaicML)"),
    ("narayanan", "Megatron-LM, Narayanan et al. 2021"),
    ("korthikanti", "Megatron-LM, Korthikanti et al. 2022"),
)
FIT_PARAMS = ("elementwise_passes", "tp_comm_overlap", "dp_overlap", "microbatch_overhead_s")
WITHIN_POINTS = 4.0


def code_base(source: str) -> str:
    """The code base a row's ``source`` names (``CODE_BASES``), else the source itself."""
    text = source.lower()
    return next((name for words, name in CODE_BASES if words in text), source)


@dataclass
class SourceAccuracy:
    """One held-out source: its rows' |MFU error| in points with the shipped defaults (``in_sample``:
    in-sample for the first batch's sources, whose rows chose them) and with the fit made without it
    (held out), and that fit's parameters."""

    source: str
    in_sample: list[float]
    held_out: list[float]
    fitted: dict[str, float] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return len(self.held_out)


@dataclass
class CrossValidation:
    sources: list[SourceAccuracy]
    names: tuple[str, ...]
    skipped: dict[str, int]

    def all(self, which: str) -> list[float]:
        return [e for s in self.sources for e in getattr(s, which)]

    def record(self) -> dict:
        """What ``plait plan`` quotes (``plait/data/validation.json``), rounded as printed."""
        held, inside = self.all("held_out"), self.all("in_sample")
        return {"runs_compared": len(held), "sources": len(self.sources),
                "held_out_median_points": round(statistics.median(held), 1),
                "held_out_within_4_points": round(within(held), 2),
                "in_sample_median_points": round(statistics.median(inside), 1),
                "worst_source_median_points": round(max(statistics.median(s.held_out) for s in self.sources), 1)}


def within(errors: list[float], points: float = WITHIN_POINTS) -> float:
    return sum(e <= points for e in errors) / len(errors) if errors else float("nan")


def _points(case, params: CostParams) -> float:
    return abs(case.predicted_mfu(params) - case.reported_mfu) * 100.0


def cross_validate(paths: list[str | Path], names: tuple[str, ...] = FIT_PARAMS, rounds: int = 4,
                   points: int = 7, polish: int = 10, progress=None) -> CrossValidation:
    """Leave-one-source-out over the runs of ``paths`` (published-runs CSVs); see the module docstring."""
    cases, skipped = usable_cases(paths)
    groups: dict[str, list] = {}
    for case in cases:
        groups.setdefault(code_base(case.source), []).append(case)
    if len(groups) < 2:
        raise PlaitError(f"leaving a source out needs runs of at least two sources; these are all from "
                         f"{next(iter(groups))} (plait calibrate fit holds out by run instead)")
    notify = progress or (lambda text: None)
    out = []
    for source, members in groups.items():
        notify(f"fitting without {source} ({len(members)} rows)")
        rest = FitProblem(tuple(c for c in cases if code_base(c.source) != source))
        fitted, _, _ = minimize(rest, names, DEFAULT_PARAMS, rounds=rounds, points=points, polish=polish)
        out.append(SourceAccuracy(source, [_points(c, DEFAULT_PARAMS) for c in members],
                                  [_points(c, fitted) for c in members],
                                  {n: getattr(fitted, n) for n in names}))
    return CrossValidation(out, names, skipped)
