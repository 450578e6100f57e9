"""Router health in the step records: the fields ``plait.run.observe.router`` logs equal a direct
computation from the routers' own outputs.

``tiny-moe`` with a sigmoid router and capacity factor 1.0 (3 MoE layers, 8 experts, top-2) trains
2 steps on 4 micro-batches of one 32-token sequence under dp=2 × ep=2 (each rank routes 2
micro-batches), tp=2 without sequence parallelism (both ranks route the same tokens), tp=2 with it
(each rank routes its half of every micro-batch with its own capacity, and the aux loss is the
micro-batch's, over both halves: tests/run/test_moe_split_parity.py trains it as one process does) and
pp=2 (each rank holds some of the MoE layers), cp=2 (each rank routes its part of every sequence, as
with sequence parallelism) and dp=2 × ep=2 with full checkpointing and moe_overlap=chunked (the
recomputed forward routes again and counts nothing again), on 2 gloo ranks. Every training forward's expert choices and probabilities are recorded
on every rank as its router computed them; from them the test counts, per layer and step, the
pairs per expert (the tp replicas once), the pairs over each expert's capacity ceil(c·T·k/E) per
micro-batch and the Switch aux loss coef·E·Σ_e f_e·P_e of each micro-batch, then the fields: min,
max and coefficient of variation of the pairs per expert, dropped pairs and their fraction, the
aux loss (Σ over layers of its mean over micro-batches) and, at step 2, the bias spread that the
first balancing step left: rate·(max - min) over experts of sign(mean load - load).

Pair counts are integers in fp32 and equal exactly. The coefficients of variation come from 8
counts (mean, variance, square root, division) and the aux loss from sums of 8 products per
micro-batch, each side in its own order: within ``reduction_rtol`` of the sums involved, times 4
for the chained operations. The bias spread is 0 or 2·rate in both (exact up to one rounding).
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")

import router_tasks
import tolerances
import torch

from plait.run.modules.moe import BIAS_UPDATE_RATE
from plait.run.observe.router import FIELDS

SPEC = router_tasks.health_model()
MOE = SPEC.moe
LAYOUTS = {"dp=2,ep=2": (0, 1), "tp=2,sp=0": (0,), "tp=2": (0, 1), "pp=2": (0, 1),  # the ranks whose routing counts once
           "dp=2,ep=2,ckpt=full,moe_overlap=chunked": (0, 1), "cp=2": (0, 1)}  # recomputed routing: not again
SPLIT = ("tp=2", "cp=2")  # sequence parallel, context parallel: each rank routes its part of every micro-batch
RTOL = 4 * tolerances.reduction_rtol(router_tasks.GLOBAL_BATCH * MOE.n_experts * 3)


def direct_fields(routed: list, micro_batches: list | None = None) -> list[dict]:
    """The fields of each step, computed from the recorded (step, layer, ids, probs) of every forward.

    ``micro_batches``: the same records joined per micro-batch where a micro-batch's tokens were routed
    in parts (tp with sequence parallelism: each tp rank routes its slice of the sequence, with its own
    capacity, while the aux loss is the micro-batch's, over the tokens of all parts); default ``routed``."""
    out = []
    micro_batches = routed if micro_batches is None else micro_batches
    steps = sorted({step for step, *_ in routed})
    bias_spread = 0.0  # the bias the first step routes with
    for step in steps:
        loads, dropped, aux = {}, 0, 0.0
        per_layer_aux: dict[int, list[float]] = {}
        for _, layer, ids, probs in (r for r in routed if r[0] == step):
            counts = torch.bincount(ids.flatten(), minlength=MOE.n_experts).double()
            loads[layer] = loads.get(layer, torch.zeros(MOE.n_experts, dtype=torch.float64)) + counts
            capacity = math.ceil(MOE.capacity_factor * probs.shape[0] * MOE.top_k / MOE.n_experts)
            dropped += int((counts - capacity).clamp_min(0).sum())
        for _, layer, ids, probs in (r for r in micro_batches if r[0] == step):
            counts = torch.bincount(ids.flatten(), minlength=MOE.n_experts).double()
            fraction = counts / (probs.shape[0] * MOE.top_k)
            per_layer_aux.setdefault(layer, []).append(
                MOE.aux_loss_coef * MOE.n_experts * float((fraction * probs.double().mean(0)).sum()))
        aux = sum(sum(values) / len(values) for values in per_layer_aux.values())
        cvs = [float(load.std(correction=0) / load.mean()) for load in loads.values()]
        pairs = sum(float(load.sum()) for load in loads.values())
        out.append({"moe_tokens_per_expert_min": min(float(load.min()) for load in loads.values()),
                    "moe_tokens_per_expert_max": max(float(load.max()) for load in loads.values()),
                    "moe_tokens_per_expert_cv": sum(cvs) / len(cvs), "moe_tokens_per_expert_cv_max": max(cvs),
                    "moe_dropped_pairs": float(dropped), "moe_dropped_frac": dropped / pairs, "moe_aux_loss": aux,
                    "moe_bias_spread": bias_spread, "layers": len(loads), "pairs": pairs})
        signs = [torch.sign(load.mean() - load) for load in loads.values()]
        bias_spread = max(BIAS_UPDATE_RATE * float(s.max() - s.min()) for s in signs)  # after this step's update
    return out


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_router_fields_equal_a_direct_computation_from_the_routers_outputs(dist_pool, layout):
    runs = dist_pool(2).run(router_tasks.router_records, layout, timeout=300)
    routed = [r for rank in LAYOUTS[layout] for r in runs[rank]["routed"]]
    joined = None
    if layout in SPLIT:  # the tp ranks' parts of each micro-batch, in forward order on both
        joined = [(a[0], a[1], torch.cat([a[2], b[2]]), torch.cat([a[3], b[3]]))
                  for a, b in zip(runs[0]["routed"], runs[1]["routed"], strict=True)]
        assert all(a[:2] == b[:2] for a, b in zip(runs[0]["routed"], runs[1]["routed"]))
    want = direct_fields(routed, joined)
    layers = sum(1 for i in range(SPEC.n_layers) if i >= MOE.first_dense)
    tokens = router_tasks.GLOBAL_BATCH * router_tasks.SEQ
    assert len(want) == router_tasks.STEPS and all(w["layers"] == layers for w in want)
    assert all(w["pairs"] == layers * tokens * MOE.top_k for w in want)  # every token routed once per layer
    assert want[0]["moe_dropped_pairs"] > 0 and want[1]["moe_bias_spread"] > 0  # something to check
    for run in runs:  # every rank holds the same fields
        assert len(run["router"]) == router_tasks.STEPS
        for got, expected in zip(run["router"], want, strict=True):
            assert set(got) == set(FIELDS)
            for name in ("moe_tokens_per_expert_min", "moe_tokens_per_expert_max", "moe_dropped_pairs"):
                assert got[name] == expected[name], (layout, name)
            for name in ("moe_tokens_per_expert_cv", "moe_tokens_per_expert_cv_max", "moe_dropped_frac",
                         "moe_aux_loss"):
                assert got[name] == pytest.approx(expected[name], rel=RTOL), (layout, name)
            assert got["moe_bias_spread"] == pytest.approx(expected["moe_bias_spread"], rel=4 * tolerances.U)


def test_a_dense_step_record_has_no_router_fields():
    from plait.run.metrics import StepRecord

    record = StepRecord(step=0, loss=1.0, lr=1e-3, grad_norm=1.0, step_time_s=1.0, tokens_per_s=1.0, mfu=None)
    assert not set(record.to_dict()) & set(FIELDS)
    fields = dict(zip(FIELDS, range(len(FIELDS))))
    assert set(StepRecord(0, 1.0, 1e-3, 1.0, 1.0, 1.0, None, router=fields).to_dict()) >= set(FIELDS)
