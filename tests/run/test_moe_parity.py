"""Mixture-of-experts runtime: every expert-parallel layout trains ``tiny-moe`` as one process does.

``tiny-moe`` (4 layers, the first dense; 8 routed experts top-2 with an auxiliary loss of weight
0.01, one shared expert) trains 3 AdamW steps on a global batch of 4 × 32 tokens, fp32 on gloo
ranks, and is compared with the single-process run (the same micro-batches of one sequence):

  * losses and global gradient norms of every step: relative difference ≤ tolerances.LOSS_RTOL;
  * every parameter after the 3 steps, gathered to full tensors (experts included): absolute
    difference ≤ the AdamW bound of tests/support/tolerances.py for tiny-moe's parameter count.

Layouts (one pool task per world size, several runs each): ep=2 (dp=2: ep carved out of dp, edp
= 1), ep=2 with FSDP2 ZeRO-3, ep=2 with full and with MLP activation checkpointing (the all-to-all
recomputed),
dp=4 × ep=2 with ZeRO-3 (edp = 2: FSDP shards the experts over it), dp=2 × tp=2 × ep=2 (sequence
parallel: each tp rank routes its own tokens, the experts' gradients summed over tp), pp=2 × dp=2 × ep=2 (MoE layers inside stages), dp=4 ×
ep=4 with ckpt=balanced, HSDP (2 × 2) × ep=2, dp=4 × ep=2 with moe_overlap=chunked and ZeRO-3 or
ZeRO-1 (the chunks run inside one call of the FSDP-sharded experts), and with ZeRO-3 and full
checkpointing (the recomputed forward gathers the experts again). And a
checkpoint chain across ep degrees on 4 ranks: ep=2 (ZeRO-3) -> ep=1 -> ep=2 (zero=0: experts
replicated over edp = 2, gradients summed by the runtime), one step each, resumed from DCP,
against the same uninterrupted run; and one across expert tensor parallelism: etp=2 -> etp=1 -> no tp.
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")

import moe_tasks
import runtime_tasks
import tolerances

from plait.spec.models import get_model

LOSS_RTOL = tolerances.LOSS_RTOL
PARAM_ATOL = tolerances.adamw_atol(tolerances.TINY_LR, moe_tasks.STEPS, tolerances.TINY_EPS,
                                   1.0 / math.sqrt(get_model(moe_tasks.MODEL).total_params()),
                                   tolerances.TINY_LONGEST_SUM, tolerances.TINY_LAYERS)  # ≈ 1.6e-4

LAYOUTS_2 = ["dp=2,ep=2", "dp=2,ep=2,zero=3", "dp=2,ep=2,ckpt=full", "dp=2,ep=2,ckpt=mlp"]
LAYOUTS_4 = ["dp=4,ep=2,zero=3", "dp=2,tp=2,ep=2", "pp=2,dp=2,ep=2", "dp=4,ep=4,ckpt=balanced",
             "dp=4,zero=3,hsdp=2,ep=2", "dp=4,ep=2,zero=3,moe_overlap=chunked", "dp=4,ep=2,zero=1,moe_overlap=chunked",
             "dp=4,ep=2,zero=3,ckpt=full,moe_overlap=chunked"]


@pytest.fixture(scope="module")
def reference():
    return moe_tasks.reference()


def assert_same_training(result: dict, reference: dict, layout: str, start: int = 0) -> None:
    for step, (got, want) in enumerate(zip(result["losses"], reference["losses"][start:], strict=True)):
        assert abs(got - want) <= LOSS_RTOL * abs(want), f"{layout}: step {start + step} loss {got} vs {want}"
    for step, (got, want) in enumerate(zip(result["grad_norms"], reference["grad_norms"][start:], strict=True)):
        assert abs(got - want) <= LOSS_RTOL * abs(want), f"{layout}: step {start + step} gradient norm {got} vs {want}"
    params = result["params"]
    assert set(params) == set(reference["params"]), f"{layout}: parameter names differ"
    worst = max(((params[name] - value).abs().max().item(), name) for name, value in reference["params"].items())
    assert worst[0] <= PARAM_ATOL, f"{layout}: parameter {worst[1]} differs by {worst[0]:.3g}"


def test_the_reference_routes_and_balances(reference):
    assert "layers.1.feed_forward.experts.w1" in reference["params"]
    assert reference["params"]["layers.1.feed_forward.experts.w1"].shape == (8, 128, 96)
    assert reference["losses"][2] < reference["losses"][0]


@pytest.mark.parametrize("world,layouts", [(2, LAYOUTS_2), (4, LAYOUTS_4)], ids=["2-ranks", "4-ranks"])
def test_expert_parallel_layouts_match_one_process(dist_pool, reference, world, layouts):
    out = dist_pool(world).run(moe_tasks.train_layouts, layouts, timeout=300)
    for index, layout in enumerate(layouts):
        assert_same_training(out[0][index], reference, layout)
        assert all(rank[index]["losses"] == out[0][index]["losses"] for rank in out), f"{layout}: ranks disagree"


@pytest.mark.parametrize("variant", sorted(moe_tasks.VARIANTS))
def test_routing_variants_match_one_process(dist_pool, reference, variant):
    """capped: capacity factor 1.0, each expert keeps its best ceil(T·k/E) pairs of every micro-batch
    before the dispatch; deepseek: the sigmoid router with 4 groups (2 chosen), route scale 2.5 and
    its balancing bias, moved after every step by the load summed over the data-parallel ranks."""
    want = runtime_tasks.in_one_process(moe_tasks.train_variant, variant, ["dp=1"])[0]
    got = dist_pool(2).run(moe_tasks.train_variant, variant, ["dp=2,ep=2"], timeout=300)[0][0]
    assert want["losses"][0] != reference["losses"][0], f"{variant}: routed as tiny-moe"
    for key in ("losses", "grad_norms"):
        for step, (a, b) in enumerate(zip(got[key], want[key], strict=True)):
            assert abs(a - b) <= LOSS_RTOL * abs(b), f"{variant}, ep=2: step {step} {key} {a} vs {b}"


def test_the_sigmoid_routers_bias_resumes_exactly(dist_pool, tmp_path):
    """The balancing bias is checkpointed with the parameters: a run stopped after 2 steps and resumed
    takes its 3rd step exactly as the uninterrupted run."""
    pool = dist_pool(2)
    full = pool.run(moe_tasks.train_variant, "deepseek", ["dp=2,ep=2"])[0][0]
    pool.run(moe_tasks.train_variant, "deepseek", ["dp=2,ep=2"], stop_after=2, checkpoint_dir=str(tmp_path))
    resumed = pool.run(moe_tasks.train_variant, "deepseek", ["dp=2,ep=2"],
                       resume_from=str(tmp_path / "step_00000002"))[0][0]
    assert resumed["steps"] == [2] and resumed["losses"] == full["losses"][2:]
    assert resumed["grad_norms"] == full["grad_norms"][2:]


def test_zero_shards_the_experts_over_the_expert_data_parallel_ranks(dist_pool):
    """dp=4, ep=2, ZeRO-3: 4 experts per ep rank, each expert's weight split over edp = 2 ranks."""
    out = dist_pool(4).run(moe_tasks.expert_weight_placement, "dp=4,ep=2,zero=3")
    for rank in out:  # str(placement): S(0) is Shard(dim=0), _S(0, 2) FSDP's _StridedShard(dim=0, sf=2)
        assert rank["mesh"] == ["edp", "ep"] and rank["local"] == (2, 128, 96), rank
        assert rank["placements"] == ["_S(0, 2)", "S(0)"], rank  # ep: Shard(0); edp: a strided Shard(0) inside it


