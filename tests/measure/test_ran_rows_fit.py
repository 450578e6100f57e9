"""Layouts that a source ran are predicted to fit (issue 29, item 3): the shipped rows that the
planner once priced out of memory, each through the mechanism by which its software holds less
(tests/plan/test_stack_memory.py prices each one), and the runs a source reports out of memory stay so."""

from __future__ import annotations

import pytest

from plait.measure.validate.runs import SHIPPED_RUNS, predict_row, read_runs

RAN = ("megatron21-t2-zero3-529p6b-640g",      # DeepSpeed's ZeRO-3: submodules under a live cap, gradient buckets
       "mpt-a100-40gb-13b-2k-128g")            # llm-foundry: flash-attn's fused cross entropy


def _rows() -> dict[str, dict]:
    return {row["id"]: row for path in SHIPPED_RUNS for row in read_runs(path)}


@pytest.mark.parametrize("row_id", RAN)
def test_a_layout_its_source_ran_is_predicted_to_fit(row_id):
    result = predict_row(dict(_rows()[row_id]))
    assert result.status == "ok", (row_id, result.status, result.notes)
