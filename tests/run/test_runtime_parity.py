"""Every layout the runtime runs trains the same model as one process does.

Each case trains the tiny model (4 layers, hidden 128, 4 heads / 2 KV heads, vocab 512) for 3
AdamW steps on a global batch of 8 × 32 tokens with gloo ranks on CPU in fp32, and compares
with the single-process run of the same global batch:

  * losses and global gradient norms of every step: relative difference ≤ tolerances.LOSS_RTOL
    (≈ 6.5e-5; seen: ≤ 1e-7);
  * every parameter after the 3 steps, gathered to full tensors: absolute difference ≤
    tolerances.param_atol(3) (≈ 2e-4; seen: ≤ 2.4e-6 with tensor parallelism, ≤ 4e-7 without;
    parameters are O(0.02–1)). AdamW divides by the root of the squared gradients, which
    magnifies the rounding differences of near-zero gradients; eps = 1e-6 bounds that.
    Both are derived from fp32 rounding in tests/support/tolerances.py, so they hold on any CPU.

Layouts: DDP, FSDP2 ZeRO-2 and ZeRO-3 (both reshard modes), HSDP, TP with and without SP,
every pipeline schedule, and FSDP×TP, PP×TP, PP×FSDP, PP×DDP and PP×FSDP×TP (8 ranks), with
and without activation checkpointing (full, selective, mlp: the MLP half recomputed); GPT (LayerNorm, biases, learned positions) as well.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import runtime_tasks
import tolerances

LOSS_RTOL = tolerances.LOSS_RTOL
PARAM_ATOL = tolerances.param_atol(3)  # runtime_tasks.make_config's 3 steps

# Tensor parallelism with another feature (no SP, checkpointing, FSDP, replication, PP) runs fewer, larger
# micro-batches (mbs=4, or 2 with dp or pp: still 2 or more to accumulate); plain TP + SP keeps 8 of 1.
# What each combination checks is the same in every micro-batch, and a tp micro-batch is ~50 gloo
# collectives on CPU, so 8 of 1 made those runs ~4x slower.
CASES_2 = [
    ("dp=2", "DDP"),
    ("dp=2,zero=1", "FSDP2 ZeRO-1: unsharded gradients accumulated over 4 micro-batches"),
    ("dp=2,zero=2", "FSDP2 ZeRO-2"),
    ("dp=2,zero=3", "FSDP2 ZeRO-3"),
    ("dp=2,zero=3,reshard=0,ckpt=full", "ZeRO-3 without reshard, full checkpointing"),
    ("tp=2", "TP + SP"),
    ("tp=2,sp=0,ckpt=selective,mbs=4", "TP without SP, selective checkpointing"),
    ("tp=2,ckpt=mlp,mbs=4", "TP + SP, MLP checkpointing"),
    ("dp=2,zero=3,ckpt=mlp", "FSDP2 ZeRO-3, MLP checkpointing"),
    ("pp=2,schedule=gpipe", "PP GPipe"),
    ("pp=2,ckpt=full:1", "PP 1F1B, 1 of 2 layers checkpointed"),
    ("pp=2,vpp=2", "PP interleaved 1F1B"),
    ("pp=2,schedule=zero-bubble,mbs=2", "PP zero-bubble"),
]
CASES_4 = [
    ("dp=4,zero=3,hsdp=2", "HSDP 2 × 2"),
    ("dp=2,tp=2,zero=3,mbs=2", "FSDP × TP"),
    ("dp=2,tp=2,ckpt=selective,mbs=2", "DDP-style replication × TP"),
    ("pp=2,tp=2,ckpt=full,mbs=2", "PP × TP"),
    ("pp=2,dp=2,zero=3", "PP × FSDP"),
    ("pp=2,dp=2", "PP × DDP"),
    ("pp=2,dp=2,schedule=gpipe", "PP GPipe × DDP"),
    ("pp=2,dp=2,schedule=zero-bubble", "PP zero-bubble × DDP"),
    ("pp=2,vpp=2,dp=2,zero=3,reshard=1", "interleaved PP × ZeRO-3 resharding"),
    ("pp=4,schedule=gpipe", "PP 4 stages"),
    ("pp=2,vpp=2,dp=2,zero=1,ckpt=selective", "interleaved PP × ZeRO-1"),
]
CASES_GPT = [
    (2, "dp=2,zero=3"),
    (4, "dp=2,tp=2,zero=3,mbs=2"),
    (2, "pp=2"),
]


def assert_same_training(result: dict, reference: dict, layout: str) -> None:
    for step, (got, want) in enumerate(zip(result["losses"], reference["losses"], strict=True)):
        assert abs(got - want) <= LOSS_RTOL * abs(want), f"{layout}: step {step} loss {got} vs {want}"
    for step, (got, want) in enumerate(zip(result["grad_norms"], reference["grad_norms"], strict=True)):
        # the clipped norm is the whole model's, however it is sharded (FSDP, TP, PP, replicas once)
        assert abs(got - want) <= LOSS_RTOL * abs(want), f"{layout}: step {step} gradient norm {got} vs {want}"
    params = result["params"]
    assert set(params) == set(reference["params"]), f"{layout}: parameter names differ"
    worst = max(((params[name] - value).abs().max().item(), name) for name, value in reference["params"].items())
    assert worst[0] <= PARAM_ATOL, f"{layout}: parameter {worst[1]} differs by {worst[0]:.3g}"


@pytest.mark.parametrize("layout", [c[0] for c in CASES_2], ids=[c[1] for c in CASES_2])
def test_two_ranks_match_one_process(dist_pool, references, layout):
    out = dist_pool(2).run(runtime_tasks.train_layout, layout, timeout=180)
    assert_same_training(out[0], references(), layout)
    assert all(rank["losses"] == out[0]["losses"] for rank in out), "ranks disagree on the loss"


@pytest.mark.parametrize("layout", [c[0] for c in CASES_4], ids=[c[1] for c in CASES_4])
def test_four_ranks_match_one_process(dist_pool, references, layout):
    out = dist_pool(4).run(runtime_tasks.train_layout, layout, timeout=240)
    assert_same_training(out[0], references(), layout)


@pytest.mark.parametrize("world_size,layout", CASES_GPT, ids=[c[1] for c in CASES_GPT])
def test_gpt_matches_one_process(dist_pool, references, world_size, layout):
    out = dist_pool(world_size).run(runtime_tasks.train_layout, layout, model="tiny-gpt", timeout=240)
    assert_same_training(out[0], references("tiny-gpt"), layout)


@pytest.mark.slow
def test_eight_ranks_3d_matches_one_process(dist_pool, references):
    layout = "pp=2,dp=2,tp=2,zero=3,ckpt=selective,mbs=2"  # 2 micro-batches of 2 for the 2 stages (CASES_2's note)
    out = dist_pool(8).run(runtime_tasks.train_layout, layout, timeout=300)
    assert_same_training(out[0], references(), layout)


def test_compiled_blocks_match_one_process(dist_pool, references):
    layout = "dp=2,zero=3,ckpt=full:2"
    out = dist_pool(2).run(runtime_tasks.train_layout, layout, compile=True, compile_backend="aot_eager",
                           timeout=240)
    assert_same_training(out[0], references(), layout)


def test_checkpointing_counts_layers_per_gpu(dist_pool):
    out = dist_pool(2).run(runtime_tasks.train_layout, "pp=2,ckpt=full:1", steps=1)
    # stage 0 holds layers 0-1, stage 1 layers 2-3: the first layer of each is checkpointed
    assert [rank["checkpointed"] for rank in out] == [["0"], ["2"]]
