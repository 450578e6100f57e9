"""What a published row's recipe ran where its cells are blank, read from the recipe's code: Transformer
Engine's cross entropy for Megatron-Bridge and ModelZoo rows (``plait.measure.validate.loss``), the
GPT-OSS recompute modules of Megatron-Bridge's performance presets (``moe.RECIPE_RECOMPUTE``)."""

from __future__ import annotations

import pytest

from plait.measure.validate.loss import TE_LOSS_BYTES, loss_params
from plait.measure.validate.moe import recipe_recompute
from plait.measure.validate.runs import SHIPPED_RUNS, read_runs
from plait.measure.validate.specs import row_specs
from plait.plan.memory import estimate_memory
from plait.spec.stack import get_stack

ROWS = {row["id"]: row for path in SHIPPED_RUNS for row in read_runs(path)}


@pytest.mark.parametrize("row_id, te_loss", [
    ("mbridge-2602-gb200-llama3-70b-fp8", True),        # Megatron-Bridge performance summary
    ("mbridge-2511-h100-oss-64g", True),                # the same, MoE file
    ("mz-qwen3-235b-h100-ep8-fsdp", True),              # Megatron-MoE-ModelZoo
    ("nemo-longseq-b200-llama3-8b-1024k", False),       # NeMo 25.04's page: no loss kernel named
    ("megatron21-t1-1p7b", False),                      # Megatron-LM 2021
    ("torchtitan-2412-t1-8b-8g-fsdp", False),           # another stack
])
def test_te_cross_entropy_is_a_fact_of_the_sources_whose_recipes_set_it(row_id, te_loss):
    notes: list[str] = []
    specs = row_specs(ROWS[row_id], notes)
    assert (specs.params.loss_peak_bytes == TE_LOSS_BYTES) is te_loss
    assert any(n.startswith("loss: Transformer Engine's cross entropy") for n in notes) is te_loss


def test_the_loss_row_fact_needs_megatron_core():
    row = dict(ROWS["mbridge-2602-gb200-llama3-70b-fp8"])
    assert loss_params(row, get_stack("megatron-core"), []) == {"loss_peak_bytes": TE_LOSS_BYTES}
    assert loss_params(row, get_stack("torchtitan"), []) == {}


def test_te_cross_entropy_frees_the_gb200_recipes_logits():
    """Llama 3 70B, mbs 2 at 8,192 tokens: 2 bytes per logit instead of the generic loss's."""
    notes: list[str] = []
    specs = row_specs(ROWS["mbridge-2602-gb200-llama3-70b-fp8"], notes)
    memory = estimate_memory(specs.model, specs.cluster, specs.job, specs.layout, specs.params, runtime=specs.runtime)
    assert memory.logits == TE_LOSS_BYTES * 2 * 8192 * 128256


@pytest.mark.parametrize("row_id, cell, ckpt", [
    ("mbridge-2511-h100-oss-64g", "selective(layernorm, moe_act)", "balanced"),
    ("mbridge-2602-h100-oss-64g", "selective(layernorm, moe_act)", "balanced"),
    ("mbridge-260401-b200-oss-64g", "selective(layernorm, moe_act)", "balanced"),
    ("mbridge-2511-gb200-oss-64g", "selective(layernorm, moe_act)", "balanced"),
    ("mbridge-2606-gb200-oss-64g", "none", "none"),  # GB200 FP8_MX_V2 from v0.5.0: recompute_modules=[]
])
def test_gpt_oss_rows_recompute_as_their_megatron_bridge_recipe(row_id, cell, ckpt):
    notes: list[str] = []
    assert recipe_recompute(ROWS[row_id], notes) == cell
    assert notes and "recipe" in notes[0]
    layout_notes: list[str] = []
    assert row_specs(ROWS[row_id], layout_notes).layout.ckpt == ckpt
    assert not any("recompute searched" in n for n in layout_notes)  # stated by the recipe, never searched


def test_a_stated_recompute_or_another_source_keeps_its_own():
    row = dict(ROWS["mbridge-2602-h100-oss-64g"], recompute="full")
    assert row_specs(row, []).layout.ckpt == "full"
    assert recipe_recompute(ROWS["mbridge-2509-h100-q30-16g"], []) == ""    # Qwen3: no recipe entry
    assert recipe_recompute(ROWS["mz-qwen3-235b-h100-ep8-fsdp"], []) == ""  # not Megatron-Bridge
