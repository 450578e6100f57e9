"""Packed documents in the planner (``JobSpec.doc_len``, ``plait plan --doc-len``): the attention of
a sequence of documents of mean length L is priced as L-length attention where the runtime's
kernel skips the masked pairs (FlexAttention's block mask), and as the whole square where it
passes an explicit mask.

The counts are checked against a brute-force count of the allowed (query, key) pairs of an
explicit mask, and the prices against the same kernel at sequence length L: the FLOPs of a
sequence's attention are 4·tokens·heads·head_dim·(keys per query), so equal keys per query and
equal tokens give equal times, to the last bit.
"""

from __future__ import annotations

import dataclasses

import pytest

from plait.cli import main
from plait.plan.cost import estimate_step
from plait.plan.kernels import document_keys_per_query, kernel_keys_per_query, layer_times
from plait.plan.params import DEFAULT_PARAMS
from plait.plan.search import SearchConstraints, search
from plait.spec.hardware import cluster_for_gpu
from plait.spec.layout import JobSpec, Layout
from plait.spec.models import get_model


def brute_force_keys(seq: int, doc_len: int, window: int) -> float:
    """Allowed (query, key) pairs per query of a sequence cut into documents of doc_len tokens."""
    pairs = 0
    for i in range(seq):
        for j in range(i + 1):
            same = i // doc_len == j // doc_len
            pairs += same and (not window or i - j < window)
    return pairs / seq


@pytest.mark.parametrize("seq,doc_len,window", [(16, 4, 0), (32, 8, 3), (32, 8, 8), (24, 6, 10), (12, 12, 0),
                                                (12, 100, 0), (30, 5, 2)])
def test_keys_per_query_count_the_pairs_of_the_mask(seq, doc_len, window):
    assert document_keys_per_query(doc_len, seq, window) == pytest.approx(brute_force_keys(seq, doc_len, window),
                                                                          rel=1e-12)


def test_a_packed_128k_sequence_of_4k_documents_costs_4k_attention():
    model, gpu = get_model("llama3-8b"), cluster_for_gpu("h100", 8).gpu
    tokens = 131072.0  # one micro-batch: one 128K sequence, or 32 sequences of 4K
    args = (1, 1, False, "flash", "bf16")
    packed = layer_times(model, gpu, DEFAULT_PARAMS, tokens, 131072, *args, doc_len=4096)
    short = layer_times(model, gpu, DEFAULT_PARAMS, tokens, 4096, *args)
    whole = layer_times(model, gpu, DEFAULT_PARAMS, tokens, 131072, *args)
    assert (packed.attn_fwd, packed.attn_bwd) == (short.attn_fwd, short.attn_bwd)
    assert whole.attn_fwd > 20 * packed.attn_fwd  # (131072+1)/2 keys against (4096+1)/2, less the launch overhead
    assert packed.gemm_fwd == whole.gemm_fwd  # the GEMMs do not change


def test_windows_and_documents_combine_per_layer():
    model = dataclasses.replace(get_model("llama3-8b"), sliding_window=1024, local_layers="even")
    local = model.local_layer_count()
    want = (local * document_keys_per_query(4096, 131072, 1024)
            + (model.n_layers - local) * (4096 + 1) / 2) / model.n_layers
    assert kernel_keys_per_query(model, 131072, 4096) == want
    assert document_keys_per_query(4096, 131072, 1024) == (1024 * 1025 / 2 + 3072 * 1024) / 4096


def test_explicit_mask_kernels_price_the_whole_square():
    """Eager attention, a dropout model's SDPA and the all-gather and Ulysses cp kernels take a boolean
    mask: documents save them nothing; plait's ring computes its blocks whole."""
    gpu = cluster_for_gpu("h100", 8).gpu
    model = get_model("llama3-8b")
    for attn, cp, impl in (("eager", 1, "torch"), ("flash", 2, "ring"), ("flash", 2, "allgather")):
        args = (model, gpu, DEFAULT_PARAMS, 8192.0, 16384, 1, cp, False, attn, "bf16", "fused", "torch", impl)
        assert layer_times(*args, doc_len=1024).attn_fwd == layer_times(*args).attn_fwd, (attn, impl)
    ulysses = (1, 2, False, "flash", "bf16", "fused", "torch", "ulysses")
    causal = layer_times(model, gpu, DEFAULT_PARAMS, 8192.0, 16384, *ulysses)
    square = layer_times(model, gpu, DEFAULT_PARAMS, 8192.0, 16384, *ulysses, doc_len=1024)
    assert square.attn_fwd > 1.9 * causal.attn_fwd  # 16384 keys per query against 8192.5
    dropout = dataclasses.replace(model, dropout=True)
    assert layer_times(dropout, gpu, DEFAULT_PARAMS, 8192.0, 16384, 1, 1, False, "flash", "bf16",
                       doc_len=1024).attn_fwd > layer_times(dropout, gpu, DEFAULT_PARAMS, 8192.0, 16384, 1, 1, False,
                                                            "flash", "bf16").attn_fwd


def test_the_step_and_the_search_price_documents():
    model, cluster = get_model("llama3-8b"), cluster_for_gpu("h100", 64)
    layout = Layout(dp=64)
    assert estimate_step(model, cluster, JobSpec(64, 8192, doc_len=1024), layout).step_time < \
        estimate_step(model, cluster, JobSpec(64, 8192), layout).step_time
    cp2 = SearchConstraints(fixed=(("cp", 2),))
    assert any(plan.layout.cp_impl == "torch" for plan in search(model, cluster, JobSpec(64, 8192), cp2).plans)
    result = search(model, cluster, JobSpec(64, 8192, doc_len=1024), cp2, runnable=True)
    assert result.plans and all(plan.layout.cp_impl != "torch" for plan in result.plans)  # it takes no mask


def test_plan_doc_len_flag(capsys, tmp_path):
    from plait.run.data.token_format import TokenWriter

    path = tmp_path / "docs.tok"
    with TokenWriter(path, 512, "test", eos_id=3) as writer:
        writer.append([5, 6, 7, 3] * 50)  # documents of 4 tokens
    base = ["plan", "--model", "tiny", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch", "8", "--seq-len",
            "256", "--json"]
    assert main([*base, "--doc-len", str(path)]) == 0
    capsys.readouterr()
    code = main([*base, "--doc-len", "0"])
    err = capsys.readouterr().err
    assert code == 2 and "--doc-len 0: a document holds at least 1 token" in err and len(err.strip().splitlines()) == 1
