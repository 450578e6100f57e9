"""ZeRO-3 priced unit by unit (``plait.plan.terms.zero3``): the planner's units are the runtime's, and
what is exposed follows from their collectives.

The runtime's units (``plait.run.parallel.data.unit_groups``) are counted on a meta-device model,
parameter by parameter, so the planner's split of the embedding, the blocks and the head is checked
against what FSDP2 gathers, not against the planner's own formula.
"""

from __future__ import annotations

import dataclasses

import pytest

from plait.plan import comm
from plait.plan.cost import _groups, estimate_step
from plait.plan.terms.data import zero3_stages as _zero3_stages
from plait.plan.kernels import layer_times
from plait.plan.memory import stage_params
from plait.plan.params import DEFAULT_PARAMS
from plait.plan.terms.zero3 import Unit, zero3_exposed
from plait.spec.hardware import CLUSTERS
from plait.spec.layout import JobSpec, Layout
from plait.spec.models import MODELS

TIMES = layer_times(MODELS["tiny"], CLUSTERS["dgx-h100"].gpu, DEFAULT_PARAMS, 512, 128, 1, 1, True, "flash",
                    "bf16", "fused", "torch", "ring")


def _units(model, text: str) -> list[list[Unit]]:
    lay = Layout.parse(text)
    layers = model.n_layers // lay.pp
    return _zero3_stages(model, lay, layers, TIMES, 0.0, 1e-3)


@pytest.mark.parametrize("name,tied", [("tiny", False), ("tiny-gpt", False), ("tiny-gpt", True)])
def test_units_hold_what_the_runtime_units_hold(name, tied):
    pytest.importorskip("torch")
    from plait.run.model import build_model
    from plait.run.parallel.data import unit_groups

    model = dataclasses.replace(MODELS[name], tied_embeddings=tied)
    module = build_model(model, "meta")
    runtime = []
    for modules, reshard in unit_groups(module, reshard=True):
        params = {id(p): p for m in modules for p in m.parameters()}  # a tied weight once
        runtime.append((sum(p.numel() for p in params.values()), reshard))
    [planned] = _units(model, "dp=2,zero=3")
    assert [(u.params, u.reshard) for u in planned] == runtime
    assert sum(u.params for u in planned) == stage_params(model, Layout.parse("dp=2,zero=3"))["first"]


def test_pipeline_stages_hold_their_own_end():
    model = MODELS["tiny"]
    lay = Layout.parse("dp=2,pp=2,zero=3")
    first, last = _units(model, "dp=2,pp=2,zero=3")
    held = stage_params(model, lay)
    assert sum(u.params for u in first) == held["first"] and sum(u.params for u in last) == held["last"]
    assert first[0].reshard and first[0].forward_s == 0.0  # the embedding: gathered again, no compute
    assert not last[-1].reshard and last[-1].backward_s == pytest.approx(2e-3 / 3)


def test_without_overlap_every_collective_is_exposed():
    """dp_overlap = 0: per micro-batch each unit's gather, the resharded units' re-gathers and every
    reduce-scatter but the first unit's, which is exposed once per step."""
    model, cluster = MODELS["tiny"], CLUSTERS["dgx-h100"]
    params = dataclasses.replace(DEFAULT_PARAMS, dp_overlap=0.0, zero3_collective_bandwidth=0.0)
    lay = Layout.parse("dp=8,zero=3")
    shard = _groups(lay, cluster.gpus_per_node)["shard"]
    [units] = _units(model, "dp=8,zero=3")
    gathers = [comm.all_gather(cluster, shard, 2 * u.params) for u in units]
    scatters = [comm.reduce_scatter(cluster, shard, params.grad_reduce_bytes * u.params) for u in units]
    regathers = sum(g for g, u in zip(gathers, units) if u.reshard)
    m = 3
    expected = m * (sum(gathers) + regathers + sum(scatters[1:])) + scatters[0]
    assert zero3_exposed(cluster, shard, units, m, params) == pytest.approx(expected, rel=1e-12)
    assert not units[-1].reshard and units[0].reshard  # the head is gathered once per micro-batch


def test_large_ends_are_not_hidden_behind_the_blocks():
    """A vocabulary-heavy model: the embedding's gather is exposed in full before the first block,
    and the head's hides behind at most one block's forward, so the step pays more than the same
    parameters spread evenly over the blocks would."""
    model = dataclasses.replace(MODELS["tiny"], vocab=256_000)
    cluster = CLUSTERS["dgx-h100"]
    lay = Layout.parse("dp=8,mbs=1,zero=3")
    job = JobSpec(8, 128)
    step = estimate_step(model, cluster, job, lay)
    shard = _groups(lay, cluster.gpus_per_node)["shard"]
    [units] = _units(model, "dp=8,zero=3")
    first_gather = comm.all_gather(cluster, shard, 2 * units[0].params)
    assert step.dp_comm >= first_gather  # at least the embedding's, every micro-batch (here 1)
    even = [Unit(sum(u.params for u in units) / model.n_layers, TIMES.fwd, TIMES.bwd, True)] * model.n_layers
    assert zero3_exposed(cluster, shard, units, 1, DEFAULT_PARAMS) > zero3_exposed(cluster, shard, even, 1, DEFAULT_PARAMS)