def test_checkpoints_resume_across_ep_degrees(dist_pool, reference, tmp_path):
    """ep=2 with experts ZeRO-3-sharded over edp -> ep=1 (DDP) -> ep=2 replicated over edp = 2 (summed
    there by the runtime): one step each, each resumed from the previous run's DCP checkpoint."""
    runs = dist_pool(4).run(moe_tasks.resume_across_ep, str(tmp_path), ("dp=4,ep=2,zero=3", "dp=4", "dp=4,ep=2"),
                            timeout=300)[0]
    assert [run["steps"] for run in runs] == [[0], [1], [2]]
    for start, run in enumerate(runs[:2]):
        assert run["losses"][0] == pytest.approx(reference["losses"][start], rel=LOSS_RTOL)
    assert_same_training(runs[2], reference, "ep=2 -> ep=1 -> ep=2", start=2)


def test_checkpoints_resume_across_expert_tensor_parallel_degrees(dist_pool, reference, tmp_path):
    """etp=2 (each expert's matrices split over the tp ranks) -> etp=1 (whole experts, each tp rank
    routing its own tokens) -> dp=4 with no tp at all: one step each, each resumed from the previous
    run's DCP checkpoint, against the uninterrupted single-process run."""
    runs = dist_pool(4).run(moe_tasks.resume_across_ep, str(tmp_path),
                            ("dp=2,tp=2,ep=2,etp=2", "dp=2,tp=2,ep=2", "dp=4,ep=2"), timeout=300)[0]
    assert [run["steps"] for run in runs] == [[0], [1], [2]]
    for start, run in enumerate(runs[:2]):
        assert run["losses"][0] == pytest.approx(reference["losses"][start], rel=LOSS_RTOL)
    assert_same_training(runs[2], reference, "etp=2 -> etp=1 -> tp=1", start=2)
