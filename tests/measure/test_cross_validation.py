"""Accuracy measured on what was not fitted (plait validate --cross-validate source), the row readers of the
second calibration batch, and the shipped record that plait plan quotes."""

from __future__ import annotations

import csv
import filecmp
import json
import statistics
from pathlib import Path

import pytest

from plait.cli import main
from plait.measure import validate as validate_package
from plait.measure.calibrate import fit as fit_module
from plait.measure.validate import cross
from plait.measure.validate.cells import not_sharded, offloaded_layers, precision_of, zero_stage_of
from plait.measure.validate.moe import nvlink_domain
from plait.measure.validate.runs import PUBLISHED_DIR, SHIPPED_RUNS, shipped_accuracy
from plait.measure.validate.stacks import stack_of

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"


@pytest.fixture(scope="module")
def shipped():
    """The leave-one-source-out result on the shipped runs (the slow part: one fit per code base)."""
    return cross.cross_validate([str(p) for p in SHIPPED_RUNS])


@pytest.mark.slow
def test_the_record_plait_plan_quotes_is_the_current_models(shipped):
    assert shipped_accuracy() == shipped.record(), (
        "src/plait/data/validation.json is stale: write cross_validate(SHIPPED_RUNS).record() into it")


@pytest.mark.slow
def test_held_out_error_meets_the_bar_per_source_and_overall(shipped):
    record = shipped.record()
    assert record["sources"] >= 7 and record["runs_compared"] >= 150
    assert record["held_out_median_points"] <= 5.0
    for source in shipped.sources:
        assert statistics.median(source.held_out) <= 10.0, source.source


def test_a_held_out_source_is_never_in_its_own_fit(monkeypatch):
    """Every fit sees the other sources' rows and none of the held-out one's."""
    seen = []
    real = fit_module.minimize

    def spy(problem, names, start, **kwargs):
        seen.append({cross.code_base(c.source) for c in problem.cases})
        return real(problem, names, start, rounds=1, points=2, polish=0)

    monkeypatch.setattr(cross, "minimize", spy)
    result = cross.cross_validate([str(SHIPPED_RUNS[0])], rounds=1, points=2, polish=0)
    names = [s.source for s in result.sources]
    assert len(seen) == len(names) >= 4
    for held_out, sources in zip(names, seen):
        assert held_out not in sources and sources == set(names) - {held_out}


def test_code_bases_group_every_table_of_one_software():
    assert cross.code_base("NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md (current page)") == \
        cross.code_base("NVIDIA Megatron-Bridge performance summary") == "Megatron-Bridge (NVIDIA)"
    assert cross.code_base("NVIDIA/NeMo docs/source/performance/performance_long_sequence.md") == "NeMo (NVIDIA)"
    assert cross.code_base("a lab's blog") == "a lab's blog"


def test_the_cli_cross_validates_a_small_file_and_refuses_a_calibration(tmp_path, capsys):
    rows = list(csv.DictReader(SHIPPED_RUNS[0].open(encoding="utf-8")))
    keep = [r for r in rows if "torchtitan" in r["source"]][:4] + [r for r in rows if "mosaicml" in r["source"]][:4]
    path = tmp_path / "two.csv"
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(keep)
    assert main(["validate", "--runs", str(path), "--cross-validate", "source", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["record"]["sources"] == 2 and out["record"]["runs_compared"] == 8
    assert {s["source"] for s in out["sources"]} == {"torchtitan", "llm-foundry (MosaicML)"}
    assert main(["validate", "--cross-validate", "source", "--calibration", "x.json"]) == 2
    assert "drop --calibration" in capsys.readouterr().err
    one = tmp_path / "one.csv"
    with one.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(keep[:4])
    assert main(["validate", "--runs", str(one), "--cross-validate", "source"]) == 2
    assert "at least two sources" in capsys.readouterr().err


@pytest.mark.skipif(not SHARED.is_dir(), reason="shared/data is not beside this clone")
def test_the_shipped_runs_are_shared_datas():
    for path in SHIPPED_RUNS:
        assert filecmp.cmp(path, SHARED / path.name, shallow=False), path.name
    assert (PUBLISHED_DIR / "README.md").is_file() and validate_package.__doc__


@pytest.mark.parametrize("text, expected", [
    ("ddp (FSDP=0)", None), ("fsdp (group size 64)", (3, False)), ("fsdp2 (full shard)", (3, False)),
    ("1 (distributed optimizer)", (1, False)), ("0", (0, False)), ("", None)])
def test_zero_cells(text, expected):
    assert zero_stage_of(text) == expected
    assert not_sharded(text) == ("fsdp=0" in text.lower())


@pytest.mark.parametrize("text, expected", [
    ("fp8", "fp8"), ("fp8 (current scaling, FP8-CS)", "fp8"), ("float8 rowwise (torchao)", "fp8"),
    ("mxfp8 (FP8-MX)", "mxfp8"), ("fp8 block-scaled 32x32 (MXFP8-style; parenthesized value)", "mxfp8"),
    ("nvfp4", "nvfp4"), ("bf16", "bf16"), ("mixed (fp16 per sc21 scripts)", "bf16")])
def test_precision_cells(text, expected):
    assert precision_of(text) == expected


def test_offload_in_the_notes_and_the_nvl72_domain():
    assert offloaded_layers("adds Megatron-FSDP with cpu_offloading_num_layers=40 (activation CPU offload)") == 40
    assert offloaded_layers("TP2, Megatron-FSDP, cpu_offloading_num_layers 95 (activation offload)") == 95
    assert offloaded_layers("no offload here") is None
    notes: list[str] = []
    assert nvlink_domain({"n_gpus": "256", "gpus_per_node": "4"}, "gb200", notes) == 64
    assert "compute tray" in notes[0]
    assert nvlink_domain({"n_gpus": "8"}, "gb200", []) == 8
    gb300: list[str] = []
    assert nvlink_domain({"n_gpus": "256", "gpus_per_node": "4"}, "gb300", gb300) == 64
    assert gb300[0].startswith("GB300 NVL72: 64 GPUs per NVLink domain")
    assert nvlink_domain({"n_gpus": "64"}, "h100-sxm", []) is None


def test_each_row_gets_its_sources_stack_and_a_stack_column_overrides_it():
    by_source = {}
    for path in SHIPPED_RUNS:
        for row in csv.DictReader(path.open(encoding="utf-8")):
            by_source.setdefault(cross.code_base(row["source"]), set()).add(stack_of(row)[0].name)
    assert by_source["Megatron-Bridge (NVIDIA)"] == {"megatron-core"} == by_source["NeMo (NVIDIA)"]
    assert by_source["torchtitan"] == {"torchtitan"} and by_source["llm-foundry (MosaicML)"] == {"llm-foundry"}
    assert by_source["Megatron-LM, Narayanan et al. 2021"] == {"megatron-lm", "deepspeed"}
    assert stack_of({"source": "Smith et al. 2022, Megatron-DeepSpeed MT-NLG 530B"})[0].name == "megatron-lm"
    assert stack_of({"source": "a lab's blog"}) == (stack_of({"source": ""})[0], "source not known to run another stack")
    row = {"source": "pytorch/torchtitan", "stack": "megatron-core"}
    assert stack_of(row) == (stack_of({"source": "NVIDIA Megatron-Bridge"})[0], "the row's stack column")
