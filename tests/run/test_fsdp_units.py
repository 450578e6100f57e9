"""FSDP2 units as torchtitan groups them (``plait.run.parallel.data.unit_groups``), and training
with a tied LM head under ZeRO-3 matches one process.

Units of the tiny model (4 blocks) at dp=2: the embedding alone, each block, ``[norm, output]``
never resharded after forward, and an empty root. With tied embeddings, the embedding, norm and
LM head are one unit (the tied weight is managed once) that is never resharded after forward.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import lean_tasks
from test_runtime_parity import assert_same_training


def _by_first_module(units: list[dict]) -> dict[str, dict]:
    return {unit["modules"][0]: unit for unit in units}


def test_zero3_units_follow_torchtitan(dist_pool):
    units = _by_first_module(dist_pool(2).run(lean_tasks.fsdp_units, "dp=2,zero=3")[0])
    assert units["tok_embeddings"]["params"] == ["tok_embeddings.weight"]
    assert units["tok_embeddings"]["reshard"] is True
    for i in range(4):
        block = units[f"layers.{i}"]
        assert block["reshard"] is True
        assert all(name.startswith(f"layers.{i}.") for name in block["params"]) and block["params"]
    head = units["norm"]
    assert head["modules"] == ["norm", "output"]
    assert head["params"] == ["norm.weight", "output.weight"]
    assert head["reshard"] is False
    assert units["<root>"]["params"] == []  # nothing left for the root unit
    assert len(units) == 7


def test_zero2_units_never_reshard(dist_pool):
    units = dist_pool(2).run(lean_tasks.fsdp_units, "dp=2,zero=2")[0]
    assert len(units) == 7
    assert all(unit["reshard"] is not True for unit in units)


def test_tied_embedding_is_one_unit(dist_pool):
    units = _by_first_module(dist_pool(2).run(lean_tasks.fsdp_units, "dp=2,zero=3", tied=True)[0])
    tied = units["tok_embeddings"]
    assert tied["modules"] == ["tok_embeddings", "norm", "output"]
    assert tied["params"] == ["norm.weight", "tok_embeddings.weight"]  # the tied matrix once
    assert tied["reshard"] is False
    assert units["layers.0"]["reshard"] is True
    assert "norm" not in units and len(units) == 6


def test_pipeline_stage_units(dist_pool):
    out = dist_pool(4).run(lean_tasks.fsdp_units, "pp=2,dp=2,zero=3")
    first, last = _by_first_module(out[0]), _by_first_module(out[-1])
    assert "tok_embeddings" in first and "norm" not in first
    assert "norm" in last and "tok_embeddings" not in last and last["norm"]["reshard"] is False


@pytest.mark.parametrize("layout", ["dp=2,zero=3", "dp=2,zero=3,reshard=0"])
def test_tied_gpt_zero3_matches_one_process(dist_pool, layout):
    spec = lean_tasks.tied_spec("tiny-gpt")
    reference = lean_tasks.reference_spec(spec)
    out = dist_pool(2).run(lean_tasks.train_spec, layout, spec, timeout=240)
    assert_same_training(out[0], reference, layout)


def test_zero1_gathers_and_reduces_once_per_step_and_zero2_per_micro_batch(dist_pool):
    """dp=2, batch 8, mbs 1: 4 micro-batches per step. ZeRO-1 accumulates unsharded gradients and
    keeps the parameters gathered until the last micro-batch, so every unit is gathered and
    reduce-scattered once per step; ZeRO-2 does both for every micro-batch (as the planner
    counts them, ``plait.plan.cost``). Parity with one process: test_runtime_parity."""
    zero1 = dist_pool(2).run(lean_tasks.fsdp_collective_counts, "dp=2,zero=1")[0]
    zero2 = dist_pool(2).run(lean_tasks.fsdp_collective_counts, "dp=2,zero=2")[0]
    units_with_params, steps, micro_batches = 6, 2, 4  # embedding, 4 blocks, [norm, head]; the root is empty
    assert zero1 == {"all_gather": units_with_params * steps, "reduce_scatter": units_with_params * steps}
    assert zero2 == {kind: micro_batches * count for kind, count in zero1.items()}
