"""Memory truth: the bytes one runtime layer saves for its backward, measured, against the planner.

For each checkpoint policy (none, selective, balanced, mlp, full), attention kernel (SDPA "flash" and "sdpa",
eager), norm kernel (fused, unfused: the eager fp32 op chain, the same on CPU and GPU) and
tensor-parallel layout (tp=1; tp=2 with and without sequence parallelism, on two gloo ranks, q/k
norms per head and over the whole projection included; DeepSeek-V3's multi-head latent attention with
and without a query rank; OLMo-2's post norms and Gemma-2's sandwich norms at tp=1; a whole MoE layer
under ``mlp`` and ``full``),
``tests/support/activation_count.py`` builds one bf16 layer of the runtime's model on the CPU and counts,
for one micro-batch, the distinct storages that autograd saves (``saved_tensors_hooks``; DTensors
by their local shard; parameters and the RoPE tables excluded) and, independently, the storages
still alive after the forward. The two must agree, and must equal the planner's
``plait.plan.activations`` items for the same configuration (``runtime="torch"``), byte for byte,
after the CPU kernels' documented differences (``cpu_kernel_deltas``; the module docstring of
``plait.plan.activations`` explains each).

``balanced`` keeps its GEMM outputs in the selective checkpoint's cache, not in saved-tensor
slots: ``activation_count`` observes them through the policy (``MUST_SAVE`` outputs) and the
liveness count confirms them. Not measured: SDPA with dropout without recomputation or under
``balanced`` (no fused CPU kernel: the fp32 math fallback runs, unlike the GPU's flash kernel).
"""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

from activation_count import QKV, classify, measure_layer, measure_layers

from plait.plan.activations import kept_items
from plait.spec.layout import Layout
from plait.spec.models import get_model

SEQ, MBS = 64, 2  # seq_len must differ from head_dim (32): s×s tensors are told from Q/K/V by size
LLAMA = get_model("tiny")  # hidden 128, 4 heads, 2 KV heads (GQA), SwiGLU 384, RMSNorm, RoPE
GPT = dataclasses.replace(get_model("tiny-gpt"), dropout=True)  # hidden 128, 4 heads, GELU 512, LayerNorm
GPT_NO_DROPOUT = get_model("tiny-gpt")
# Qwen3 / Qwen2 / Mistral features: head_dim 48 (Q 192 wide, hidden 128), per-head q/k RMSNorm, QKV
# biases, a sliding window of 16 keys (SEQ 64: the mask matters)
HF_FEATURES = dataclasses.replace(LLAMA, name="tiny-hf", head_dim=48, qk_norm="head", qkv_bias=True,
                                  sliding_window=16)
QK_FULL = dataclasses.replace(LLAMA, name="tiny-qk-full", qk_norm="full")  # OLMo-2's q/k norms (whole projection)
POST = dataclasses.replace(LLAMA, name="tiny-post", norm_position="post")  # OLMo-2: norms after each sub-block
SANDWICH = dataclasses.replace(LLAMA, name="tiny-sandwich", norm_position="sandwich")  # Gemma-2: four norms
# DeepSeek-V3's multi-head latent attention (tiny-dsv3's: query rank 64, KV rank 32, d_nope 32, d_rope 16,
# d_v 32) over a dense MLP (the MoE block has its own test, test_moe_memory_truth.py); without a query
# rank; and with V as wide as Q and K (d_nope 16 + d_rope 16 = d_v 32), so that the CPU's fused SDPA
# kernel runs (it takes one head width: other widths fall back to its fp32 math path, unlike a GPU's)
MLA = dataclasses.replace(get_model("tiny-dsv3"), name="tiny-mla", moe=None)
MLA_NO_Q = dataclasses.replace(MLA, name="tiny-mla-no-q", mla=dataclasses.replace(MLA.mla, q_lora_rank=0))
MLA_EVEN = dataclasses.replace(MLA, name="tiny-mla-even", mla=dataclasses.replace(MLA.mla, qk_nope_head_dim=16))
POLICIES = ("none", "selective", "balanced", "mlp", "full")
ATTN = ("flash", "eager")
DROPOUT_MASKS = ("attn_resid_dropout_mask", "mlp_dropout_mask", "attn_dropout_mask")


