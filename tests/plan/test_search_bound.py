"""The search's shortcut for ``keep`` (``plait plan --top``): the step-time lower bound it skips layouts
by never exceeds a layout's predicted step time, the memory shortcut (ckpt=full with every saving does
not fit, so no policy of that sharding does) never drops a fitting layout, and the plans shown are the
exhaustive search's, runnable or not, for several dense and MoE searches."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from plait.errors import PlaitError
from plait.plan.cost import step_lower_bounds
from plait.plan.memory import estimate_memory
from plait.plan.search import (SearchConstraints, candidate_groups, least_memory_variant, search)
from plait.spec.hardware import get_cluster
from plait.spec.layout import RUNTIME_CP_IMPLS, JobSpec
from plait.spec.models import get_model
from plait.spec.validate import errors_of, ulysses_splits_heads, validate

GEMMA = Path(__file__).parents[1] / "data" / "gemma-2-9b" / "config.json"
# (model, cluster, GPUs, global batch, seq_len, pinned keys, largest mbs): each exhaustive search ~1 s
CASES = {
    "llama2-13b": ("llama2-13b", "dgx-a100", 32, 256, 4096, (), 16),
    "llama3-8b-32k": ("llama3-8b", "dgx-h100", 16, 64, 32768, (), 16),
    "llama3-8b-ring-selective": ("llama3-8b", "dgx-h100", 16, 64, 32768, (("cp_impl", "ring"), ("ckpt", "selective")), 16),
    "mixtral": ("mixtral-8x7b", "dgx-h100", 16, 64, 4096, (), 2),
    "olmoe": ("olmoe-1b-7b", "dgx-h100", 8, 64, 4096, (), 4),
    "deepseek-v3": ("deepseek-v3", "dgx-h100", 256, 512, 4096, (("tp", 2), ("zero", 1)), 1),
    "gemma-2-9b-32k": (str(GEMMA), "dgx-h100", 16, 32, 32768, (), 1),  # soft-caps, windows: attn=flex, cp kernels
}
# the cases with shardings that do not fit even at ckpt=full with every saving (in olmoe's all fit)
SHORTCUT_EXERCISED = {"deepseek-v3", "llama2-13b", "llama3-8b-32k", "mixtral"}


@functools.lru_cache(maxsize=None)
def _case(name: str):
    model_name, cluster_name, gpus, batch, seq, fixed, max_mbs = CASES[name]
    model, cluster, job = get_model(model_name), get_cluster(cluster_name, gpus), JobSpec(batch, seq)
    constraints = SearchConstraints(fixed=fixed, max_mbs=max_mbs)
    exhaustive = search(model, cluster, job, constraints, runnable=True)
    assert exhaustive.all_fitting(), name  # a case with nothing to compare would check nothing
    return model, cluster, job, constraints, exhaustive


def _ranking(plans, k):
    return [(str(p.layout), p.step.step_time, p.memory.total) for p in plans[:k]]


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("keep", [1, 5])
def test_kept_plans_are_the_exhaustive_searchs(name, keep):
    model, cluster, job, constraints, exhaustive = _case(name)
    for runnable, expected in ((True, exhaustive.plans), (False, exhaustive.all_fitting())):
        quick = search(model, cluster, job, constraints, runnable=runnable, keep=keep)
        assert _ranking(quick.plans, keep) == _ranking(expected, keep), (name, keep, runnable)
        assert quick.candidates == exhaustive.candidates
        assert quick.evaluated + quick.skipped + quick.implied_oom <= exhaustive.candidates
        if runnable:
            assert quick.unrunnable_ahead(keep) == exhaustive.unrunnable_ahead(keep)


def test_the_shortcut_skips_most_layouts_of_a_large_search():
    """What the shortcut is for: Mixtral's search evaluates a small part of its layouts for --top 5
    (the counts add up: every layout is evaluated, skipped or known not to fit)."""
    model, cluster, job, constraints, exhaustive = _case("mixtral")
    quick = search(model, cluster, job, constraints, keep=5)
    assert quick.skipped > 0 and quick.evaluated < exhaustive.evaluated / 4
    invalid = exhaustive.candidates - exhaustive.evaluated
    assert quick.evaluated + quick.skipped + quick.implied_oom + invalid >= quick.candidates


@pytest.mark.parametrize("name", sorted(CASES))
def test_bound_never_exceeds_a_predicted_step_time(name):
    """Every fitting layout (with the chunked loss, offload and cp_impl the search gave it) against the
    bound of its group's first layout, as the search computes it."""
    model, cluster, job, constraints, exhaustive = _case(name)
    choose = dict(constraints.fixed).get("cp_impl") is None
    for plan in exhaustive.all_fitting():
        lay = plan.layout
        first = lay.variant(zero=0, hsdp=1, ckpt="none", loss="unfused", offload=0.0, opt_offload=False)
        impls = tuple(i for i in RUNTIME_CP_IMPLS if i != "ulysses" or ulysses_splits_heads(model, first)) \
            if lay.cp > 1 and choose else ()
        bound = step_lower_bounds(model, cluster, job, first, cp_impls=impls, ckpts=(lay.ckpt,))[lay.ckpt]
        # the bound adds a subset of the step's own terms: equal at most, up to float rounding of the sums
        assert bound <= plan.step.step_time * (1 + 1e-9), (name, str(lay), bound, plan.step.step_time)
        assert bound > 0


@pytest.mark.parametrize("name", sorted(CASES))
def test_full_checkpoint_with_every_saving_is_the_least_memory(name):
    """When ckpt=full with the chunked loss and all offload does not fit, no layout of that sharding
    fits (the exhaustive search found none)."""
    model, cluster, job, constraints, exhaustive = _case(name)
    fitting = {_sharding(p.layout) for p in exhaustive.all_fitting()}
    checked = 0
    for group in candidate_groups(model, cluster, job, constraints):
        for _, zero, hsdp, ckpt in group.variants:
            if ckpt != "full":
                continue
            layout = group.base.variant(zero=zero, hsdp=hsdp, ckpt="full")
            if errors_of(validate(model, cluster, job, layout)):
                continue
            least = least_memory_variant(layout, constraints)
            if not estimate_memory(model, cluster, job, least).fits:
                checked += 1
                assert _sharding(layout) not in fitting, (name, str(layout))
    if name in SHORTCUT_EXERCISED:
        assert checked > 0, name


def _sharding(lay) -> tuple:
    return (lay.dp, lay.tp, lay.pp, lay.cp, lay.vpp, lay.mbs, lay.schedule, lay.ep, lay.etp, lay.zero, lay.hsdp)


def test_keep_below_one_is_refused():
    with pytest.raises(PlaitError, match="keep=0"):
        search(get_model("tiny"), get_cluster("dgx-h100", 8), JobSpec(8, 512), keep=0)
