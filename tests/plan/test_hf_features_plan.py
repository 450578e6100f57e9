"""The planner's arithmetic for the Hugging Face model features: saved activations by item, the
logits' soft-capping bytes and the keys the SDPA kernel computes with a sliding-window mask."""

from __future__ import annotations

import dataclasses

import pytest

from plait.plan.activations import layer_items
from plait.plan.kernels import kernel_keys_per_query
from plait.plan.memory import estimate_memory
from plait.spec.hardware import get_cluster
from plait.spec.layout import JobSpec, Layout
from plait.spec.models import get_model

TINY = get_model("tiny")  # hidden 128, 4 heads of 32, 2 KV heads, 4 layers
S, B = 64, 2


def items(model, **layout):
    return layer_items(model, Layout(mbs=B, **layout), S, runtime="torch")


def test_head_dim_widens_q_and_the_attention_output():
    wide = dataclasses.replace(TINY, head_dim=48)  # q 192 wide, K/V 96
    got = items(wide)
    assert got["q"] == 2 * S * B * 192 and got["attn_out"] == 2 * S * B * 192 and got["kv"] == 2 * S * B * 2 * 96


@pytest.mark.parametrize("mode, rstd_rows", [("head", 4 + 2), ("full", 2)])
def test_qk_norm_saves_its_input_and_one_rstd_per_row(mode, rstd_rows):
    got = items(dataclasses.replace(TINY, qk_norm=mode))
    assert got["qk_norm_input"] == 2 * S * B * (128 + 64)  # bf16 Q (128) and K (2 heads of 32)
    assert got["qk_norm_stats"] == 4 * S * B * rstd_rows
    assert items(TINY).keys() == got.keys() - {"qk_norm_input", "qk_norm_stats"}


def test_sandwich_norms_save_two_more_inputs_and_statistics():
    plain, sandwich = items(TINY), items(dataclasses.replace(TINY, norm_position="sandwich"))
    assert sandwich["attn_post_norm_input"] == sandwich["mlp_post_norm_input"] == 2 * S * B * 128
    assert sandwich["norm_stats"] == 2 * plain["norm_stats"]
    assert items(dataclasses.replace(TINY, norm_position="post")) == plain  # same sizes, other tensors


def test_window_mask_is_saved_by_sdpa_in_local_layers_only():
    every = items(dataclasses.replace(TINY, sliding_window=16))
    assert every["attn_window_mask"] == 2 * S * S  # (s, s) additive bf16 mask, per layer
    alternate = items(dataclasses.replace(TINY, sliding_window=16, local_layers="even"))
    assert alternate["attn_window_mask"] == 2 * S * S * 2 / 4  # layers 0 and 2 of 4
    assert "attn_window_mask" not in items(dataclasses.replace(TINY, sliding_window=16), attn="eager")
    assert "attn_window_mask" not in layer_items(dataclasses.replace(TINY, sliding_window=16), Layout(mbs=B), S)


def test_attention_softcap_saves_tanh_output():
    got = items(dataclasses.replace(TINY, attn_softcap=50.0), attn="eager")
    assert got["attn_softcap_tanh"] == 2 * B * 4 * S * S


def test_logit_softcap_adds_two_bytes_per_logit():
    cluster, job, layout = get_cluster("dgx-h100").with_gpus(1), JobSpec(global_batch=2, seq_len=S), Layout(mbs=2)
    plain = estimate_memory(TINY, cluster, job, layout)
    capped = estimate_memory(dataclasses.replace(TINY, logit_softcap=30.0), cluster, job, layout)
    assert capped.logits - plain.logits == 2 * B * S * TINY.vocab  # one bf16 tanh output per logit


def test_sdpa_with_a_window_mask_computes_the_whole_square():
    seq = 1024
    assert kernel_keys_per_query(TINY, seq) == (seq + 1) / 2
    assert kernel_keys_per_query(dataclasses.replace(TINY, sliding_window=128), seq) == seq
    half = dataclasses.replace(TINY, sliding_window=128, local_layers="even")
    assert kernel_keys_per_query(half, seq) == (seq + (seq + 1) / 2) / 2