def measurable(spec, attn: str, policy: str) -> bool:
    """SDPA with dropout runs the CPU math fallback, not a fused kernel (whose outputs balanced keeps);
    under recomputation its tensors are not kept."""
    return not (spec.dropout and attn == "flash" and policy in ("none", "balanced", "mlp"))


def cases(specs, tp: int, sp: bool, attns=ATTN, norm: str = "fused") -> list[tuple]:
    return [(spec, Layout(tp=tp, sp=sp, mbs=MBS, ckpt=policy, attn=attn, norm=norm), SEQ, MBS)
            for spec in specs for policy in POLICIES for attn in attns if measurable(spec, attn, policy)]


def mla_cases(tp: int, sp: bool) -> list[tuple]:
    return cases([MLA, MLA_NO_Q], tp, sp, attns=("eager",)) + cases([MLA_EVEN], tp, sp, attns=("flash",))


def case_id(case) -> str:
    spec, layout = case[0], case[1]
    name = spec.name + ("+dropout" if spec.dropout else "")
    tp = f"-tp{layout.tp}{'-sp' if layout.sequence_parallel else ''}" if layout.tp > 1 else ""
    norm = "-unfused-norm" if layout.norm == "unfused" else ""
    return f"{name}-{layout.ckpt}-{layout.attn}{norm}{tp}"


def planner_items(spec, layout: Layout, runtime: str) -> dict[str, float]:
    return kept_items(spec, layout, SEQ, mbs=MBS, runtime=runtime)


def cpu_kernel_deltas(spec, items: dict[str, float], layout: Layout | None = None) -> dict[str, float]:
    """Bytes the CPU kernels save beyond the GPU runtime, by item (negative: fewer).

    * RMSNorm (llama): the composite CPU ``rms_norm`` saves its fp32 input and fp32 normalized
      output (8 bytes per element, item ``cpu_rmsnorm_fp32``) instead of the bf16 input (2).
      Under ``full`` the only norm input kept is the checkpoint's input (bf16, unchanged); under ``mlp``
      the MLP half's (``mlp_norm_input``), while the attention norm runs the composite. Q/k norms
      over the whole projection under tp > 1 run ``SplitRMSNorm`` instead, which saves what the
      GPU kernel saves.
    * LayerNorm (gpt): mean and rstd in bf16 on the CPU: half of ``norm_stats``.
    * dropout: a mask in the input dtype (bf16, 2 bytes) instead of CUDA's bool (1 byte).
    * MLA's latent norms: the composite saves fp32 copies of the latent (8 bytes per element, as
      above) instead of the bf16 latent a fused kernel keeps (r_q, and the KV down-projection's whole
      output r_kv + d_rope, of which the latent is a view).
    """
    deltas: dict[str, float] = {}
    norms_run = "norm_stats" in items  # false under full recomputation
    if "attn_norm_fp32_input" in items:  # norm=unfused: the same op chain on every device
        norms_run = False
    if spec.arch == "llama" and norms_run:
        for item in ("attn_norm_input", "mlp_norm_input", "attn_post_norm_input", "mlp_post_norm_input"):
            if item not in items or (item == "mlp_norm_input" and layout is not None and layout.ckpt == "mlp"):
                continue  # post norms: sandwich only; ckpt=mlp: the checkpoint's bf16 input
            deltas[item] = -items[item]
            deltas["cpu_rmsnorm_fp32"] = deltas.get("cpu_rmsnorm_fp32", 0.0) + 4 * items[item]
    split_qk_norm = spec.qk_norm == "full" and layout is not None and layout.tp > 1
    if "qk_norm_input" in items and not split_qk_norm:  # the q/k RMSNorms run the same composite CPU kernel
        deltas["qk_norm_input"] = -items["qk_norm_input"]
        deltas["cpu_rmsnorm_fp32"] = deltas.get("cpu_rmsnorm_fp32", 0.0) + 4 * items["qk_norm_input"]
    if spec.arch == "gpt" and norms_run:
        deltas["norm_stats"] = -items["norm_stats"] / 2
    for item in DROPOUT_MASKS:
        if item in items:
            deltas[item] = items[item]
    if "mla_norm_stats" in items:  # the latent norms ran
        mla, tokens = spec.mla, SEQ * MBS
        deltas["mla_latents"] = -2 * tokens * (mla.q_lora_rank + mla.kv_lora_rank + mla.qk_rope_head_dim)
        deltas["cpu_rmsnorm_fp32"] = deltas.get("cpu_rmsnorm_fp32", 0.0) + 8 * tokens * (mla.q_lora_rank
                                                                                          + mla.kv_lora_rank)
    return deltas


