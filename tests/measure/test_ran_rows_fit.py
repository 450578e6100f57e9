"""Layouts that a source ran are predicted to fit (issue 29, item 3): the shipped rows that the
planner once priced out of memory, each through the mechanism by which its software holds less
(tests/plan/test_stack_memory.py prices each one). The runs a source reports out of memory stay so:
tests/measure/test_published_runs.py (torchtitan's 70B at local batch 2) and the 530B ZeRO-3 at 560
GPUs below."""

from __future__ import annotations

from dataclasses import replace

import pytest

from plait.measure.validate.cells import fsdp_on, zero_stage_of
from plait.measure.validate.runs import SHIPPED_RUNS, predict_row, read_runs
from plait.measure.validate.specs import row_specs
from plait.plan.memory import estimate_memory

RAN = ("megatron21-t2-zero3-529p6b-640g",      # DeepSpeed's ZeRO-3: submodules under a live cap, gradient buckets
       "mpt-a100-40gb-13b-2k-128g",            # llm-foundry: flash-attn's fused cross entropy
       "mz-qwen3-235b-h100-ep8-fsdp",          # Megatron-FSDP (FSDP=On): ZeRO-3
       "mbridge-260201-b200-dsv3-256g",        # no recompute stated, vpp open: recompute searched with vpp
       "mbridge-2602-gb200-llama3-70b-fp8",    # TE cross entropy, TE offload's (L - N) kept layers
       "mbridge-260401-gb200-llama3-70b-fp8")


def _rows() -> dict[str, dict]:
    return {row["id"]: row for path in SHIPPED_RUNS for row in read_runs(path)}


@pytest.mark.parametrize("row_id", RAN)
def test_a_layout_its_source_ran_is_predicted_to_fit(row_id):
    result = predict_row(dict(_rows()[row_id]))
    assert result.status == "ok", (row_id, result.status, result.notes)


def test_fsdp_on_in_the_notes_reads_as_zero3_and_only_then():
    assert fsdp_on("Dispatcher DeepEP; EDP=32; GA=4; FSDP=On; recompute column 'full'.")
    assert not fsdp_on("FSDP 0 (26.02.01/26.04 tables) or no FSDP column")
    assert not fsdp_on("FSDP=Off") and not fsdp_on("")
    assert zero_stage_of("fsdp") == (3, False)
    notes = predict_row(dict(_rows()["mz-qwen3-235b-h100-ep8-fsdp"])).notes
    assert any(n.startswith("zero=3: FSDP=On in the notes") for n in notes)


def test_a_stated_zero_stage_wins_over_the_notes():
    row = _rows()["mz-qwen3-235b-h100-ep8-fsdp"]
    assert row_specs(dict(row), []).layout.zero == 3
    stated = dict(row, zero_stage="1 (distributed optimizer)")
    notes: list[str] = []
    assert row_specs(stated, notes).layout.zero == 1
    assert not any(n.startswith("zero=3: FSDP=On") for n in notes)


def test_a_stack_recompute_that_fits_no_completion_is_searched_with_the_open_knobs():
    """The stack's ckpt=none fits no vpp of the B200 DeepSeek-V3 row (26.02.01, VP blank): the recompute
    is searched together with vpp, as it is when every other knob is stated (its 25.11 twin, VP=1)."""
    row = _rows()["mbridge-260201-b200-dsv3-256g"]
    notes: list[str] = []
    specs = row_specs(dict(row), notes)
    assert "the megatron-core stack's ckpt=none does not fit: recompute searched" in notes
    assert specs.layout.ckpt != "none"
    assert not any(n == "completed: ckpt=none (the megatron-core stack's default)" for n in notes)
    twin: list[str] = []
    assert row_specs(dict(_rows()["mbridge-2511-b200-dsv3-256g"]), twin).layout.ckpt != "none"
    assert "the megatron-core stack's ckpt=none does not fit: recompute searched" in twin
    stated = dict(row, recompute="none")  # a stated recompute is the row's: never searched
    said: list[str] = []
    assert row_specs(stated, said).layout.ckpt == "none"
    assert not any("recompute searched" in n for n in said)


def test_narayanans_530b_zero3_does_not_fit_on_560_gpus_as_the_paper_reports():
    """Table 2's 530B ZeRO-3 row ran on 640 GPUs because micro-batch 4 did not fit on 560 (its notes).
    The sharded states grow by 1.9 GB from 640 to 560 GPUs; what puts the peak over 80 GiB is Megatron's
    dropout (the deepspeed stack's [run] dropout): the recomputed layer's attention-dropout mask and
    output (3 bytes per score element) on top of its softmax."""
    row = _rows()["megatron21-t2-zero3-529p6b-640g"]
    ran = predict_row(dict(row))
    smaller = predict_row(dict(row, id="zero3-530b-560g", n_gpus="560", dp="560", gbs="2240"))
    assert ran.status == "ok" and smaller.status == "oom", (ran.status, smaller.status)
    notes: list[str] = []
    specs = row_specs(dict(row), notes)
    assert specs.model.dropout and any(n.startswith("dropout: the deepspeed stack") for n in notes)
    at_560 = row_specs(dict(row, n_gpus="560", dp="560", gbs="2240"), [])
    args = (at_560.cluster, at_560.job, at_560.layout, at_560.params)
    assert not estimate_memory(at_560.model, *args, runtime=at_560.runtime).fits
    assert estimate_memory(replace(at_560.model, dropout=False), *args, runtime=at_560.runtime).fits
