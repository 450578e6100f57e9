"""The attention kernel of a searched layout and its price (plait.plan.attention_choice,
plait.plan.kernels): the fastest kernel plait's runtime runs the model with.

* Gemma-2-9B (tests/data/gemma-2-9b/config.json, the Hugging Face config: soft-capped scores,
  4096-token windows on every other layer, a score scale): ``plait plan`` ranks runnable layouts,
  all on ``attn=flex``; ``--fix attn=eager`` narrows the search to the eager kernel.
* A plain causal model keeps ``flash`` (FlexAttention is priced at ``FLEX_SPEED`` of it); a
  windowed model shorter than its sequence takes ``flex`` (SDPA would take the window as a mask).
* The ring's windowed block skip, counted by hand.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from plait.cli import main
from plait.plan.attention_choice import fastest_attention, runtime_attention_kernels
from plait.plan.kernels import FLEX_SPEED, layer_times, ring_keys, ring_window_keys
from plait.plan.params import DEFAULT_PARAMS
from plait.plan.search import SearchConstraints, search
from plait.spec.capabilities import runtime_violations
from plait.spec.hardware import get_cluster
from plait.spec.hf_config import model_from_hf_config
from plait.spec.layout import JobSpec, Layout
from plait.spec.models import get_model

GEMMA = Path(__file__).resolve().parents[1] / "data" / "gemma-2-9b"
ARGS = ["--model", str(GEMMA), "--cluster", "dgx-h100", "--gpus", "64", "--global-batch", "512", "--seq-len", "4096"]
H100 = get_cluster("dgx-h100").gpu


def test_gemma2_9b_plan_ranks_runnable_layouts_on_flex(capsys):
    assert main(["plan", *ARGS, "--top", "3"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("│ ")]
    assert len(rows) == 3 and all("attn=flex" in row for row in rows)
    assert "that plait train runs" in out


def test_fixing_attn_eager_narrows_the_search():
    model = model_from_hf_config(GEMMA)
    cluster = dataclasses.replace(get_cluster("dgx-h100"), n_gpus=64)
    job = JobSpec(global_batch=512, seq_len=4096)
    result = search(model, cluster, job, SearchConstraints(fixed=(("attn", "eager"),)), runnable=True)
    assert result.plans and {plan.layout.attn for plan in result.plans} == {"eager"}
    flex = search(model, cluster, job, runnable=True)
    assert flex.plans[0].step.tokens_per_s_per_gpu > result.plans[0].step.tokens_per_s_per_gpu


def test_runtime_kernels_follow_the_rules():
    gemma = model_from_hf_config(GEMMA)
    job = JobSpec(global_batch=8, seq_len=4096)
    assert runtime_attention_kernels(gemma) == ("flex", "eager")
    for attn in ("flash", "sdpa", "flex", "eager"):
        broken = [v.rule for v in runtime_violations(gemma, Layout(attn=attn), job)]
        assert ("runtime-attn-softcap" in broken) == (attn not in runtime_attention_kernels(gemma))
    for impl, refused in (("ring", False), ("allgather", False), ("ulysses", False), ("torch", True)):
        broken = [v.rule for v in runtime_violations(gemma, Layout(cp=2, cp_impl=impl), job)]
        assert ("runtime-cp-attention-options" in broken) == refused and "runtime-attn-softcap" not in broken


def test_plain_models_keep_flash_and_windowed_ones_take_flex():
    llama = get_model("llama3-8b")
    assert fastest_attention(llama, H100, DEFAULT_PARAMS, 4096) == "flash"
    flash = layer_times(llama, H100, DEFAULT_PARAMS, 4096.0, 4096, 1, 1, False, "flash", "bf16")
    flex = layer_times(llama, H100, DEFAULT_PARAMS, 4096.0, 4096, 1, 1, False, "flex", "bf16")
    assert flex.attn_fwd == pytest.approx(flash.attn_fwd / FLEX_SPEED[0], rel=1e-3)
    windowed = dataclasses.replace(llama, sliding_window=1024, local_layers="all", name="llama-windowed")
    assert fastest_attention(windowed, H100, DEFAULT_PARAMS, 8192) == "flex"


def test_ring_skips_the_blocks_a_window_hides():
    # seq 64 over cp 4: chunks of c = 8; W = 5 keeps the neighbours' blocks ((1-1)·8 + 1 < 5) and skips
    # the rest; the busiest rank (1 or 2) keeps both neighbours: 4c² + 2·2c² elements over 2c queries
    assert ring_window_keys(64, 4, 5) == 4 * 8
    assert ring_window_keys(64, 4, 64) == ring_keys(64, 4)  # a window as long as the sequence skips nothing