def merge_qkv(items: dict[str, float]) -> dict[str, float]:
    """q, kv and attn_kv_repeat as one item (the measurement cannot tell them apart for MHA)."""
    out = {k: v for k, v in items.items() if k not in ("q", "kv", "attn_kv_repeat")}
    out[QKV] = sum(items.get(k, 0.0) for k in ("q", "kv", "attn_kv_repeat"))
    return {k: v for k, v in out.items() if v}


def comparison(spec, layout: Layout, result: dict) -> tuple[dict, dict, str]:
    """(expected items, measured items, a per-item table of both for the failure message)."""
    megatron = merge_qkv(planner_items(spec, layout, "megatron"))
    torch_items = planner_items(spec, layout, "torch")
    deltas = merge_qkv(cpu_kernel_deltas(spec, torch_items, layout))
    torch_items = merge_qkv(torch_items)
    expected = {k: torch_items.get(k, 0.0) + deltas.get(k, 0.0) for k in {*torch_items, *deltas}}
    expected = {k: v for k, v in expected.items() if v}
    measured = classify(result["records"], spec, layout, SEQ, MBS)
    rows = [f"{'item':26} {'megatron':>9} {'torch':>9} {'cpu delta':>9} {'expected':>9} {'measured':>9}"]
    for item in sorted({*megatron, *torch_items, *deltas, *measured}):
        values = [megatron.get(item, 0), torch_items.get(item, 0), deltas.get(item, 0),
                  expected.get(item, 0), measured.get(item, 0)]
        flag = "" if values[3] == values[4] else "   <-- differs"
        rows.append(f"{item:26} " + " ".join(f"{v:9.0f}" for v in values) + flag)
    totals = [sum(megatron.values()), sum(torch_items.values()), sum(deltas.values()),
              sum(expected.values()), sum(measured.values())]
    rows.append(f"{'TOTAL':26} " + " ".join(f"{v:9.0f}" for v in totals))
    rows.append(f"saved-tensor hooks: {result['saved']} B; alive after forward: {result['live']} B "
                f"(only alive: {result['live_not_saved']}, only saved: {result['saved_not_live']})")
    rows.append("saved tensors (module, grad_fn, local shape, dtype, storage bytes, kind):")
    rows += [f"  {r.module or '<block>':18} {r.grad_fn or '-':44} {r.shape!s:18} {r.dtype:9} {r.nbytes:8} {r.kind}"
             for r in result["records"]]
    return expected, measured, "\n".join(rows)


def check(spec, layout: Layout, result: dict) -> None:
    expected, measured, table = comparison(spec, layout, result)
    label = case_id((spec, layout))
    # Every saved tensor must be alive. With tensor parallelism the gloo collectives may still hold
    # a communication buffer when the forward returns (freed when the work object is collected),
    # so there "alive" may exceed "saved" by such buffers; on one rank the two must be equal.
    assert not result["saved_not_live"], f"{label}: saved tensors that are not alive\n{table}"
    if layout.tp == 1:
        assert result["saved"] == result["live"], f"{label}: hooks and liveness disagree\n{table}"
    assert result["saved"] == sum(measured.values()), f"{label}: classification lost bytes\n{table}"
    assert measured == expected, f"{label}: measured != planner + CPU deltas\n{table}"


