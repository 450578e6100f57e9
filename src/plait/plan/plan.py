"""Plan: one layout evaluated for one model, cluster and job - memory, time, warnings - as data.

``Plan.to_dict()`` is the file that ``plait plan --save`` writes and ``plait train --plan`` reads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from plait.errors import PlaitError
from plait.plan.cost import StepBreakdown, estimate_step
from plait.plan.memory import MemoryBreakdown, estimate_memory
from plait.plan.params import DEFAULT_PARAMS, CostParams
from plait.spec.hardware import ClusterSpec
from plait.spec.layout import JobSpec, Layout
from plait.spec.model import ModelSpec
from plait.spec.serialize import read_json_file
from plait.spec.validate import Violation, check

PLAN_FORMAT = "plait-plan/1"


@dataclass(frozen=True)
class Plan:
    model: ModelSpec
    cluster: ClusterSpec
    job: JobSpec
    layout: Layout
    memory: MemoryBreakdown
    step: StepBreakdown
    warnings: tuple[Violation, ...] = ()

    @property
    def fits(self) -> bool:
        return self.memory.fits

    def to_dict(self) -> dict:
        return {
            "format": PLAN_FORMAT,
            "model": self.model.to_dict(),
            "cluster": self.cluster.to_dict(),
            "job": self.job.to_dict(),
            "layout": self.layout.to_dict(),
            "layout_string": str(self.layout),
            "prediction": {
                "step_time_s": self.step.step_time,
                "tokens_per_s_per_gpu": self.step.tokens_per_s_per_gpu,
                "mfu": self.step.mfu,
                "hfu": self.step.hfu,
                "bottleneck": self.step.bottleneck,
                "time_items_s": self.step.items(),
                "memory_bytes": self.memory.total,
                "memory_capacity_bytes": self.memory.capacity,
                "memory_items_bytes": self.memory.items(),
                "memory_stage": self.memory.stage,
                "fits": self.fits,
            },
            "warnings": [str(w) for w in self.warnings],
        }

    def save(self, path: str | Path) -> None:
        try:
            Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        except OSError as exc:
            raise PlaitError(f"cannot write the plan to {path}: {exc}") from None


def evaluate(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, layout: Layout,
             params: CostParams = DEFAULT_PARAMS) -> Plan:
    """Validate (raising PlaitError on any broken rule) and predict memory and time."""
    warnings = check(model, cluster, job, layout)
    return Plan(model, cluster, job, layout, estimate_memory(model, cluster, job, layout, params),
                estimate_step(model, cluster, job, layout, params), tuple(warnings))


def load_plan(path: str | Path) -> dict:
    """Read a saved plan file (the dict form); checks the format tag."""
    data = read_json_file(path, "plan file")
    if not isinstance(data, dict) or data.get("format") != PLAN_FORMAT:
        raise PlaitError(f"{path}: not a plait plan (expected format {PLAN_FORMAT!r})")
    return data
