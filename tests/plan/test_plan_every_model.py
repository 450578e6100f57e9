"""Every preset (``plait.spec.models``) and every released config of tests/spec/hf_configs.py plans on
DGX-H100 nodes at 4K and at 128K tokens per sequence, and the top layout is one ``plait train``
runs (it breaks no runtime rule: ``search(..., runnable=True)``, as ``plait plan`` ranks).

The cluster is sized by the model's parameters (``gpus_for``) and the global batch by the GPUs
(``global_batch``). The search is kept small so that the whole sweep takes seconds: ZeRO-3,
micro-batch 1, 1F1B, pp <= 4, and for MoE models ep=8 with etp=1 (the runtime's etp); every
other key (tp, cp and its kernel, pp, dp, HSDP, checkpointing, offload, chunked loss) is searched.

Known exceptions, each checked for the reason it gives (remove an entry when its reason goes):
  * ``LEARNED_POSITIONS``: GPT-architecture presets have one learned position per row of their
    table (2048, or 256 for tiny-gpt), so 4K and 128K are refused by rule ``seq-positions``; they
    plan a runnable top layout at their table's length instead.
  * ``MOE_ISSUE_33``: none left - GPT-OSS's biased, clamped experts and cp > 1 with an MoE or MLA
    model both run now (issue 33 items 2 and 5); the table stays for a model the runtime refuses.
Gemma-2's soft-capped, windowed attention runs on ``attn=flex`` (FlexAttention) and under the ring,
all-gather and Ulysses cp kernels, so it plans a runnable top layout at 4K and 128K like the rest.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hf_configs import CONFIGS

from plait.plan.search import SearchConstraints, search
from plait.spec.capabilities import runtime_violations
from plait.spec.hardware import get_cluster
from plait.spec.hf_config import model_from_hf_dict
from plait.spec.layout import JobSpec
from plait.spec.models import MODELS

MODELS_AND_CONFIGS = {**MODELS, **{name: model_from_hf_dict(config, Path(f"{name}/config.json"))
                                   for name, config in CONFIGS.items()}}
SEQ_LENS = (4096, 131072)
LEARNED_POSITIONS = {name for name, spec in MODELS_AND_CONFIGS.items() if spec.learned_positions}
MOE_ISSUE_33: dict = {}  # (model, seq_len): what the runtime-moe refusal names


def gpus_for(params: int) -> int:
    """DGX-H100 GPUs for a model of ``params`` parameters: 16 bytes of weights, gradients and AdamW
    states per parameter spread over the GPUs (ZeRO-3) stay under about a third of 80 GB, beside
    the activations of 128K tokens; one node for the small models."""
    for limit, gpus in ((15e9, 8), (100e9, 32), (500e9, 128)):
        if params < limit:
            return gpus
    return 256


def global_batch(gpus: int, seq_len: int) -> int:
    """Sequences per step: 4 per GPU at 4K; at 128K (where cp shares a sequence) one per 4 GPUs, at least 8."""
    return 4 * gpus if seq_len <= 4096 else max(8, gpus // 4)


def plan_top(name: str, seq_len: int, runnable: bool = True):
    """(search result, job) of ``name`` at ``seq_len`` on its DGX-H100 cluster."""
    model = MODELS_AND_CONFIGS[name]
    gpus = gpus_for(model.total_params())
    job = JobSpec(global_batch(gpus, seq_len), seq_len)
    fixed = [("zero", 3), ("mbs", 1)]
    if model.moe is not None:
        fixed += [("ep", 8), ("etp", 1)]
    constraints = SearchConstraints(fixed=tuple(fixed), schedules=("1f1b",), max_pp=4)
    return search(model, get_cluster("dgx-h100", gpus), job, constraints, runnable=runnable), job


def assert_runnable_top(name: str, seq_len: int) -> None:
    result, job = plan_top(name, seq_len)
    assert result.plans, f"{name} at {seq_len} tokens: no runnable layout fits"
    top = result.plans[0]
    assert top.memory.fits and runtime_violations(top.model, top.layout, job) == []


def test_the_sweep_covers_every_preset_and_config():
    assert set(MODELS) <= set(MODELS_AND_CONFIGS) and set(CONFIGS) <= set(MODELS_AND_CONFIGS)
    assert {"qwen3-30b-a3b", "olmoe-1b-7b", "Qwen3-4B", "OLMo-2-7B", "Gemma-2-2B"} <= set(MODELS_AND_CONFIGS)
    assert {name for name, _ in MOE_ISSUE_33} <= set(MODELS)


@pytest.mark.parametrize("name", sorted(MODELS_AND_CONFIGS))
def test_plans_a_runnable_top_layout_at_4k_and_128k(name):
    model = MODELS_AND_CONFIGS[name]
    for seq_len in SEQ_LENS:
        if name in LEARNED_POSITIONS:
            result, _ = plan_top(name, seq_len)
            assert not result.plans and "seq-positions" in {v.rule for v in result.rule_errors}
        elif (name, seq_len) in MOE_ISSUE_33:
            result, job = plan_top(name, seq_len, runnable=False)
            assert result.plans, f"{name} at {seq_len} tokens: nothing fits even with --any-runtime"
            message = " ".join(v.message for v in runtime_violations(model, result.plans[0].layout, job))
            assert MOE_ISSUE_33[name, seq_len] in message
        else:
            assert_runnable_top(name, seq_len)
    if name in LEARNED_POSITIONS:  # at the length of its position table instead
        assert_runnable_top(name, model.max_seq_len)
