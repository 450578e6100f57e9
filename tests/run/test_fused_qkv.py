"""``plait train --fused-qkv`` (RuntimeConfig.qkv = "fused"): Q, K and V in one GEMM over the three
weights concatenated, the parameters (and so the checkpoint keys) still wq / wk / wv.

* the fused projection gives the outputs and gradients of the three separate ones;
* training with it matches the single-process run with separate projections (tolerances of
  tests/run/test_runtime_parity.py: the same sums, possibly in another order);
* a checkpoint saved with fused Q/K/V resumes with separate ones and vice versa, and the
  resumed run matches the uninterrupted one;
* with tensor parallelism each rank fuses its own column shards ([q_local; k_local; v_local]).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import checkpoint_tasks
import lean_tasks
import runtime_tasks
from test_checkpoint import STEPS, assert_close_run
from test_runtime_parity import assert_same_training

from plait.run.checkpoint import store
from plait.run.config import RuntimeConfig
from plait.run.model import Attention, qkv_projection
from plait.spec.models import get_model


@pytest.mark.parametrize("model", ["tiny", "tiny-gpt"])  # GQA without biases; MHA with biases
def test_fused_projection_equals_the_separate_ones(model):
    torch.manual_seed(0)
    attention = Attention(get_model(model))
    x = torch.randn(2, 8, attention.wq.in_features, requires_grad=True)
    separate = (attention.wq(x), attention.wk(x), attention.wv(x))
    fused = qkv_projection(x, attention.wq, attention.wk, attention.wv)
    assert [t.shape for t in fused] == [t.shape for t in separate]
    for got, want in zip(fused, separate):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    weights = [x, *(p for m in (attention.wq, attention.wk, attention.wv) for p in m.parameters())]
    upstream = [torch.randn_like(t) for t in separate]
    want = torch.autograd.grad(separate, weights, upstream)
    got = torch.autograd.grad(fused, weights, upstream)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


# Each case is a way the fused weights reach the GEMM: FSDP's gathered shards, a pipeline stage's
# blocks, each tp rank's column shards of GQA (tiny) and of MHA with biases (tiny-gpt), and FSDP x TP.
# Not here, because they add no other way: tiny-gpt under DDP (the module is the one-process one:
# test_fused_projection_equals_the_separate_ones[tiny-gpt] checks its fusion) and tp=2 without sp (the
# projection's input is the whole sequence with or without sp; the fusion of the shards is the same).
# The tp cases run fewer, larger micro-batches (mbs; 2 per data-parallel rank): the fusion is the same in
# every micro-batch, and a tp micro-batch is ~50 gloo collectives (4x the run's time with 8 of 1).
CASES = [(2, "tiny", "dp=2,zero=3"), (2, "tiny", "pp=2"), (2, "tiny", "tp=2,mbs=4"), (2, "tiny-gpt", "tp=2,mbs=4"),
         (4, "tiny", "dp=2,tp=2,zero=3,mbs=2")]


@pytest.mark.parametrize("world,model,layout", CASES, ids=[f"{c[1]}-{c[2]}" for c in CASES])
def test_fused_qkv_trains_like_one_process_with_separate_projections(dist_pool, references, world, model, layout):
    out = dist_pool(world).run(runtime_tasks.train_layout, layout, model=model, qkv="fused", timeout=240)
    assert_same_training(out[0], references(model), layout)


def test_the_fused_projection_runs_in_every_block(dist_pool):
    # 4 blocks, 8 sequences in 8 micro-batches of 1 per rank at dp=1: forward of each block per micro-batch
    calls = dist_pool(2).run(lean_tasks.count_fused_projections, "tp=2,mbs=1")
    assert calls == [4 * 8, 4 * 8]


@pytest.mark.parametrize("saved,resumed", [("fused", "separate"), ("separate", "fused")])
def test_checkpoints_resume_across_the_choice(dist_pool, tmp_path, saved, resumed):
    layout = "dp=2,zero=3"
    pool = dist_pool(2)
    full = pool.run(checkpoint_tasks.train, layout, steps=STEPS, qkv=resumed)[0]
    pool.run(checkpoint_tasks.train, layout, stop_after=2, steps=STEPS, with_params=False,
             checkpoint_dir=str(tmp_path), qkv=saved)
    checkpoint = store.verify(tmp_path / store.final_name(2))
    again = pool.run(checkpoint_tasks.train, layout, steps=STEPS, resume_from=str(checkpoint.path), qkv=resumed)[0]
    assert_close_run(again, full, 2, exact=False)
    assert not any("wqkv" in name for name in again["params"])


def test_fused_qkv_and_gc_flags_reach_the_runtime_config():
    from plait.cli import build_parser
    from plait.cli.train import _request
    from plait.run.launcher.resolve import launch_options, run_config

    args = build_parser().parse_args(["train", "--model", "tiny", "--layout", "dp=1", "--global-batch", "2",
                                      "--seq-len", "16", "--fused-qkv", "--gc-every", "7", "--device", "cpu"])
    request = _request(args)
    config = run_config(request, launch_options(request, 1))
    assert config.runtime.qkv == "fused" and config.runtime.gc_every == 7
    request = _request(build_parser().parse_args(["train", "--model", "tiny", "--global-batch", "2",
                                                  "--seq-len", "16"]))
    config = run_config(request, launch_options(request, 1))
    assert config.runtime.qkv == "separate" and config.runtime.gc_every == RuntimeConfig.gc_every
