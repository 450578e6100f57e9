"""``plait calibrate fit``'s leave-one-layout-family-out: each family's rows predicted by a fit on the
other families, beside the in-sample error, so over-fitting shows. No torch."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from plait.cli import main
from plait.measure.calibrate.families import layout_family
from plait.measure.calibrate.fit import fit_runs
from plait.measure.sweep.csv_file import SweepRow, SweepWriter
from plait.plan.cost import estimate_step
from plait.plan.params import DEFAULT_PARAMS
from plait.spec.hardware import cluster_for_gpu
from plait.spec.layout import JobSpec, Layout
from plait.spec.models import get_model

RUNS_CSV = Path(__file__).resolve().parents[3] / "shared" / "data" / "published_runs_calibration.csv"


@pytest.mark.parametrize("layout,family", [
    ("dp=8", "dp/zero"), ("dp=8,zero=3", "dp/zero"), ("dp=8,ckpt=full", "ckpt"), ("dp=4,tp=2,ckpt=full", "tp"),
    ("dp=2,cp=2,tp=2", "cp"), ("dp=2,pp=4,schedule=gpipe", "pp gpipe"), ("dp=2,pp=2,tp=2", "pp 1f1b"),
    ("dp=2,pp=4,tp=1,offload=0.5", "offload"), ("dp=8,opt_offload=1", "offload"),
])
def test_layout_family_is_the_dominant_parallelism(layout, family):
    assert layout_family(Layout.parse(layout)) == family


DP = ("dp=8,mbs=1", "dp=8,mbs=2", "dp=8,zero=3,mbs=2")
TP = ("dp=4,tp=2,mbs=4", "dp=2,tp=4,mbs=8", "dp=4,tp=2,mbs=2", "dp=1,tp=8,mbs=8")


def write_sweep(path: Path, layouts, truth) -> Path:
    """A GPU sweep CSV whose measured step times are the model's predictions under ``truth``."""
    writer = SweepWriter(path)
    for layout in layouts:
        step = estimate_step(get_model("llama3.2-1b"), cluster_for_gpu("h100-sxm", 8, 8), JobSpec(64, 2048),
                             Layout.parse(layout), truth)
        writer.write(SweepRow(layout=layout, status="ok", predicted_step_time_s=1.0,
                              measured_step_time_s=step.step_time, model="llama3.2-1b", global_batch=64,
                              seq_len=2048, nproc_per_node=8, gpu="h100-sxm", device="cuda"))
    writer.close()
    return path


def test_a_parameter_only_one_family_exercises_is_overfitted_and_lofo_shows_it(tmp_path):
    """tp_comm_overlap only changes tp layouts: fitted on every row it is exact in-sample; fitted
    without the tp family it stays at its start, so the held-out tp rows are predicted worse."""
    truth = replace(DEFAULT_PARAMS, tp_comm_overlap=0.0)
    path = write_sweep(tmp_path / "sweep.csv", DP + TP, truth)
    result = fit_runs(path, ("tp_comm_overlap",), metric="step_time", objective="mean", rounds=4, points=9, polish=5)
    by_family = {f.family: f for f in result.families}
    assert set(by_family) == {"dp/zero", "tp"} and by_family["tp"].rows == len(TP)
    tp, dp = by_family["tp"], by_family["dp/zero"]
    assert result.params.tp_comm_overlap == pytest.approx(0.0, abs=1e-3)
    assert tp.in_sample < 1e-4 and dp.in_sample < 1e-4 and dp.start < 1e-4  # dp rows never depended on it
    assert tp.held_out_params["tp_comm_overlap"] == DEFAULT_PARAMS.tp_comm_overlap  # nothing to learn it from
    assert tp.held_out == pytest.approx(tp.start) and tp.held_out > 100 * tp.in_sample and tp.held_out > 0.01
    assert dp.held_out < 1e-4  # fitted on tp rows alone, dp rows are still exact


def test_cli_prints_and_writes_the_family_table(tmp_path, capsys):
    truth = replace(DEFAULT_PARAMS, tp_comm_overlap=0.0)
    path = write_sweep(tmp_path / "sweep.csv", DP + TP, truth)
    out = tmp_path / "fit.json"
    code = main(["calibrate", "fit", "--runs", str(path), "--params", "tp_comm_overlap", "--metric", "step_time",
                 "--rounds", "2", "--points", "5", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0 and "Error by layout family" in printed and "dp/zero" in printed
    fit = json.loads(out.read_text())["fit"]
    assert fit["family_holdout"] == "leave-one-family-out"
    families = {f["family"]: f for f in fit["families"]}
    assert set(families) == {"dp/zero", "tp"}
    assert all(math.isfinite(families["tp"][k]) for k in ("start", "in_sample", "held_out"))
    assert families["tp"]["held_out"] > families["tp"]["in_sample"]


def test_one_family_has_nothing_to_hold_out(tmp_path, capsys):
    path = write_sweep(tmp_path / "sweep.csv", DP, DEFAULT_PARAMS)
    assert fit_runs(path, ("step_overhead_s",), rounds=1, points=3, polish=1).families == []
    out = tmp_path / "fit.json"
    assert main(["calibrate", "fit", "--runs", str(path), "--params", "step_overhead_s", "--rounds", "1",
                 "--points", "3", "--out", str(out)]) == 0
    assert "the rows are of one family" in capsys.readouterr().out
    assert json.loads(out.read_text())["fit"]["family_holdout"] == "none"


@pytest.mark.skipif(not RUNS_CSV.is_file(), reason=f"published-runs CSV not found at {RUNS_CSV}")
def test_published_families_are_the_sources(tmp_path):
    result = fit_runs(RUNS_CSV, ("elementwise_passes",), rounds=1, points=3, polish=1)
    assert [f.family for f in result.families] == [s.source for s in result.per_source]
    for family, source in zip(result.families, result.per_source):
        assert family.held_out == source.leave_out and family.in_sample == source.in_sample
