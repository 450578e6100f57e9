"""How ``plait report --sweep CSV --plan FILE`` prices the saved plan: never silently with a
calibration for another device (issue 31).

A saved plan records its prediction (``Plan.to_dict``: seconds per step by item) and its cluster
(the GPU it was planned for). The sweep's calibration may describe another device (a CPU profile
beside a plan for A100s, or another GPU): then the report shows the plan's own saved prediction
(its time items; memory per stage with the default cost parameters) and says in one line that the
devices differ, with what the sweep's calibration would have made of it. When the calibration is for
the plan's GPU (or names no device, as a fit over published runs does), the plan is re-priced with
it and labelled so, with the saved step time beside it. No torch.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from plait.errors import PlaitError
from plait.measure.report.chart_data import duration
from plait.plan.cost import StepBreakdown
from plait.plan.params import DEFAULT_PARAMS, CostParams
from plait.plan.plan import Plan, evaluate, load_plan, plan_parts_of

MAX_SAVED_SECONDS = 1e15  # a saved step time beyond this (31 million years) is not read as a prediction


@dataclass(frozen=True)
class PlanPricing:
    """The plan as the report shows it and how it was priced.

    Attributes:
        plan: what the tables and pictures show (step times in seconds, memory in bytes).
        params: the cost parameters of the memory per stage.
        label: one line for plot titles and the table ("time: ..., memory: ...").
        rows: (what, value) rows for the plan's table: the saved and the re-priced step time.
        notes: lines under the table (the devices differ; saved and shown disagree).
    """

    plan: Plan
    params: CostParams
    label: str
    rows: tuple[tuple[str, str], ...]
    notes: tuple[str, ...]


def calibration_device(calibration) -> str:
    """The device a calibration describes: "CPU" (a CPU profile), its GPU preset, or "" (none named)."""
    if calibration is None:
        return ""
    return "CPU" if calibration.cpu_profile else (calibration.gpu or "")


def saved_step_time(data: dict) -> float | None:
    """The plan file's saved step time in seconds, or None when it has none that reads as one."""
    prediction = data.get("prediction")
    value = prediction.get("step_time_s") if isinstance(prediction, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and 0 < value <= MAX_SAVED_SECONDS else None


def saved_step(data: dict, step: StepBreakdown) -> StepBreakdown | None:
    """``step`` with the plan file's saved time items and step time (seconds), or None when the file's
    prediction is missing, names other items, or holds a value that is not a finite time."""
    total = saved_step_time(data)
    items = data["prediction"].get("time_items_s") if total is not None else None
    if not isinstance(items, dict) or set(items) != set(step.items()):
        return None
    for value in items.values():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or not 0 <= value <= MAX_SAVED_SECONDS:
            return None
    return dataclasses.replace(step, **{k: float(v) for k, v in items.items()}, step_time=total)


def _repriced(parts, params: CostParams) -> Plan | None:
    try:
        return evaluate(*parts, params)
    except PlaitError:
        return None


def price_saved_plan(plan_path: str, calibration=None, calibration_path: str = "") -> PlanPricing:
    """How the report shows the plan in ``plan_path`` beside a sweep whose calibration is
    ``calibration`` (a ``plait.plan.calibration.Calibration``; None: the sweep used none)."""
    data = load_plan(plan_path)
    parts = plan_parts_of(data, plan_path)
    plan_gpu = parts[1].gpu.name
    default = evaluate(*parts, DEFAULT_PARAMS)
    saved = saved_step_time(data)
    rows = [("step time saved in the plan file", duration(saved) if saved is not None else "not recorded")]
    if calibration is None:
        plan, params, label = default, DEFAULT_PARAMS, f"default cost parameters (the plan is for {plan_gpu})"
        notes = []
    else:
        device = calibration_device(calibration)
        named = f"for {device}" if device else "names no device"
        repriced = _repriced(parts, calibration.params)
        rows.append((f"step time re-priced with the sweep's calibration ({named}; the plan is for {plan_gpu})",
                     duration(repriced.step.step_time) if repriced is not None else "not priced (the plan breaks "
                                                                                      "a rule with it)"))
        if device in ("", plan_gpu) and repriced is not None:
            plan, params, notes = repriced, calibration.params, []
            label = f"re-priced with the sweep's calibration {calibration_path} ({named}), plan for {plan_gpu}"
        else:
            step = saved_step(data, default.step)
            plan, params = (dataclasses.replace(default, step=step) if step is not None else default), DEFAULT_PARAMS
            time_of = "the plan's own saved prediction" if step is not None else \
                "default cost parameters (the plan file's prediction is unreadable)"
            label = f"time: {time_of}; memory: default cost parameters; plan for {plan_gpu}, not re-priced " \
                    f"with the sweep's calibration for {device or 'another device'}"
            notes = [f"the sweep's calibration {calibration_path} is for {device or 'another device'}, the plan "
                     f"{plan_path} for {plan_gpu}: the plan is shown with {time_of}, not re-priced with that "
                     "calibration" + (f" (which would give {duration(repriced.step.step_time)} per step)"
                                      if repriced is not None else "")]
    if saved is not None and abs(plan.step.step_time / saved - 1) > 1e-6:
        notes.append(f"the plan file predicted {duration(saved)} per step when it was saved; the report shows "
                     f"{duration(plan.step.step_time)} ({label})")
    return PlanPricing(plan, params, label, tuple(rows), tuple(notes))
