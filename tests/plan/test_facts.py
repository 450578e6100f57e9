"""Tests tied to published facts, not to the code itself."""

import math

import pytest

from plait.plan.activations import checkpointed_items, layer_items
from plait.plan.cost import bubble_fraction, estimate_step
from plait.plan.flops import hardware_flops_per_token
from plait.plan.memory import estimate_memory
from plait.spec.hardware import get_cluster
from plait.spec.layout import JobSpec, Layout
from plait.spec.model import ModelSpec
from plait.spec.models import MODELS, get_model

# ------------------------------------------------------------------ parameter counts
PUBLISHED_PARAMS = {
    "llama2-7b": 6_738_415_616,  # Hugging Face meta-llama/Llama-2-7b-hf
    "llama-7b": 6_738_415_616,
    "llama3-8b": 8_030_261_248,  # Hugging Face meta-llama/Meta-Llama-3-8B
    "llama3-405b": 405_853_388_800,  # Hugging Face meta-llama/Llama-3.1-405B
}


@pytest.mark.parametrize("name,count", sorted(PUBLISHED_PARAMS.items()))
def test_parameter_counts_match_published(name, count):
    assert MODELS[name].total_params() == count


@pytest.mark.parametrize("name,billions", [
    ("megatron-1.7b", 1.7), ("megatron-3.6b", 3.6), ("megatron-7.5b", 7.5), ("megatron-18b", 18.4),
    ("megatron-39b", 39.1), ("megatron-76b", 76.1), ("megatron-146b", 145.6), ("megatron-310b", 310.1),
    ("megatron-530b", 529.6), ("megatron-1t", 1008.0),
])
def test_megatron_table1_sizes(name, billions):
    # Narayanan et al. 2021, Table 1, to the printed precision
    assert round(MODELS[name].total_params() / 1e9, 1) == pytest.approx(billions, abs=0.051)


def test_non_embedding_params_of_llama2_7b():
    model = MODELS["llama2-7b"]
    assert model.non_embedding_params() == 32 * (4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096) + 4096
    assert model.total_params() - model.non_embedding_params() == 2 * 32000 * 4096


# ------------------------------------------------------------------------- FLOPs
@pytest.mark.parametrize("name", [n for n in MODELS if n.startswith("megatron")] + ["gpt3-175b"])
def test_megatron_flops_formula_with_full_recompute(name):
    """96·B·s·l·h²·(1 + s/6h + V/16lh), Narayanan et al. 2021 Eq. 3 (full attention square)."""
    model = MODELS[name]
    s, l, h, v = 2048, model.n_layers, model.hidden, model.vocab
    batch = 8
    expected = 96 * batch * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
    ours = batch * s * hardware_flops_per_token(model, Layout(ckpt="full"), s, causal=False)
    assert ours == pytest.approx(expected, rel=1e-12)


def test_causal_attention_counts_the_lower_triangle():
    model = MODELS["llama3-8b"]
    s = 8192
    full = model.attention_flops_per_token(s, causal=False)
    causal = model.attention_flops_per_token(s, causal=True)
    assert causal / full == pytest.approx((s + 1) / (2 * s))
    # 6N + 12·l·h·s (torchtitan's non-causal count) with N = matmul weights incl. the LM head
    assert model.model_flops_per_token(s, causal=False) == pytest.approx(
        6 * model.matmul_params() + 12 * model.n_layers * model.hidden * s)


def test_hardware_flops_add_recompute():
    model, s = MODELS["llama2-13b"], 4096
    none = hardware_flops_per_token(model, Layout(), s)
    full = hardware_flops_per_token(model, Layout(ckpt="full"), s)
    selective = hardware_flops_per_token(model, Layout(ckpt="selective"), s)
    forward_layers = 2 * model.n_layers * model.layer_matmul_params() + model.attention_flops_per_token(s)
    assert none == model.model_flops_per_token(s)
    assert full - none == pytest.approx(forward_layers)
    assert selective - none == pytest.approx(model.attention_flops_per_token(s))


# --------------------------------------------------------------- pipeline bubble
@pytest.mark.parametrize("p,m", [(2, 8), (4, 16), (8, 32), (16, 64), (8, 8)])
def test_bubble_fractions_match_narayanan(p, m):
    assert bubble_fraction("gpipe", p, m) == pytest.approx((p - 1) / m)
    assert bubble_fraction("1f1b", p, m) == pytest.approx((p - 1) / m)
    for v in (2, 4):
        assert bubble_fraction("interleaved-1f1b", p, m, v) == pytest.approx((p - 1) / (v * m))
    assert bubble_fraction("1f1b", 1, m) == 0.0


