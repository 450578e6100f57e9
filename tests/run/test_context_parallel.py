"""Context parallelism: the cp attention kernels and whole training runs match one process.

  * The kernels (ring attention with online softmax, all-gather of K/V, PyTorch's own ring
    attention with its CPU flash kernel, Ulysses all-to-all) against full causal attention:
    output and the gradients of q, k, v on each rank's head-tail tokens, with GQA/MQA,
    cp = 2 and 4 (fp32, max abs difference ≤ tolerances.attention_atol at the inputs' and
    gradients' magnitude ≈ 2.7e-5; seen ≈ 1e-6).
  * Training (3 AdamW steps of the tiny model, 8 × 32 tokens, gloo on CPU) with cp alone and
    with TP, FSDP and DDP-style replication, against the single-process run: losses and grad
    norms and parameters within tests/run/test_runtime_parity.py's bars (tests/support/tolerances.py).
  * Bad input: cp that does not split the sequence into 2·cp chunks, cp with pp, cp with a
    dropout model, Ulysses with cp not dividing the K/V heads: refused before launch, one line.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import cp_tasks
import runtime_tasks
import tolerances
from test_runtime_parity import assert_same_training
from test_train_cli import run_inline

from plait.run.parallel.context.shard import SequenceShard



def test_head_tail_shards_cover_the_sequence_once():
    import torch

    seq, cp = 16, 4
    tokens = torch.arange(seq)[None, :]
    shards = [SequenceShard(rank, cp) for rank in range(cp)]
    pieces = [shard.shard(tokens).flatten().tolist() for shard in shards]
    assert pieces[0] == [0, 1, 14, 15] and pieces[3] == [6, 7, 8, 9]
    assert sorted(token for piece in pieces for token in piece) == list(range(seq))
    for shard, piece in zip(shards, pieces):  # positions are the tokens' own indices
        assert shard.positions(seq // cp, "cpu").tolist() == piece


@pytest.mark.parametrize("impl", ["ring", "allgather", "torch", "ulysses"])
@pytest.mark.parametrize("cp,heads,kv_heads", [(2, 4, 2), (4, 4, 1), (4, 8, 4)], ids=["cp2-gqa", "cp4-mqa", "cp4-gqa"])
def test_attention_matches_full_causal_attention(dist_pool, impl, cp, heads, kv_heads):
    if impl == "ulysses" and kv_heads % cp:
        pytest.skip("ulysses needs cp to divide the K/V heads (a validator rule, tested below)")
    out = dist_pool(cp).run(cp_tasks.attention_errors, impl, heads=heads, kv_heads=kv_heads, timeout=60)
    for rank, errors in enumerate(out):
        assert errors["scale"] > 1e-2
        atol = tolerances.attention_atol(32, 8, max(errors["scale"], errors["inputs"]))  # cp_tasks' seq, head_dim
        for name in ("out", "dq", "dk", "dv"):
            assert errors[name] <= atol, f"rank {rank}: {name} differs by {errors[name]:.3g}"


# cp × tp runs 2 micro-batches of 4 sequences (mbs=4), not 8 of 1: the attention's sharding is the same in
# every micro-batch, 2 still accumulate, and a tp micro-batch is ~50 gloo collectives (4x the time with 8)
CASES = [
    (2, "cp=2", "tiny"),
    (2, "cp=2,ckpt=selective,cp_impl=allgather", "tiny-gpt"),  # learned positions of the local chunks
    (4, "cp=4", "tiny"),
    (4, "cp=2,tp=2,mbs=4", "tiny"),
    (4, "dp=2,cp=2,zero=3", "tiny"),
    (4, "dp=2,cp=2,cp_impl=torch", "tiny"),  # DDP; PyTorch's ring with its CPU flash kernel
    (4, "cp=2,tp=2,sp=0,zero=0,ckpt=full,mbs=4", "tiny"),
    (4, "dp=2,cp=2,zero=2,cp_impl=ulysses", "tiny"),
    (2, "cp=2,ckpt=balanced,offload=cpu:1.0", "tiny"),  # the long-context plans combine all three
    (2, "cp=2,offload=disk:0.5", "tiny"),
]


@pytest.mark.parametrize("world_size,layout,model", CASES, ids=[f"{c[1]}-{c[2]}" for c in CASES])
def test_training_matches_one_process(dist_pool, references, world_size, layout, model):
    out = dist_pool(world_size).run(runtime_tasks.train_layout, layout, model=model, timeout=240)
    assert_same_training(out[0], references(model), layout)
    assert all(rank["losses"] == out[0]["losses"] for rank in out), "ranks disagree on the loss"


@pytest.mark.parametrize("args,expected", [
    (["--layout", "cp=2", "--nproc-per-node", "2", "--seq-len", "30"],
     "seq_len=30 is not a multiple of 2·cp = 4"),
    (["--layout", "cp=4", "--nproc-per-node", "4", "--seq-len", "36"],
     "seq_len=36 is not a multiple of 2·cp = 8"),
    (["--layout", "cp=2,pp=2", "--nproc-per-node", "4", "--seq-len", "32"],
     "context parallelism with pipeline parallelism (cp > 1 with pp > 1) is planned but not run yet"),
    (["--layout", "cp=2", "--nproc-per-node", "2", "--seq-len", "32", "--model", "megatron-1.7b"],
     "context-parallel attention has no dropout"),
    (["--layout", "cp=4,cp_impl=ulysses", "--nproc-per-node", "4", "--seq-len", "32"],
     "cp=4 does not divide the n_kv_heads/tp = 2/1 K/V heads of a rank; cp that would: 2"),
    (["--layout", "cp=2,tp=2,cp_impl=ulysses", "--nproc-per-node", "4", "--seq-len", "32"],
     "cp that would: none (or cp_impl=ring)"),
])
def test_bad_cp_input_is_one_clear_line(capsys, args, expected):
    code, _, err = run_inline(capsys, "train", "--global-batch", "8", "--device", "cpu", "--dry-run",
                              *(["--model", "tiny"] if "--model" not in args else []), *args)
    assert code == 2, err
    assert expected in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_cp_layout_passes_the_dry_run(capsys):
    code, out, err = run_inline(capsys, "train", "--model", "tiny", "--layout", "dp=2,cp=2,zero=3",
                                "--global-batch", "8", "--seq-len", "64", "--nproc-per-node", "4",
                                "--device", "cpu", "--dry-run")
    assert code == 0, err
    assert "torchrun" in out


@pytest.mark.parametrize("impl", ["ring", "allgather", "ulysses"])
@pytest.mark.parametrize("cp", [2, 4])
def test_the_planner_prices_the_exchange_the_runtime_makes(dist_pool, impl, cp):
    """plait.plan.context.exchange.exchanges (what cp_exchange prices) names every collective the kernel
    makes in a layer's forward and backward, with its count and bytes (fp32, as a CPU profile
    prices them). PyTorch's own ring (cp_impl=torch) goes through private functional collectives
    and is declared from its source (torch 2.13's _templated_ring_attention), not counted here."""
    import dataclasses
    from collections import Counter

    from plait.plan.context.exchange import exchanges
    from plait.spec.layout import Layout
    from plait.spec.models import get_model

    heads, kv_heads, seq, head_dim, batch = 8, 4, 32, 8, 2  # cp_tasks.exchange_log's defaults
    model = dataclasses.replace(get_model("tiny"), hidden=heads * head_dim, n_heads=heads, n_kv_heads=kv_heads,
                                head_dim=head_dim)
    declared = Counter()
    for exchange in exchanges(model, Layout(cp=cp, cp_impl=impl), tokens=batch * seq / cp, element_bytes=4.0):
        declared[(exchange.phase, exchange.op, int(exchange.nbytes))] += exchange.calls
    for rank, log in enumerate(dist_pool(cp).run(cp_tasks.exchange_log, impl, timeout=60)):
        assert Counter(log) == declared, f"rank {rank}"


@pytest.mark.parametrize("cp", [2, 4])
def test_the_planner_prices_the_score_blocks_the_ring_kernel_makes(dist_pool, cp):
    """cp_impl=ring's attention (plait.plan.kernels.ring_attention_times) is priced on query rows x
    ring_keys score elements, forward and again backward: the elements the kernel materializes."""
    from plait.plan.kernels import ring_keys

    heads, seq, batch = 8, 32, 2  # cp_tasks.ring_score_elements' defaults
    rows = batch * heads * seq // cp
    for rank, counts in enumerate(dist_pool(cp).run(cp_tasks.ring_score_elements, timeout=60)):
        assert counts == {"forward": rows * ring_keys(seq, cp), "backward": rows * ring_keys(seq, cp)}, f"rank {rank}"
