"""The planner's memoized functions (``plait.plan.memo``) give every layout its own bytes and seconds.

A cached function is keyed by the layout fields it names; a field it reads but does not name would
hand a layout the result of another that agrees on the named fields. Each layout below is priced
warm (after many others filled the caches, in an order that mixes them) and cold (caches emptied
first); the two must agree exactly, since the same arithmetic runs on the same numbers.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from plait.plan import memo
from plait.plan.memory import estimate_memory
from plait.plan.cost import estimate_step
from plait.plan.candidates import candidate_layouts
from plait.spec.hardware import get_cluster
from plait.spec.layout import JobSpec
from plait.spec.models import get_model

CASES = [  # dense, MoE, MLA + MoE, windowed MoE with sinks
    ("llama3-8b", "dgx-h100", 32, JobSpec(64, 8192)),
    ("mixtral-8x7b", "dgx-h100", 64, JobSpec(512, 4096)),
    ("deepseek-v3", "dgx-h100", 256, JobSpec(1024, 4096)),
    ("gpt-oss-120b", "dgx-h100", 64, JobSpec(256, 8192)),
]
VARIANTS = (  # knobs the search's candidates leave at their defaults, set on some layouts
    {}, {"offload": 0.5}, {"offload": 1.0, "opt_offload": True}, {"precision": "fp8"}, {"ckpt_layers": 1},
    {"loss": "fused"}, {"attn": "eager"}, {"norm": "unfused"}, {"sp": False}, {"reshard": False},
    {"moe_overlap": "chunked"}, {"moe_overlap": "shared"}, {"order": "dp-tp-cp-pp"}, {"order": "tp-dp-cp-pp"},
)


def sample_layouts(model, cluster, job, count: int, rng: random.Random):
    layouts = list(candidate_layouts(model, cluster, job))
    picked = rng.sample(layouts, min(count, len(layouts)))
    out = []
    for layout in picked:
        changes = rng.choice(VARIANTS)
        if "offload" in changes and layout.ckpt == "none":
            changes = {}
        try:
            out.append(replace(layout, **changes))
        except Exception:  # a variant this layout's keys refuse: keep the layout as it is
            out.append(layout)
    return out


def price(model, cluster, job, layout, runtime):
    memory = estimate_memory(model, cluster, job, layout, runtime=runtime)
    return memory, estimate_step(model, cluster, job, layout, runtime=runtime)


@pytest.mark.parametrize("name,cluster_name,gpus,job", CASES, ids=[c[0] for c in CASES])
def test_warm_and_cold_caches_price_every_layout_alike(name, cluster_name, gpus, job):
    rng = random.Random(7)
    model, cluster = get_model(name), get_cluster(cluster_name, gpus)
    layouts = sample_layouts(model, cluster, job, 150, rng)
    for runtime in ("torch", "megatron-core"):
        memo.clear_caches()
        warm = [price(model, cluster, job, layout, runtime) for layout in layouts]  # each after the others
        for layout, (memory, step) in zip(layouts, warm):
            memo.clear_caches()
            assert price(model, cluster, job, layout, runtime) == (memory, step), (runtime, str(layout))


def test_a_cached_dict_is_the_callers_to_change():
    from plait.plan.activations import layer_items

    model, layout = get_model("llama3-8b"), next(iter(candidate_layouts(
        get_model("llama3-8b"), get_cluster("dgx-h100", 8), JobSpec(8, 4096))))
    first = layer_items(model, layout, 4096, runtime="torch")
    first.clear()
    assert layer_items(model, layout, 4096, runtime="torch") != {}


def test_models_are_told_apart_by_identity_not_confused():
    # keyed by identity: an equal copy of the model (another object) prices alike, and a model that
    # differs in one field, priced after the first filled the caches, gets its own bytes (its cold ones)
    job, cluster = JobSpec(64, 4096), get_cluster("dgx-h100", 8)
    model = get_model("mixtral-8x7b")
    layout = next(iter(candidate_layouts(model, cluster, job)))
    memo.clear_caches()
    first = estimate_memory(model, cluster, job, layout)
    copy = replace(model)
    assert copy is not model and estimate_memory(copy, cluster, job, layout) == first
    wider = replace(model, vocab=2 * model.vocab)
    warm = estimate_memory(wider, cluster, job, layout)
    memo.clear_caches()
    assert warm == estimate_memory(wider, cluster, job, layout) and warm.total != first.total


@pytest.mark.parametrize("name,cluster_name,gpus,job", CASES[:3], ids=[c[0] for c in CASES[:3]])
def test_each_offload_step_holds_no_more_on_the_gpu(name, cluster_name, gpus, job):
    # plait.plan.search._with_offload tries the last step first and stops when it does not fit
    from plait.plan.search import OFFLOAD_STEPS

    model, cluster = get_model(name), get_cluster(cluster_name, gpus)
    layouts = [lay for lay in sample_layouts(model, cluster, job, 200, random.Random(3)) if lay.ckpt != "none"]
    assert len(layouts) > 50
    for layout in layouts:
        layout = replace(layout, offload=0.0, opt_offload=False)
        totals = [estimate_memory(model, cluster, job, replace(layout, **changes)).total
                  for changes in ({},) + OFFLOAD_STEPS]
        # the same sums in another order: equal up to float64 rounding of a few hundred terms
        slack = 1e-12 * totals[0]
        assert all(after <= before + slack for before, after in zip(totals, totals[1:])), (str(layout), totals)