def test_step_bubble_follows_the_fraction():
    """With the schedule as the only change, the bubble item scales as (p-1)/(v·m)."""
    model, cluster, job = MODELS["megatron-39b"], get_cluster("dgx-a100", 64), JobSpec(512, 2048)
    base = Layout(dp=8, tp=8, pp=1, mbs=1)
    one = estimate_step(model, cluster, job, Layout(dp=4, tp=8, pp=2, mbs=1))
    inter = estimate_step(model, cluster, job, Layout(dp=4, tp=8, pp=2, vpp=2, mbs=1, schedule="interleaved-1f1b"))
    assert estimate_step(model, cluster, job, base).bubble == 0.0
    assert inter.bubble == pytest.approx(one.bubble / 2, rel=0.05)  # v=2 halves it (p2p aside)


# ------------------------------------------------------ activation memory (Korthikanti)
GPT_DROPOUT = ModelSpec(name="gpt-22b", arch="gpt", n_layers=48, hidden=6144, ffn_hidden=4 * 6144,
                        n_heads=64, n_kv_heads=64, vocab=51200, max_seq_len=2048, tied_embeddings=True,
                        dropout=True)
PAPER_OMITS = {"norm_stats"}  # per-token LayerNorm mean/rstd (8 bytes per token), not in the paper


def _paper_bytes(layout: Layout, policy: str = "none", s: int = 2048) -> float:
    items = checkpointed_items(layer_items(GPT_DROPOUT, layout, s), policy)
    return sum(v for k, v in items.items() if k not in PAPER_OMITS)


@pytest.mark.parametrize("b", [1, 4])
def test_korthikanti_no_parallelism(b):
    s, h, a = 2048, GPT_DROPOUT.hidden, GPT_DROPOUT.n_heads
    layout = Layout(mbs=b, attn="eager")
    assert _paper_bytes(layout, s=s) == pytest.approx(s * b * h * (34 + 5 * a * s / h), rel=1e-12)


@pytest.mark.parametrize("t", [2, 4, 8])
def test_korthikanti_tensor_parallel(t):
    s, b, h, a = 2048, 1, GPT_DROPOUT.hidden, GPT_DROPOUT.n_heads
    no_sp = Layout(tp=t, sp=False, attn="eager")
    with_sp = Layout(tp=t, sp=True, attn="eager")
    assert _paper_bytes(no_sp) == pytest.approx(s * b * h * (10 + 24 / t + 5 * a * s / (h * t)), rel=1e-12)
    assert _paper_bytes(with_sp) == pytest.approx(s * b * h / t * (34 + 5 * a * s / h), rel=1e-12)
    # selective recomputation drops the 5as/h term; full keeps the layer input only
    assert _paper_bytes(with_sp, "selective") == pytest.approx(s * b * h / t * 34, rel=1e-12)
    assert _paper_bytes(with_sp, "full") == pytest.approx(2 * s * b * h / t, rel=1e-12)


def test_korthikanti_table2_totals_for_530b():
    """Table 2 of Korthikanti et al.: TP+SP with selective recompute = 34·sbhL/t per micro-batch."""
    model = MODELS["megatron-530b"]
    s, b, h, t, L = 2048, 1, model.hidden, 8, model.n_layers
    layout = Layout(tp=t, attn="eager", ckpt="selective")
    items = checkpointed_items(layer_items(model, layout, s), "selective")
    per_layer = sum(v for k, v in items.items() if k not in PAPER_OMITS)
    assert per_layer * L == pytest.approx(34 * s * b * h * L / t, rel=1e-12)


def test_flash_attention_has_no_quadratic_term():
    model = MODELS["llama3-8b"]
    short = sum(layer_items(model, Layout(), 4096).values())
    long = sum(layer_items(model, Layout(), 8192).values())
    assert long == pytest.approx(2 * short)  # linear in s


# --------------------------------------------------------------- model states (ZeRO)
def test_model_states_are_16_bytes_per_parameter():
    model, cluster, job = MODELS["llama2-7b"], get_cluster("dgx-a100", 8), JobSpec(8, 2048)
    memory = estimate_memory(model, cluster, job, Layout(dp=8))
    assert memory.model_states == pytest.approx(16 * model.total_params(), rel=1e-6)
    zero1 = estimate_memory(model, cluster, job, Layout(dp=8, zero=1))
    assert zero1.optimizer == pytest.approx(12 * model.total_params() / 8, rel=1e-6)
    zero3 = estimate_memory(model, cluster, job, Layout(dp=8, zero=3))
    assert zero3.model_states == pytest.approx(16 * model.total_params() / 8, rel=1e-6)


def test_one_mfu_definition():
    """MFU = model FLOPs per token × tokens/s/GPU / dense bf16 peak; never above 1."""
    model, cluster, job = get_model("llama3-8b"), get_cluster("dgx-h100", 8), JobSpec(64, 8192)
    step = estimate_step(model, cluster, job, Layout(dp=8, zero=3, ckpt="full"))
    assert step.mfu == pytest.approx(model.model_flops_per_token(8192) * step.tokens_per_s_per_gpu / 989e12)
    assert 0 < step.mfu < step.hfu < 1
    assert math.isclose(step.tokens_per_s_per_gpu * step.step_time * 8, 64 * 8192)