# ------------------------------------------------------------------ one rank (tp=1)
SINGLE = (cases([LLAMA, GPT, GPT_NO_DROPOUT], tp=1, sp=False)
          + cases([LLAMA, GPT_NO_DROPOUT], tp=1, sp=False, attns=("flash", "sdpa"), norm="unfused")
          + cases([LLAMA], tp=1, sp=False, attns=("sdpa",))
          + cases([HF_FEATURES], tp=1, sp=False)
          + cases([POST, SANDWICH], tp=1, sp=False)
          + mla_cases(tp=1, sp=False))


@pytest.mark.parametrize("case", SINGLE, ids=[case_id(c) for c in SINGLE])
def test_saved_bytes_match_planner(case):
    check(case[0], case[1], measure_layer(*case))


# a whole MoE layer (tiny-moe's, every layer MoE; the block's own items: test_moe_memory_truth.py) under
# the policies that recompute its MoE block: what stays is the attention half and the block's input
MOE_LAYER = dataclasses.replace(get_model("tiny-moe"), name="tiny-moe-layer",
                                moe=dataclasses.replace(get_model("tiny-moe").moe, first_dense=0))
MOE_CASES = [c for c in cases([MOE_LAYER], tp=1, sp=False, attns=("flash",)) if c[1].ckpt in ("mlp", "full")]


@pytest.mark.parametrize("case", MOE_CASES, ids=[case_id(c) for c in MOE_CASES])
def test_moe_layer_saved_bytes_match_planner(case):
    check(case[0], case[1], measure_layer(*case))


# ------------------------------------------------------------------ tensor parallel (tp=2, gloo)
PARALLEL = (cases([LLAMA, GPT], tp=2, sp=False) + cases([LLAMA, GPT], tp=2, sp=True)
            + cases([LLAMA], tp=2, sp=True, attns=("flash",), norm="unfused")
            + cases([HF_FEATURES, QK_FULL], tp=2, sp=True, attns=("flash",))  # q/k norms per head, whole
            + cases([QK_FULL], tp=2, sp=False, attns=("flash",))
            + mla_cases(tp=2, sp=False) + mla_cases(tp=2, sp=True)
            + [c for c in cases([MOE_LAYER], tp=2, sp=True, attns=("flash",)) if c[1].ckpt == "mlp"])


@pytest.fixture(scope="module")
def parallel_results(dist_pool):
    """Every tp=2 case measured on both ranks in one round trip: {case_id: [rank0, rank1]}."""
    per_rank = dist_pool(2).run(measure_layers, PARALLEL, timeout=120)
    return {case_id(c): [ranks[i] for ranks in per_rank] for i, c in enumerate(PARALLEL)}


@pytest.mark.parametrize("case", PARALLEL, ids=[case_id(c) for c in PARALLEL])
def test_saved_bytes_per_rank_match_planner(case, parallel_results):
    for result in parallel_results[case_id(case)]:  # both ranks hold equal shards
        check(case[0], case[1], result)


def test_sequence_parallel_saves_the_gathered_gemm_input():
    """DTensor SP keeps the all-gathered norm output; Megatron keeps the shard and gathers it again."""
    s, b, h, t = SEQ, MBS, LLAMA.hidden, 2
    for policy in ("none", "selective"):
        layout = Layout(tp=t, sp=True, mbs=b, ckpt=policy)
        megatron = sum(planner_items(LLAMA, layout, "megatron").values())
        runtime = sum(planner_items(LLAMA, layout, "torch").values())
        assert runtime - megatron == 2 * 2 * s * b * h * (1 - 1 / t)  # two GEMM inputs, bf16
    full = Layout(tp=t, sp=True, mbs=b, ckpt="full")
    assert planner_items(LLAMA, full, "torch") == planner_items(LLAMA, full, "megatron")
