"""``plait validate`` on the published MoE runs (shared/data/published_moe_runs.csv)."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from plait.measure.validate.moe import megatron_flops_per_token, moe_given, moe_graph_params
from plait.measure.validate.runs import error_summary, predict_runs, read_runs
from plait.spec.models import MODELS

RUNS = Path(__file__).resolve().parents[3] / "shared" / "data" / "published_moe_runs.csv"
needs_runs = pytest.mark.skipif(not RUNS.exists(), reason="shared/data is not beside this clone")


@pytest.fixture(scope="module")
def results():
    return predict_runs(RUNS)


@needs_runs
def test_median_mfu_error_bar(results):
    summary = error_summary(results)
    assert summary["complete"] == 31 and summary["coverage"] == 1.0
    assert summary["overall"]["median_abs_error"] <= 5.0


@needs_runs
def test_errors_are_not_all_one_sign(results):
    signs = [r.mfu_error_points > 0 for r in results if r.mfu_error_points is not None]
    assert 0.25 < sum(signs) / len(signs) < 0.75


@needs_runs
def test_what_is_not_modelled_is_unsupported_with_the_reason(results):
    by_id = {r.id: r for r in results}
    assert "qwen3-next" in by_id["mz-qwen3next-80b-h100-128g"].status
    # 96 stages on 94 layers: Megatron counts the embedding and the loss as pipeline layers (split=ends)
    pp32 = by_id["mz-qwen3-235b-h100-ep8-pp32-a2a"]
    assert pp32.status == "ok" and "split=ends" in next(n for n in pp32.notes if n.startswith("layout "))


@needs_runs
def test_rows_take_the_preset_ep_and_precision(results):
    by_id = {r.id: r for r in results}
    notes = by_id["mbridge-2511-b200-dsv3-256g"].notes
    assert "model: preset deepseek-v3 (same dimensions; head_dim, norms, MLA and windows from it)" in notes
    layout = next(n for n in notes if n.startswith("layout "))
    assert "ep=8" in layout and "precision=mxfp8" in layout
    gb200 = by_id["mbridge-2511-gb200-q235-256g"].notes
    assert any(n.startswith("GB200 NVL72: 64 GPUs per NVLink domain") for n in gb200)


@needs_runs
def test_megatron_counter_matches_the_rows_that_report_both():
    """Rows with TFLOP/s and a step time give Megatron's FLOPs per token; the formula agrees within
    the rounding of the TFLOP/s (3 significant digits) plus 0.5%."""
    for row in read_runs(RUNS):
        if row["id"].startswith("mz-qwen3-235b-h100-ep32") and row["reported_iter_time_s"]:
            tokens = float(row["gbs"]) * 4096 / 256 / float(row["reported_iter_time_s"])
            measured = float(row["reported_tflops_per_gpu"]) * 1e12 / tokens
            assert megatron_flops_per_token(MODELS["qwen3-235b-a22b"], 4096) == pytest.approx(measured, rel=0.01)


def test_plait_and_megatron_flops_agree_within_two_percent_except_windows():
    for name in ("mixtral-8x7b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3"):
        ratio = MODELS[name].model_flops_per_token(4096) / megatron_flops_per_token(MODELS[name], 4096)
        assert 1.0 <= ratio < 1.02  # plait adds the router GEMM
    oss = MODELS["gpt-oss-120b"]  # plait counts the 128-token windows of half of the layers
    assert statistics.fmean([oss.model_flops_per_token(4096) / megatron_flops_per_token(oss, 4096)]) < 0.96


@pytest.mark.parametrize("text,policy", [("selective(norm, act)", "balanced"), ("selective(layernorm, moe)", "mlp"),
                                         ("selective(core_attn, mlp)", "mlp"), ("full", None)])
def test_megatron_recompute_modules(text, policy):
    notes: list[str] = []
    given = moe_given({"recompute": text, "notes": ""}, notes)
    assert given.get("ckpt") == policy and len(notes) == (policy is not None)


def test_the_layernorm_module_difference_is_in_the_notes():
    """Megatron's layernorm module recomputes the attention norm's output, which plait's mlp keeps:
    2 bytes per element of the (s/cp)·b·h/tp shard, said in MiB."""
    notes: list[str] = []
    row = {"recompute": "selective(layernorm, moe)", "notes": "", "seq_len": "16384", "cp": "1", "mbs": "",
           "hidden": "4096", "tp": "4"}
    moe_given(row, notes)
    assert f"({2 * 16384 * 4096 // 4 // 2**20} MiB per layer" in notes[0]


def _row(section: str, model: str, source: str = "NVIDIA Megatron-Bridge performance summary") -> dict:
    return {"source": source, "table_or_section": section, "model_name": model}


@pytest.mark.parametrize("section, model, gpu, precision, expected", [
    ("26.06 NeMo Container, Pre-Training Performance", "Qwen3-235B-A22B", "gb200", "mxfp8", {"moe_layer_graphed": 1.0}),
    ("26.02.01 NeMo Container, Pre-Training", "DeepSeek-V3 671B", "gb200", "mxfp8", {"moe_router_graphed": 1.0}),
    ("25.11 NeMo Container, DGX-GB200", "GPT-OSS 120B", "gb200", "bf16", {}),
    ("26.02.01 NeMo Container", "Qwen3-30B-A3B", "b200", "mxfp8", {"moe_router_graphed": 1.0}),
    ("25.11 NeMo Container, DGX-B200", "Qwen3-30B-A3B", "b200", "mxfp8", {"moe_router_graphed": 1.0}),
    ("25.11 NeMo Container, DGX-B200", "Qwen3-235B-A22B", "b200", "mxfp8", {}),
    ("25.09 NeMo Container, DGX-GB200", "Qwen3-235B-A22B", "gb200", "bf16", {}),
    ("26.04.01 NeMo Container, DGX-H100", "Qwen3-30B-A3B", "h100-sxm", "fp8", {}),
    ("26.06 NeMo Container, DGX-GB300", "DeepSeek-V3", "gb300", "mxfp8", {"moe_layer_graphed": 1.0}),
    ("26.04.01 NeMo Container, DGX-GB300", "DeepSeek-V3", "gb300", "mxfp8", {}),
])
def test_the_recipe_graphs_of_megatron_bridge_rows(section, model, gpu, precision, expected):
    notes: list[str] = []
    assert moe_graph_params(_row(section, model), gpu, precision, notes) == expected
    assert len(notes) == (1 if expected else 0)


def test_modelzoo_rows_take_the_graphs_their_command_names_and_other_sources_run_eager():
    row = _row("26.06 NeMo Container", "Qwen3-235B-A22B", source="Megatron-MoE-ModelZoo")
    assert moe_graph_params({**row, "notes": "Intra-node EP"}, "gb200", "mxfp8", []) == {}
    assert moe_graph_params({**row, "notes": "Cross-node EP strategy."}, "h100-sxm", "bf16", []) == {
        "moe_router_graphed": 1.0}
    assert moe_graph_params(_row("26.06 NeMo Container", "Qwen3-235B-A22B", source="torchtitan"), "gb200",
                            "mxfp8", []) == {}
