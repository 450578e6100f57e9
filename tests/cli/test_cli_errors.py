"""The command line: bad input ends with one clear line on stderr and exit status 2, never a traceback;
good input prints what it promises (tables, JSON, a saved plan, a predictions CSV).

Most cases call ``plait.cli.main`` in-process with ``capsys``; one runs ``python -m plait.cli`` in a
subprocess to show that nothing but the one line reaches a terminal.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from plait.cli import main
from plait.spec.hardware import CLUSTERS
from plait.spec.layout import Layout
from plait.spec.models import MODELS

RUNS_CSV = Path(__file__).resolve().parents[3] / "shared" / "data" / "published_runs_calibration.csv"
needs_runs = pytest.mark.skipif(not RUNS_CSV.is_file(), reason=f"published-runs CSV not found at {RUNS_CSV} "
                                "(CI clones the repository with shared/ beside it)")

PLAN = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--global-batch", "64", "--seq-len", "2048"]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def error_line(capsys, *argv: str) -> str:
    """Run plait expecting a user error: exit 2, nothing on stdout, exactly one line on stderr."""
    code, out, err = run(capsys, *argv)
    assert code == 2, (code, out, err)
    assert "Traceback" not in err and "Traceback" not in out
    assert out == "", out
    lines = err.strip("\n").split("\n")
    assert len(lines) == 1, err
    assert lines[0].startswith("plait: error: "), err
    return lines[0]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# ------------------------------------------------------------------------------- unknown names
def test_unknown_model_lists_the_known_models(capsys):
    line = error_line(capsys, "plan", "--model", "llama9-1t", "--global-batch", "8", "--seq-len", "2048")
    assert "unknown model 'llama9-1t'" in line
    assert "known models:" in line
    assert all(name in line for name in MODELS)


def test_unknown_cluster_lists_the_known_clusters(capsys):
    line = error_line(capsys, *PLAN, "--cluster", "dgx-z900")
    assert "unknown cluster 'dgx-z900'" in line
    assert "known clusters:" in line
    assert all(name in line for name in CLUSTERS)


def test_unknown_layout_key(capsys):
    line = error_line(capsys, *PLAN, "--layout", "dp=8,warp=2")
    assert "unknown layout key 'warp'" in line
    assert "known keys:" in line and "ckpt" in line


def test_unknown_fixed_key(capsys):
    line = error_line(capsys, *PLAN, "--fix", "warp=2")
    assert "unknown layout key 'warp'" in line


def test_bad_layout_value(capsys):
    line = error_line(capsys, *PLAN, "--layout", "dp=8,tp=two")
    assert "tp='two' must be an integer" in line


# ------------------------------------------------------------------------------- broken rules
def test_layout_breaking_rules_names_each_rule(capsys):
    line = error_line(capsys, "plan", "--model", "llama3-8b", "--gpus", "64", "--global-batch", "1024",
                      "--seq-len", "2048", "--layout", "dp=8,tp=3,pp=4")
    assert "is impossible" in line
    assert "tp=3 does not divide n_kv_heads=8" in line
    assert "tp that would: 1, 2, 4, 8" in line
    assert "dp·tp·pp·cp = 8·3·4·1 = 96 but the cluster has 64 GPUs" in line


def test_world_size_mismatch(capsys):
    line = error_line(capsys, *PLAN, "--layout", "dp=4,tp=4")
    assert "= 16 but the cluster has 8 GPUs" in line


def test_global_batch_not_a_multiple_of_dp_times_mbs(capsys):
    line = error_line(capsys, "plan", "--model", "llama3-8b", "--global-batch", "60", "--seq-len", "2048",
                      "--layout", "dp=8,mbs=1")
    assert "global batch 60 is not a multiple of dp·mbs = 8·1 = 8" in line


def test_global_batch_suggests_micro_batch_sizes(capsys):
    line = error_line(capsys, *PLAN, "--layout", "dp=4,tp=2,mbs=3")
    assert "not a multiple of dp·mbs = 4·3 = 12" in line
    assert "mbs that would: 1, 2, 4, 8, 16" in line


@pytest.mark.parametrize("gpus", ["0", "-4"])
def test_no_gpus(capsys, gpus):
    line = error_line(capsys, *PLAN, "--gpus", gpus)
    assert f"--gpus {gpus}: need at least one GPU" in line


@pytest.mark.parametrize("flag,value,fragment", [
    ("--global-batch", "0", "global_batch=0 must be a positive integer"),
    ("--seq-len", "0", "seq_len=0 must be a positive integer"),
])
def test_non_positive_job(capsys, flag, value, fragment):
    argv = list(PLAN)
    argv[argv.index(flag) + 1] = value
    assert fragment in error_line(capsys, *argv)


def test_top_must_be_positive(capsys):
    assert "--top must be at least 1" in error_line(capsys, *PLAN, "--top", "0")


def test_unknown_schedule(capsys):
    line = error_line(capsys, *PLAN, "--schedule", "round-robin")
    assert "schedule='round-robin' must be one of" in line


def test_fp8_layout_on_a100(capsys):
    line = error_line(capsys, *PLAN, "--cluster", "dgx-a100", "--layout", "dp=8,precision=fp8")
    assert "precision=fp8 but a100-80g has no fp8 tensor cores" in line


def test_nothing_fits_says_so_and_what_would(capsys):
    line = error_line(capsys, "plan", "--model", "llama3-405b", "--gpus", "8", "--global-batch", "64",
                      "--seq-len", "2048")
    assert "no layout of llama3-405b fits on 8 x h100-sxm" in line
    assert "GiB over" in line
    assert "use at least ~" in line and "GPUs" in line
    suggested = int(line.split("use at least ~")[1].split(" GPUs")[0])
    assert suggested > 8 and suggested % 8 == 0  # whole nodes, more than we have
    assert "offload" in line


# ------------------------------------------------------------------------------- model files
def test_model_directory_without_config(capsys, tmp_path):
    line = error_line(capsys, *PLAN, "--model", str(tmp_path))
    assert str(tmp_path / "config.json") in line
    assert "does not exist" in line or "no Hugging Face config" in line


def test_model_config_that_is_not_json(capsys, tmp_path):
    config = write(tmp_path / "broken" / "config.json", '{"model_type": "llama", "hidden_size": ')
    line = error_line(capsys, *PLAN, "--model", str(config))
    assert str(config) in line and "line 1 column 40" in line  # names the file and where the JSON breaks


def test_model_config_that_is_not_an_object(capsys, tmp_path):
    config = write(tmp_path / "list" / "config.json", "[1, 2, 3]")
    assert "must hold a JSON object" in error_line(capsys, *PLAN, "--model", str(config.parent))


def test_model_config_of_unsupported_type(capsys, tmp_path):
    config = write(tmp_path / "t5" / "config.json", json.dumps({"model_type": "t5", "d_model": 512}))
    line = error_line(capsys, *PLAN, "--model", str(config.parent))
    assert "model_type='t5' is not supported" in line
    assert "llama" in line and "gpt2" in line


def test_model_config_missing_a_key(capsys, tmp_path):
    config = write(tmp_path / "partial" / "config.json", json.dumps({"model_type": "llama", "hidden_size": 64}))
    line = error_line(capsys, *PLAN, "--model", str(config))
    assert "has none of the keys num_attention_heads" in line


def test_model_config_with_impossible_shapes(capsys, tmp_path):
    config = write(tmp_path / "odd" / "config.json", json.dumps({
        "model_type": "llama", "hidden_size": 100, "num_attention_heads": 3, "num_hidden_layers": 2,
        "intermediate_size": 256, "vocab_size": 1000}))
    assert "n_heads=3 does not divide hidden=100" in error_line(capsys, *PLAN, "--model", str(config))


def test_plait_model_json_with_unknown_field(capsys, tmp_path):
    spec = {**MODELS["tiny"].to_dict(), "n_experts": 8}
    path = write(tmp_path / "model.json", json.dumps(spec))
    assert "unknown model fields ['n_experts']" in error_line(capsys, *PLAN, "--model", str(path))


def test_plait_model_json_that_is_not_json(capsys, tmp_path):
    path = write(tmp_path / "model.json", "name: tiny")
    line = error_line(capsys, *PLAN, "--model", str(path))
    assert str(path) in line and "JSON" in line


def test_missing_cluster_file(capsys, tmp_path):
    line = error_line(capsys, *PLAN, "--cluster", str(tmp_path / "mine.json"))
    assert "cluster file" in line and "does not exist" in line


def test_cluster_file_without_gpu(capsys, tmp_path):
    path = write(tmp_path / "mine.json", json.dumps({"name": "mine", "gpus_per_node": 8}))
    assert "cluster spec needs a 'gpu'" in error_line(capsys, *PLAN, "--cluster", str(path))


# ------------------------------------------------------------------------------- calibration files
def test_missing_calibration_file(capsys, tmp_path):
    line = error_line(capsys, *PLAN, "--calibration", str(tmp_path / "cal.json"))
    assert "calibration" in line and str(tmp_path / "cal.json") in line and "does not exist" in line


def test_calibration_file_that_is_not_json(capsys, tmp_path):
    path = write(tmp_path / "cal.json", "{params: 1")
    line = error_line(capsys, *PLAN, "--calibration", str(path))
    assert str(path) in line and "not a valid calibration" in line


def test_calibration_file_that_is_not_an_object(capsys, tmp_path):
    path = write(tmp_path / "cal.json", "[0.5]")
    line = error_line(capsys, *PLAN, "--calibration", str(path))
    assert str(path) in line and "a calibration file holds a JSON object" in line


def test_calibration_with_unknown_parameter(capsys, tmp_path):
    path = write(tmp_path / "cal.json", json.dumps({"params": {"warp_factor": 9}}))
    line = error_line(capsys, *PLAN, "--calibration", str(path))
    assert "unknown cost parameter" in line and "['warp_factor']" in line and "gemm_half_flops" in line


def test_calibration_with_unknown_gpu_field(capsys, tmp_path):
    path = write(tmp_path / "cal.json", json.dumps({"gpu_overrides": {"warp_factor": 9}}))
    assert "bad gpu_overrides" in error_line(capsys, *PLAN, "--calibration", str(path))


def test_validate_with_malformed_calibration(capsys, tmp_path):
    path = write(tmp_path / "cal.json", "not json at all")
    line = error_line(capsys, "validate", "--runs", str(tmp_path / "runs.csv"), "--calibration", str(path))
    assert str(path) in line and "not a valid calibration" in line


# ------------------------------------------------------------------------------- runs CSV
def test_missing_runs_csv(capsys, tmp_path):
    line = error_line(capsys, "validate", "--runs", str(tmp_path / "runs.csv"))
    assert "runs file" in line and "does not exist" in line


def test_runs_csv_with_missing_columns(capsys, tmp_path):
    path = write(tmp_path / "runs.csv", "id,source,arch\nx,somebody,gpt\n")
    line = error_line(capsys, "validate", "--runs", str(path))
    assert "missing columns n_layers, hidden" in line
    assert "recompute" in line


def test_runs_csv_without_rows(capsys, tmp_path):
    header = ("id,source,arch,n_layers,hidden,ffn_hidden,n_heads,n_kv_heads,vocab,seq_len,gpu_type,n_gpus,"
              "tp,pp,dp,mbs,gbs,zero_stage,recompute\n")
    path = write(tmp_path / "runs.csv", header)
    assert "no rows" in error_line(capsys, "validate", "--runs", str(path))


def test_validate_out_to_a_missing_directory(capsys, tmp_path):
    if not RUNS_CSV.is_file():
        pytest.skip(f"published-runs CSV not found at {RUNS_CSV}")
    line = error_line(capsys, "validate", "--runs", str(RUNS_CSV), "--out", str(tmp_path / "no" / "such" / "x.csv"))
    assert "cannot write" in line


# ------------------------------------------------------------------------------- argparse
def test_argparse_errors_exit_2_without_traceback(capsys):
    with pytest.raises(SystemExit) as info:
        main(["plan", "--model", "llama3-8b", "--global-batch", "eight", "--seq-len", "2048"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "invalid int value: 'eight'" in err


# ------------------------------------------------------------------------------- subprocess
def test_no_traceback_reaches_the_terminal():
    proc = subprocess.run(
        [sys.executable, "-m", "plait.cli", "plan", "--model", "llama3-8b", "--gpus", "64", "--global-batch",
         "1024", "--seq-len", "2048", "--layout", "dp=8,tp=3,pp=4"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2, proc
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip("\n").split("\n")
    assert len(lines) == 1 and lines[0].startswith("plait: error: layout dp=8,tp=3,pp=4"), proc.stderr
    assert "tp=3 does not divide n_kv_heads=8" in lines[0]


# ------------------------------------------------------------------------------- good input
def test_plan_with_layout_prints_json(capsys):
    code, out, err = run(capsys, *PLAN, "--layout", "dp=2,tp=4,mbs=1,ckpt=selective", "--json")
    assert code == 0 and err == ""
    data = json.loads(out)
    assert isinstance(data, list) and len(data) == 1
    plan = data[0]
    assert {"layout", "prediction"} <= set(plan)
    assert Layout.from_dict(plan["layout"]) == Layout.parse("dp=2,tp=4,mbs=1,ckpt=selective")
    prediction = plan["prediction"]
    assert prediction["fits"] is True
    assert prediction["step_time_s"] > 0 and 0 < prediction["mfu"] < 1
    assert prediction["memory_bytes"] <= prediction["memory_capacity_bytes"]


def test_search_prints_json_fastest_first(capsys):
    code, out, _ = run(capsys, *PLAN, "--top", "3", "--max-pp", "4", "--max-mbs", "2", "--json")
    assert code == 0
    data = json.loads(out)
    assert 1 <= len(data) <= 3
    rates = [p["prediction"]["tokens_per_s_per_gpu"] for p in data]
    assert rates == sorted(rates, reverse=True)
    assert all(p["prediction"]["fits"] for p in data)


def test_plan_save_writes_a_plan_file(capsys, tmp_path):
    target = tmp_path / "best.plan.json"
    layout_text = "dp=2,tp=2,pp=2,mbs=2,zero=1,ckpt=full:4,schedule=zero-bubble"
    code, out, err = run(capsys, *PLAN, "--layout", layout_text, "--save", str(target))
    assert code == 0 and err == ""
    assert f"saved the plan to {target}" in out
    saved = json.loads(target.read_text())
    assert saved["format"] == "plait-plan/1"
    layout = Layout.parse(saved["layout_string"])
    assert layout == Layout.parse(layout_text) == Layout.from_dict(saved["layout"])
    assert saved["model"]["name"] == "llama3-8b" and saved["job"] == {"global_batch": 64, "seq_len": 2048}
    assert saved["cluster"]["n_gpus"] == 8


def test_search_save_writes_the_best_plan(capsys, tmp_path):
    target = tmp_path / "best.plan.json"
    code, out, _ = run(capsys, *PLAN, "--max-pp", "4", "--max-mbs", "2", "--save", str(target), "--json")
    assert code == 0
    best = json.loads(out)[0]
    saved = json.loads(target.read_text())
    assert saved["format"] == "plait-plan/1"
    assert Layout.parse(saved["layout_string"]) == Layout.from_dict(best["layout"])


def test_plan_table_and_explain(capsys):
    code, out, err = run(capsys, *PLAN, "--layout", "dp=8,zero=3,ckpt=full")
    assert code == 0 and err == ""
    assert "dp=8,tp=1,pp=1,cp=1,mbs=1,zero=3,ckpt=full" in out
    assert "Memory per GPU" in out and "Step time" in out


def test_plan_that_does_not_fit_exits_1(capsys):
    code, out, err = run(capsys, "plan", "--model", "llama3-70b", "--global-batch", "8", "--seq-len", "4096",
                         "--layout", "dp=8")
    assert code == 1 and "Traceback" not in err
    assert "does not fit" in out and "(OOM)" in out


def test_models_lists_presets(capsys):
    code, out, err = run(capsys, "models")
    assert code == 0 and err == ""
    assert "llama3-405b" in out and "gpt3-175b" in out and "tiny" in out


def test_clusters_lists_presets(capsys):
    code, out, err = run(capsys, "clusters")
    assert code == 0 and err == ""
    assert "dgx-h100" in out and "frontier" in out and "h100-sxm" in out


@needs_runs
def test_validate_writes_predictions_csv(capsys, tmp_path):
    target = tmp_path / "predictions.csv"
    code, out, err = run(capsys, "validate", "--runs", str(RUNS_CSV), "--out", str(target))
    assert code == 0 and err == ""
    with target.open(newline="") as handle:
        reader = csv.DictReader(handle)
        rows = list(reader)
        columns = reader.fieldnames
    assert {"id", "status", "predicted_step_time_s", "predicted_mfu", "predicted_mem_gb", "notes"} <= set(columns)
    assert columns[:5] == ["id", "status", "predicted_step_time_s", "predicted_mfu", "predicted_mem_gb"]
    assert len(rows) == 73
    with RUNS_CSV.open(newline="") as handle:
        assert [r["id"] for r in rows] == [r["id"] for r in csv.DictReader(handle)]
    ok = [r for r in rows if r["status"] == "ok"]
    assert ok, "no run was predicted"
    for r in ok:
        assert float(r["predicted_step_time_s"]) > 0
        assert 0 < float(r["predicted_mfu"]) < 1
        assert float(r["predicted_mem_gb"]) > 0
    assert f"wrote 73 rows to {target}" in out


@needs_runs
def test_validate_json_summary(capsys):
    code, out, err = run(capsys, "validate", "--runs", str(RUNS_CSV), "--json")
    assert code == 0 and err == ""
    assert isinstance(json.loads(out), dict)


@pytest.mark.parametrize("calibration,fragment", [
    ({"params": {"gemm_half_flops": "fast"}}, "must be numbers"),
    ({"params": ["gemm_half_flops"]}, "JSON object"),
    ({"gpu_overrides": [1, 2]}, "gpu_overrides must be an object"),
])
def test_calibration_with_bad_values(capsys, tmp_path, calibration, fragment):
    path = write(tmp_path / "cal.json", json.dumps(calibration))
    assert fragment in error_line(capsys, *PLAN, "--layout", "dp=8", "--calibration", str(path))


@pytest.mark.parametrize("flag", ["--model", "--cluster"])
def test_spec_json_that_is_not_an_object(capsys, tmp_path, flag):
    path = write(tmp_path / "spec.json", "[1, 2]")
    assert "JSON object" in error_line(capsys, *PLAN, flag, str(path))


def test_gpu_count_that_is_not_whole_nodes(capsys):
    line = error_line(capsys, *PLAN, "--gpus", "12")
    assert "12 GPUs is not a whole number of 8-GPU nodes" in line
    assert "GiB over" not in line


def test_fixed_key_that_allows_no_layout(capsys):
    line = error_line(capsys, *PLAN, "--fix", "dp=3")
    assert "no valid layout" in line and "dp=3" in line
    assert "GiB over" not in line


# ------------------------------------------------------------------------ regression cases
# Inputs that once escaped main() as tracebacks or blamed the wrong cause.


def test_calibration_gpu_override_that_is_not_a_number(capsys, tmp_path):
    path = write(tmp_path / "cal.json", json.dumps({"gpu_overrides": {"gemm_efficiency": "high"}}))
    line = error_line(capsys, *PLAN, "--layout", "dp=8", "--calibration", str(path))
    assert "gemm_efficiency" in line


def test_hf_config_with_non_numeric_size(capsys, tmp_path):
    config = write(tmp_path / "m" / "config.json", json.dumps({
        "model_type": "llama", "hidden_size": "big", "num_attention_heads": 8, "num_hidden_layers": 2,
        "intermediate_size": 256, "vocab_size": 1000}))
    assert "hidden_size" in error_line(capsys, *PLAN, "--model", str(config))


def test_save_to_a_missing_directory(capsys, tmp_path):
    line = error_line(capsys, *PLAN, "--layout", "dp=8", "--save", str(tmp_path / "no" / "such" / "p.json"))
    assert str(tmp_path / "no" / "such" / "p.json") in line


def test_fixed_fp8_on_a100(capsys):
    line = error_line(capsys, *PLAN, "--cluster", "dgx-a100", "--fix", "precision=fp8")
    assert "fp8" in line


def test_no_valid_layout_is_not_reported_as_out_of_memory(capsys):
    line = error_line(capsys, "plan", "--model", "gpt-125m", "--global-batch", "8", "--seq-len", "4096")
    assert "GiB over" not in line
    assert "2048" in line


@needs_runs
def test_runs_csv_with_an_overflowing_number(capsys, tmp_path):
    lines = RUNS_CSV.read_text().splitlines()
    header = lines[0].split(",")
    row = next(csv.reader([lines[1]]))
    row[header.index("n_layers")] = "1e400"
    path = tmp_path / "runs.csv"
    with path.open("w", newline="") as handle:
        csv.writer(handle).writerows([header, row])
    code, out, err = run(capsys, "validate", "--runs", str(path), "--json")
    assert code in (0, 2) and "Traceback" not in err
