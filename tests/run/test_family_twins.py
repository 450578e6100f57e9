"""Tiny same-family twins of the Hugging Face families whose norms tensor and sequence parallelism
shard (``plait.run.parallel.tensor``) train under tp=2 (with and without sequence parallelism),
cp=2, FSDP × TP, PP × TP and (OLMo-2) compiled tp=2 blocks as one process does (gloo, CPU, fp32;
tests/run/test_runtime_parity.py's bars):

  * Qwen3: q/k norms per head (over head_dim): each tp rank normalizes its own heads with the whole,
    replicated weight, whose gradient is summed over tp.
  * OLMo-2: q/k norms over the whole projection and post norms: the norm weights are sharded like
    the projections' rows and each token's sum of squares is all-reduced over tp; the post norms
    run on the sequence shard (sp).
  * Gemma-2: sandwich norms with the (1 + weight) offset, tied and scaled embeddings, GELU-tanh, and
    its sliding windows, score scale and soft-caps (eager attention) under tp and under cp (the ring).
  * Mistral (a sliding window shorter than the sequence), Qwen2 (q/k/v biases) and GPT-2
    (learned positions, LayerNorm, GELU, biases; dropout off) under tp=2 and cp=2. Phi-3's twin is
    not trained here: as plait reads it, it is the tiny preset itself (Llama: no biases, no q/k
    norm, no window; only ``family`` differs, which the runtime reads only to load HF weights), so
    its tp=2 and cp=2 runs are test_runtime_parity.py's ``tp=2`` and test_context_parallel.py's
    ``cp=2`` (test_phi3_twin_is_the_tiny_model checks that it stays so).

Each twin is read from a config.json of the family sized like the tiny preset (4 layers, hidden
128, 4 heads / 2 KV heads, FFN 384, vocab 512) by the planner's reader, so it has the family's
features as plait reads them; every layout here breaks no runtime rule (``plait train`` runs it).
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import pytest

pytest.importorskip("torch")

import runtime_tasks
import tolerances
from test_runtime_parity import assert_same_training

from plait.spec.capabilities import runtime_violations
from plait.spec.hf_config import model_from_hf_dict
from plait.spec.layout import JobSpec, Layout

SIZES = {"hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 4,
         "intermediate_size": 384, "vocab_size": 512, "max_position_embeddings": 256, "head_dim": 32}
GEMMA2 = {"model_type": "gemma2", **SIZES, "sliding_window": 16, "query_pre_attn_scalar": 16,
          "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0}  # windows shorter than seq 32
EXTRA = {"mistral": {"sliding_window": 16}}  # a window shorter than seq 32 (the ring skips hidden blocks)
GPT2 = {"model_type": "gpt2", "n_embd": 128, "n_head": 4, "n_layer": 4, "n_inner": 384, "vocab_size": 512,
        "n_positions": 256, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}  # no dropout: cp runs


def twin(name: str):
    """The ModelSpec of twin ``name``."""
    if name == "gemma2":
        return dataclasses.replace(model_from_hf_dict(GEMMA2, Path("gemma2.json")), name="tiny-gemma2")
    if name == "gpt2":
        return dataclasses.replace(model_from_hf_dict(GPT2, Path("gpt2.json")), name="tiny-gpt2")
    return dataclasses.replace(model_from_hf_dict({"model_type": name, **SIZES, **EXTRA.get(name, {})},
                                                  Path(f"{name}.json")), name=f"tiny-{name}")


# (twin, layout, reference layout: the one-process run, with the same attention kernel)
# The tp layouts run 2 micro-batches of 4 sequences (mbs=4), not 8 of 1: what they check is how the
# norms shard over tp, the same in every micro-batch, and 2 still accumulate gradients; under gloo on
# CPU a tp micro-batch costs ~50 collectives, so 8 made them ~4x slower (3.3 s -> 0.85 s a run). The
# one-process references keep 8 micro-batches of 1 (test_runtime_parity.py compares across
# micro-batchings the same way: its ZeRO-1 case runs 4).
CASES = [
    ("qwen3", "tp=2,mbs=4", "dp=1"),
    ("qwen3", "tp=2,sp=0,mbs=4", "dp=1"),
    ("qwen3", "cp=2", "dp=1"),
    ("olmo2", "tp=2,mbs=4", "dp=1"),
    ("olmo2", "tp=2,sp=0,mbs=4", "dp=1"),
    ("olmo2", "cp=2", "dp=1"),
    ("gemma2", "tp=2,mbs=4,attn=eager", "attn=eager"),
    ("gemma2", "tp=2,sp=0,mbs=4,attn=eager", "attn=eager"),
    ("gemma2", "cp=2,cp_impl=ring,attn=eager", "attn=eager"),
    # the other dense families: their own features (windows, q/k/v biases, GPT-2's learned positions,
    # LayerNorm, GELU and biases) under tp=2 and cp=2 (Phi-3: see the module docstring)
    ("mistral", "tp=2,mbs=4", "dp=1"),
    ("mistral", "cp=2", "dp=1"),
    ("qwen2", "tp=2,mbs=4", "dp=1"),
    ("qwen2", "cp=2", "dp=1"),
    ("gpt2", "tp=2,mbs=4", "dp=1"),
    ("gpt2", "cp=2", "dp=1"),
]
# four ranks: the norm weights (replicated or sharded over tp) under FSDP, and a pipeline of tp stages
# (2 micro-batches per data-parallel rank, and 4 through the pipeline: see CASES)
CASES_4 = [("olmo2", "dp=2,tp=2,zero=3,mbs=2"), ("olmo2", "pp=2,tp=2,mbs=2")]


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    folder = tmp_path_factory.mktemp("twins")

    @functools.cache
    def write(name: str) -> str:
        path = folder / f"{name}.json"
        path.write_text(twin(name).to_json())
        return str(path)

    return write


@pytest.fixture(scope="module")
def reference(model_file):
    @functools.cache
    def run(name: str, layout: str) -> dict:
        return runtime_tasks.in_one_process(runtime_tasks.train_layout, layout, model=model_file(name))

    return run


def test_twins_have_the_family_features():
    assert (twin("qwen3").qk_norm, twin("qwen3").norm_position) == ("head", "pre")
    assert (twin("olmo2").qk_norm, twin("olmo2").norm_position) == ("full", "post")
    gemma = twin("gemma2")
    assert (gemma.norm_position, gemma.norm_offset, gemma.tied_embeddings) == ("sandwich", True, True)
    assert gemma.sliding_window and gemma.attn_softcap and gemma.logit_softcap and gemma.attn_scale
    assert twin("mistral").sliding_window == 16 and twin("qwen2").qkv_bias
    assert twin("gpt2").learned_positions and not twin("gpt2").dropout


def test_phi3_twin_is_the_tiny_model():
    """Why no Phi-3 run is here: its twin differs from the tiny preset (whose tp=2 and cp=2 runs the
    parity files check) in its name and family label only."""
    from plait.spec.models import get_model

    tiny = get_model("tiny")
    differ = [f.name for f in dataclasses.fields(tiny) if getattr(twin("phi3"), f.name) != getattr(tiny, f.name)]
    assert differ == ["name", "family"]


@pytest.mark.parametrize("name,layout,reference_layout", CASES, ids=[f"{c[0]}:{c[1]}" for c in CASES])
def test_twin_matches_one_process(dist_pool, model_file, reference, name, layout, reference_layout):
    job = JobSpec(global_batch=8, seq_len=32)
    assert runtime_violations(twin(name), Layout.parse(layout), job) == []
    out = dist_pool(2).run(runtime_tasks.train_layout, layout, model=model_file(name), timeout=240)
    assert_same_training(out[0], reference(name, reference_layout), f"{name} {layout}")
    assert all(rank["losses"] == out[0]["losses"] for rank in out), "ranks disagree on the loss"


@pytest.mark.parametrize("name,layout", CASES_4, ids=[f"{c[0]}:{c[1]}" for c in CASES_4])
def test_twin_on_four_ranks_matches_one_process(dist_pool, model_file, reference, name, layout):
    assert runtime_violations(twin(name), Layout.parse(layout), JobSpec(global_batch=8, seq_len=32)) == []
    out = dist_pool(4).run(runtime_tasks.train_layout, layout, model=model_file(name), timeout=240)
    assert_same_training(out[0], reference(name, "dp=1"), f"{name} {layout}")


def test_compiled_olmo2_blocks_under_tp_match_one_process(dist_pool, model_file, reference):
    """Compiled blocks (fullgraph, as on GPU by default; aot_eager here) trace the all-reduced sums of
    squares of the q/k norms (an autograd Function around c10d all_reduce) and keep their values."""
    import compile_tasks

    name = "olmo2"
    out = dist_pool(2).run(compile_tasks.train_compiled, "tp=2,mbs=4", model=model_file(name), compile_backend="aot_eager",
                           timeout=300)
    assert_same_training(out[0], reference(name, "dp=1"), f"{name} tp=2 compiled")


def split_norm_against_rms_norm() -> list[float]:
    """Max abs differences of SplitRMSNorm on one rank against F.rms_norm (autograd) times the
    weight (plain and offset): output, input gradient, weight gradient, for each."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from plait.run.modules.layers import SplitRMSNorm

    generator = torch.Generator().manual_seed(0)
    out = []
    for offset in (False, True):
        x = torch.randn(2, 3, 8, generator=generator, requires_grad=True)
        weight = torch.randn(8, generator=generator, requires_grad=True)
        upstream = torch.randn(2, 3, 8, generator=generator)
        got = SplitRMSNorm.apply(x, weight, 1e-6, offset, 8, dist.group.WORLD)
        want = F.rms_norm(x, (8,), None, 1e-6) * ((1 + weight) if offset else weight)
        grads = torch.autograd.grad(got, (x, weight), upstream)
        want_grads = torch.autograd.grad(want, (x, weight), upstream)
        out += [(got - want).abs().max().item()]
        out += [(a - b).abs().max().item() / b.abs().max().item() for a, b in zip(grads, want_grads)]
    return out


def test_split_norm_backward_equals_autograd_of_the_norm():
    """The hand-written backward (one all-reduce of a dot product per token) on one rank equals
    autograd through F.rms_norm, the (1 + weight) offset included: relative to the largest gradient,
    within the rounding of the widest sum (the weight's, over 6 tokens of 8 terms)."""
    differences = runtime_tasks.in_one_process(split_norm_against_rms_norm)
    assert max(differences) <= 8 * tolerances.reduction_rtol(6 * 8), differences
