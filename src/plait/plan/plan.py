"""Plan: one layout evaluated for one model, cluster and job - memory, time, warnings - as data.

``Plan.to_dict()`` is the file that ``plait plan --save`` writes and ``plait train --plan`` reads;
``Plan.from_dict`` / ``read_plan`` read it back (the warnings and the runtime's rules are checked
again on reading: they follow from the model, cluster, job and layout).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from plait.atomic import atomic_write_text
from plait.errors import PlaitError
from plait.plan.compiled import compiled_share
from plait.plan.cost import StepBreakdown, estimate_step
from plait.plan.flops import hardware_flops_per_token
from plait.plan.memory import MemoryBreakdown, estimate_memory
from plait.plan.params import DEFAULT_PARAMS, CostParams
from plait.spec.capabilities import runtime_violations
from plait.spec.hardware import ClusterSpec
from plait.spec.layout import JobSpec, Layout
from plait.spec.model import ModelSpec
from plait.spec.serialize import read_json_file
from plait.spec.validate import Violation, check, validate

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
    runtime_violations: tuple[Violation, ...] = ()  # rules of plait train it breaks (empty: it runs)
    compiled: float = 0.0  # share of the blocks priced under torch.compile (plait.plan.compiled.compiled_share)

    @property
    def fits(self) -> bool:
        return self.memory.fits

    @property
    def runnable(self) -> bool:
        """Whether ``plait train`` runs this layout (with the compile setting it was planned for)."""
        return not self.runtime_violations

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
                "memory_host_bytes": self.memory.host_bytes,
                "fits": self.fits,
                "compiled_blocks": self.compiled,
            },
            "warnings": [str(w) for w in self.warnings],
        }

    @classmethod
    def from_dict(cls, data: dict, path: str | Path = "plan") -> Plan:
        """The plan of ``to_dict()`` (a saved plan file's content); a missing part is one
        PlaitError naming it. Warnings and runtime rules are evaluated again from the parts."""
        model, cluster, job, layout = plan_parts_of(data, path)
        try:
            prediction = data["prediction"]
            memory = MemoryBreakdown(**prediction["memory_items_bytes"], capacity=prediction["memory_capacity_bytes"],
                                     stage=prediction["memory_stage"],
                                     host_bytes=prediction.get("memory_host_bytes", 0.0))
            step = StepBreakdown(**prediction["time_items_s"], step_time=prediction["step_time_s"],
                                 tokens_per_step=job.tokens_per_step, n_gpus=layout.world_size,
                                 model_flops_per_token=model.model_flops_per_token(job.seq_len),
                                 hardware_flops_per_token=hardware_flops_per_token(model, layout, job.seq_len),
                                 peak_flops=cluster.gpu.bf16_flops)
        except (KeyError, TypeError, AttributeError) as exc:
            raise _missing(path, exc) from None
        warnings = tuple(v for v in validate(model, cluster, job, layout) if v.severity == "warning")
        return cls(model, cluster, job, layout, memory, step, warnings, tuple(runtime_violations(model, layout, job)),
                   float(prediction.get("compiled_blocks", 0.0)))

    def save(self, path: str | Path) -> None:
        atomic_write_text(path, json.dumps(self.to_dict(), indent=2) + "\n", "plan")


def evaluate(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, layout: Layout,
             params: CostParams = DEFAULT_PARAMS, runtime: str = "torch", compile: bool | None = False) -> Plan:
    """Validate (raising PlaitError on any broken rule) and predict memory and time; ``runtime``: whose
    saved activations and pipeline buffers (``plait.spec.stack.Stack.runtime``); ``compile``: the
    runtime rules of ``plait train --compile`` when True (the pricing follows ``params.compiled_blocks``:
    ``plait.plan.compiled.with_compile`` sets both from one setting)."""
    warnings = check(model, cluster, job, layout)
    return Plan(model, cluster, job, layout, estimate_memory(model, cluster, job, layout, params, runtime=runtime),
                estimate_step(model, cluster, job, layout, params, runtime=runtime), tuple(warnings),
                tuple(runtime_violations(model, layout, job, compile=compile)), compiled_share(params, model, layout))


def load_plan(path: str | Path) -> dict:
    """Read a saved plan file (the dict form); checks the format tag."""
    data = read_json_file(path, "plan file")
    if not isinstance(data, dict) or data.get("format") != PLAN_FORMAT:
        raise PlaitError(f"{path}: not a plait plan (expected format {PLAN_FORMAT!r})")
    return data


def read_plan(path: str | Path) -> Plan:
    """A saved plan file as a Plan (format tag checked; one-line PlaitError on a missing part)."""
    return Plan.from_dict(load_plan(path), path)


def plan_parts_of(data: dict, path: str | Path = "plan") -> tuple[ModelSpec, ClusterSpec, JobSpec, Layout]:
    """(model, cluster, job, layout) of a plan dict (no prediction needed), with one-line errors."""
    try:
        return (ModelSpec.from_dict(data["model"]), ClusterSpec.from_dict(data["cluster"]),
                JobSpec.from_dict(data["job"]), Layout.from_dict(data["layout"]))
    except (KeyError, TypeError) as exc:
        raise _missing(path, exc) from None


def _missing(path: str | Path, exc: Exception) -> PlaitError:
    return PlaitError(f"{path}: plan file is missing {exc}; write it with plait plan --save")
