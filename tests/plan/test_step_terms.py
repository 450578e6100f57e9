"""The step-time model's items are declared once (plait.plan.terms.items) and its mechanisms are one
function each (plait.plan.terms): the breakdown, --explain and the report's timeline follow the
declaration, and estimate_step is exactly the sum of its terms."""

from __future__ import annotations

import dataclasses

import pytest

from plait.plan.cost import StepBreakdown, estimate_step
from plait.plan.params import DEFAULT_PARAMS
from plait.plan.terms.items import STAGE_WORK_ITEMS, TIME_ITEM_NAMES, TIME_ITEMS
from plait.spec.hardware import CLUSTERS
from plait.spec.layout import JobSpec, Layout
from plait.spec.models import MODELS

TOTALS = {"step_time", "tokens_per_step", "n_gpus", "model_flops_per_token", "hardware_flops_per_token",
          "peak_flops"}


def test_the_breakdown_fields_are_the_declared_items():
    fields = {f.name for f in dataclasses.fields(StepBreakdown)}
    assert fields - TOTALS == set(TIME_ITEM_NAMES)
    assert len(TIME_ITEM_NAMES) == len(set(TIME_ITEM_NAMES)) and all(item.holds for item in TIME_ITEMS)
    assert set(STAGE_WORK_ITEMS) < set(TIME_ITEM_NAMES) and "bubble" not in STAGE_WORK_ITEMS


@pytest.mark.parametrize("layout", [
    Layout(dp=4, tp=2, pp=4, vpp=2, mbs=1, zero=1, ckpt="full", schedule="interleaved-1f1b"),
    Layout(dp=16, tp=2, mbs=2, zero=3, ckpt="selective"),
    Layout(dp=8, tp=4, cp=2, mbs=1, zero=2, cp_impl="torch"),
    Layout(dp=32, mbs=1, zero=0, offload=0.5, ckpt="full"),
])
def test_the_step_is_the_sum_of_its_items(layout):
    """Every second of the step is in exactly one item: the items add up to the step time."""
    model, cluster = MODELS["llama2-13b"], CLUSTERS["dgx-h100"].with_gpus(32)
    job = JobSpec(global_batch=256, seq_len=4096)
    params = dataclasses.replace(DEFAULT_PARAMS, pp_comm_overlap=0.5, layer_overhead_s=1e-4)
    step = estimate_step(model, cluster, job, layout, params)
    assert sum(step.items().values()) == pytest.approx(step.step_time, rel=1e-12)
    assert list(step.items()) == list(TIME_ITEM_NAMES)  # --explain's rows, in the declared order
