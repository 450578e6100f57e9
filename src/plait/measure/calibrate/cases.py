"""FitCase: one run the calibration fit can score (published row or sweep row), as data."""

from __future__ import annotations

from dataclasses import dataclass, replace

from plait.plan.cost import estimate_step
from plait.plan.params import CostParams


@dataclass(frozen=True)
class FitCase:
    """One usable run: its source, what it ran (model, cluster, job, layout) and its reported MFU."""

    id: str
    source: str
    specs: tuple  # (ModelSpec, ClusterSpec, JobSpec, Layout), as plait.measure.validate.runs.build_specs returns them
    reported_mfu: float
    runtime: str = "torch"  # whose kernels ran it (plait.plan.cost.estimate_step)
    software: tuple = ()  # (CostParams field, value) pairs the run's software fixes; never fitted
    family: str = ""  # held out together by leave-one-family-out (families.py; "": the source)

    def predicted_mfu(self, params: CostParams) -> float:
        if self.software:
            params = replace(params, **dict(self.software))
        return estimate_step(*self.specs, params, runtime=self.runtime).mfu
