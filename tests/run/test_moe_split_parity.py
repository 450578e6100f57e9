"""MoE blocks whose tokens or experts are split inside a micro-batch train as one process does.

``tiny-moe`` (softmax router, aux loss 0.01, one shared expert) and ``tiny-dsv3`` (MLA, sigmoid
router with its balancing bias, group-limited routing, one shared expert) train 3 AdamW steps
under layouts that split what an MoE block computes (``plait.run.parallel.moe_tensor``), fp32 on
gloo ranks, compared with each model's single-process run as tests/run/test_moe_parity.py does:
losses and gradient norms within tolerances.LOSS_RTOL, every parameter within the AdamW bound of
tests/support/tolerances.py for the model's parameter count.

  * ``tp=2,etp=2``: each expert's ffn split over the tp ranks (w1/w3 column-wise, w2 row-wise),
    the rows all-gathered over etp and the partial outputs reduce-scattered; with sequence
    parallelism each tp rank routes its own tokens and the aux statistics are all-reduced over tp.
  * ``tp=2,sp=0,etp=2`` (tiny-moe): without sequence parallelism, the router repeated on both tp
    ranks, the gathered rows repeated (what the planner prices).
  * ``cp=2``: each cp rank routes its half of every sequence; the aux statistics all-reduced over cp
    and the aux gradient scaled by cp; MLA's narrower values padded for the cp attention kernel.
  * on 4 ranks ``dp=2,tp=2,ep=2,etp=2`` (the experts DTensors over the (ep, etp) mesh) and
    ``dp=2,cp=2`` with ZeRO-3 (tiny-dsv3).
tp=2 with sequence parallelism and etp=1 (each tp rank its own tokens, the experts' gradients summed
over tp) is trained by tests/run/test_mla_parity.py (``tp=2``) and test_moe_parity.py (``dp=2,tp=2,ep=2``).
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")

import moe_tasks
import tolerances
from runtime_tasks import in_one_process, train_layout

from plait.spec.models import get_model

MODELS = ("tiny-moe", "tiny-dsv3")
PAIRS_2 = [("tiny-moe", "tp=2,etp=2"), ("tiny-moe", "tp=2,sp=0,etp=2"), ("tiny-moe", "cp=2"),
           ("tiny-dsv3", "tp=2,etp=2"), ("tiny-dsv3", "cp=2")]
PAIRS_4 = [("tiny-moe", "dp=2,tp=2,ep=2,etp=2"), ("tiny-dsv3", "dp=2,cp=2,zero=3")]


def param_atol(model: str) -> float:
    return tolerances.adamw_atol(tolerances.TINY_LR, moe_tasks.STEPS, tolerances.TINY_EPS,
                                 1.0 / math.sqrt(get_model(model).total_params()),
                                 tolerances.TINY_LONGEST_SUM, tolerances.TINY_LAYERS)


@pytest.fixture(scope="module")
def references():
    return {model: in_one_process(train_layout, "dp=1", part_fields=(), **{**moe_tasks.RUN, "model": model})
            for model in MODELS}


def assert_same_training(result: dict, reference: dict, model: str, layout: str) -> None:
    for key in ("losses", "grad_norms"):
        for step, (got, want) in enumerate(zip(result[key], reference[key], strict=True)):
            assert abs(got - want) <= tolerances.LOSS_RTOL * abs(want), f"{model} {layout}: step {step} {key} {got} vs {want}"
    params = result["params"]
    assert set(params) == set(reference["params"]), f"{model} {layout}: parameter names differ"
    worst = max(((params[name] - value).abs().max().item(), name) for name, value in reference["params"].items())
    assert worst[0] <= param_atol(model), f"{model} {layout}: parameter {worst[1]} differs by {worst[0]:.3g}"


@pytest.mark.parametrize("world,pairs", [(2, PAIRS_2), (4, PAIRS_4)], ids=["2-ranks", "4-ranks"])
def test_split_moe_layouts_match_one_process(dist_pool, references, world, pairs):
    out = dist_pool(world).run(moe_tasks.train_model_layout_pairs, pairs, timeout=900)
    for index, (model, layout) in enumerate(pairs):
        assert_same_training(out[0][index], references[model], model, layout)
        assert all(rank[index]["losses"] == out[0][index]["losses"] for rank in out), f"{model} {layout}: ranks disagree"
