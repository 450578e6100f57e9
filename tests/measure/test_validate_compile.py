"""Published rows that ran torch.compile (a row fact from the notes) are priced compiled, their eager
twins eager; stacks that never compile ignore the words."""

from __future__ import annotations

import pytest

from plait.measure.validate.compiled import row_compiles
from plait.measure.validate.runs import PUBLISHED_DIR, predict_row, read_runs
from plait.measure.validate.specs import row_specs

ROWS = {row["id"]: row for row in read_runs(PUBLISHED_DIR / "published_runs_calibration.csv")}


@pytest.mark.parametrize("table", ["t1-8b-8g", "t3-8b-128g"])
def test_the_torchtitan_compile_row_is_priced_compiled_and_its_eager_twin_eager(table):
    eager_row, compiled_row = ROWS[f"torchtitan-2412-{table}-fsdp"], ROWS[f"torchtitan-2412-{table}-fsdp-compile"]
    eager_notes, compiled_notes = [], []
    eager, compiled = row_specs(eager_row, eager_notes), row_specs(compiled_row, compiled_notes)
    assert (eager.params.compiled_blocks, compiled.params.compiled_blocks) == (0.0, 1.0)
    assert eager.layout == compiled.layout  # the same layout: only the compile setting differs
    assert any("torch.compile (notes)" in n for n in compiled_notes)
    assert not any("torch.compile (notes)" in n for n in eager_notes)
    predicted = [predict_row(row) for row in (eager_row, compiled_row)]
    assert predicted[1].predicted_step_time_s < predicted[0].predicted_step_time_s


@pytest.mark.parametrize("notes,compiles", [
    ("FSDP + torch.compile. local batch size 2", True),
    ("Vanilla TP column; torch.compile on. pytorch/torchtitan", True),
    ("--training.local_batch_size=2, --training.compile, --model.converters=float8", True),
    ("FSDP 8, CP 1, compile, Float8. local batch size 1", True),
    ("runs reach '33% to 39% MFU (with or without torch.compile, respectively)'", False),
    ("FSDP only. local batch size 2 per data-parallel rank.", False),
])
def test_which_notes_say_the_run_compiled(notes, compiles):
    assert row_compiles(notes) is compiles


def test_the_2408_rows_and_other_stacks_stay_eager():
    for row_id in ("torchtitan-2408-llama3-8b-a100-sel-op", "torchtitan-2408-llama31-405b-h100-2d"):
        assert row_specs(ROWS[row_id], []).params.compiled_blocks == 0.0
    megatron = next(row for row in ROWS.values() if row["id"].startswith("megatron21-"))
    assert row_specs(dict(megatron, notes="compile, Float8."), []).params.compiled_blocks == 0.0
