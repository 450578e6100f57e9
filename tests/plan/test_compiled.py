"""torch.compile in the planner: a compiled block's element-wise work counted from the model's shapes,
who compiles (plait's runtime under auto, torchtitan where a row says so), and what the plan says.

Expected counts are assembled here from the regions of ``plait.plan.compiled``'s table (norm, residual
add, RoPE, activation; forward and backward), never read back from the function under test."""

from __future__ import annotations

import dataclasses
import json

import pytest

from plait.cli import main
from plait.errors import PlaitError
from plait.plan.compiled import compiled_counts, compiled_elementwise, compiled_share, with_compile
from plait.plan.cost import estimate_step
from plait.plan.kernels import layer_times
from plait.plan.params import DEFAULT_PARAMS, params_for_stack
from plait.spec.capabilities import compile_enabled
from plait.spec.hardware import CLUSTERS
from plait.spec.layout import JobSpec, Layout
from plait.spec.models import MODELS
from plait.spec.stack import get_stack

LLAMA = MODELS["llama3-8b"]
GPT = MODELS["gpt-125m"]
H100 = CLUSTERS["dgx-h100"]
PLAIT = with_compile(DEFAULT_PARAMS, get_stack("plait"), None, "cuda")  # plait train's auto on a GPU
EAGER = dataclasses.replace(PLAIT, compiled_blocks=0.0)


def _elements(model, fwd_norm_regions, fwd_rope, fwd_act, bwd_norms, bwd_sums, bwd_rope, bwd_act):
    h, heads, f = model.hidden, model.q_hidden + model.kv_hidden, model.ffn_hidden
    return (fwd_norm_regions * h + fwd_rope * heads + fwd_act * f) / h, \
        (bwd_norms * h + bwd_sums * h + bwd_rope * heads + bwd_act * f) / h


def test_a_llama_block_compiled_is_counted_from_its_shapes():
    norm1, add_norm2, add = 2, 4, 3  # x -> xn; x, o -> sum, its norm; sum, mlp -> out
    rope = 2  # read q and k, write them rotated
    swiglu_fwd, swiglu_bwd = 3, 5  # gate, up -> product; grad, gate, up -> both gradients
    norm_bwd = 3 + 2  # input, output grad -> input grad; the weight gradient re-reads both
    expected = _elements(LLAMA, norm1 + add_norm2 + add, rope, swiglu_fwd, 2 * norm_bwd, 2, rope, swiglu_bwd)
    assert compiled_counts(LLAMA).passes(LLAMA) == pytest.approx(expected, rel=1e-12)
    # Llama 3 8B: q = h, kv = h/4, f = 3.5h
    assert expected == pytest.approx((9 + 2 * 1.25 + 3 * 3.5, 12 + 2 * 1.25 + 5 * 3.5), rel=1e-12)


def test_a_gpt_block_compiled_is_counted_from_its_shapes():
    assert GPT.arch == "gpt" and not GPT.gated and GPT.learned_positions
    gelu_fwd, gelu_bwd = 2, 3  # read, write; grad and input -> grad
    expected = _elements(GPT, 2 + 4 + 3, 0, gelu_fwd, 2 * 5, 2, 0, gelu_bwd)  # no RoPE in the block
    assert compiled_counts(GPT).passes(GPT) == pytest.approx(expected, rel=1e-12)


def test_compiled_seconds_are_the_counted_bytes_over_the_bandwidth():
    gpu, tokens, tp = H100.gpu, 8192.0, 2
    counts = compiled_counts(LLAMA)
    fwd, bwd, _ = compiled_elementwise(LLAMA, gpu, tokens, tp, tp, tokens * LLAMA.ffn_hidden / tp)
    bytes_fwd = gpu.element_bytes * tokens * (counts.fwd_model * LLAMA.hidden + counts.fwd_heads
                                              * (LLAMA.q_hidden + LLAMA.kv_hidden) + counts.fwd_act * LLAMA.ffn_hidden) / tp
    bandwidth = gpu.hbm_bandwidth * gpu.memory_efficiency
    assert fwd == pytest.approx(bytes_fwd / bandwidth + counts.fwd_regions * gpu.kernel_overhead, rel=1e-12)
    assert bwd > fwd  # the backward reads more than it writes back: 12h + ... against 9h + ...


@pytest.mark.parametrize("model", [LLAMA, GPT], ids=["llama", "gpt"])
def test_compiled_is_faster_than_eager_for_the_same_layout(model):
    job, lay = JobSpec(global_batch=16, seq_len=2048), Layout(dp=8, zero=3, mbs=2)
    compiled, eager = (estimate_step(model, H100, job, lay, p) for p in (PLAIT, EAGER))
    assert compiled.elementwise < eager.elementwise and compiled.step_time < eager.step_time
    times = layer_times(model, H100.gpu, PLAIT, 4096.0, 2048, 1, 1, False, "flash", "bf16", compiled=1.0)
    assert times.elementwise_bwd == pytest.approx(compiled_elementwise(model, H100.gpu, 4096.0, 1, 1,
                                                                       4096.0 * model.ffn_hidden)[1], rel=1e-12)


@pytest.mark.parametrize("text", ["dp=4,cp=2", "dp=8,ckpt=full,offload=0.5", "dp=4,tp=2,ckpt=selective"])
def test_a_layout_that_breaks_a_compile_rule_is_priced_eager_under_auto(text):
    lay, job = Layout.parse(text), JobSpec(global_batch=16, seq_len=2048)
    assert not compile_enabled(None, "cuda", lay)
    assert compiled_share(PLAIT, LLAMA, lay) == 0.0 and compiled_share(PLAIT, LLAMA, Layout(dp=8)) == 1.0
    assert estimate_step(LLAMA, H100, job, lay, PLAIT) == estimate_step(LLAMA, H100, job, lay, EAGER)


def test_a_cpu_cluster_is_eager_under_auto_and_the_setting_wins_elsewhere():
    stack = get_stack("plait")
    assert (PLAIT.compiled_blocks, PLAIT.compile_rules) == (1.0, 1.0)
    assert with_compile(PLAIT, stack, None, "cpu").compiled_blocks == 0.0
    assert with_compile(PLAIT, stack, None, "cuda").compiled_blocks == 1.0
    assert with_compile(PLAIT, stack, False, "cuda").compiled_blocks == 0.0
    assert with_compile(EAGER, stack, True, "cpu").compiled_blocks == 1.0
    with pytest.raises(PlaitError, match="megatron-core stack runs no torch.compile"):
        with_compile(DEFAULT_PARAMS, get_stack("megatron-core"), True, "cuda")
    torchtitan = params_for_stack(get_stack("torchtitan"))
    assert with_compile(torchtitan, get_stack("torchtitan"), None, "cuda").compiled_blocks == 0.0  # its default


def _plan_json(capsys, *flags):
    main(["plan", "--model", "llama3-8b", "--gpus", "8", "--global-batch", "16", "--seq-len", "2048", "--json",
          *flags])
    return json.loads(capsys.readouterr().out)[0]


def test_the_plan_says_whether_it_was_priced_compiled(tmp_path, capsys):
    given = ("--layout", "dp=8,mbs=2,zero=3")
    assert _plan_json(capsys, *given)["prediction"]["compiled_blocks"] == 1.0  # auto on a GPU cluster
    assert _plan_json(capsys, *given, "--no-compile")["prediction"]["compiled_blocks"] == 0.0
    assert _plan_json(capsys, "--layout", "dp=4,cp=2,mbs=2")["prediction"]["compiled_blocks"] == 0.0  # a rule
    cpu = tmp_path / "cpu.json"
    cpu.write_text(json.dumps({"format": "plait-calibration/1", "device": "cpu", "params": {}}), encoding="utf-8")
    assert _plan_json(capsys, *given, "--calibration", str(cpu))["prediction"]["compiled_blocks"] == 0.0
    main(["plan", "--model", "llama3-8b", "--gpus", "8", "--global-batch", "16", "--seq-len", "2048", *given,
          "--explain"])
    assert "element-wise work: priced compiled" in capsys.readouterr().out
    main(["plan", "--model", "llama3-8b", "--gpus", "8", "--global-batch", "16", "--seq-len", "2048", "--top", "2",
          "--no-compile"])
    assert "priced eager" in capsys.readouterr().out


def test_compile_on_a_stack_without_it_is_one_line(capsys):
    code = main(["plan", "--model", "llama3-8b", "--gpus", "8", "--global-batch", "16", "--seq-len", "2048",
                 "--stack", "megatron-core", "--compile"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "runs no torch.compile" in err


def test_plait_compiles_only_the_dense_blocks_of_an_moe_model():
    from plait.spec.moe.parts import moe_layer_count
    from plait.spec.moe.presets import MOE_PRESETS

    model = next(m for m in MOE_PRESETS if m.name == "deepseek-v3")
    dense = 1 - moe_layer_count(model) / model.n_layers  # 3 of 61 layers
    assert compiled_share(PLAIT, model, Layout(dp=8)) == pytest.approx(dense, rel=1e-12)
    anywhere = dataclasses.replace(PLAIT, compile_rules=0.0)  # software that compiles every block (a row's fact)
    assert compiled_share(anywhere, model, Layout(dp=4, cp=2)) == 1.0
    mixtral = next(m for m in MOE_PRESETS if m.name == "mixtral-8x7b")
    job, lay = JobSpec(global_batch=16, seq_len=4096), Layout(dp=8, zero=3, ep=8, mbs=1, ckpt="full")
    compiled, eager = (estimate_step(mixtral, H100, job, lay, dataclasses.replace(anywhere, compiled_blocks=c))
                       for c in (1.0, 0.0))
    assert compiled.elementwise < eager.elementwise


def test_the_search_bound_holds_with_compiled_blocks():
    from plait.plan.search import search

    cluster, job = H100, JobSpec(global_batch=16, seq_len=8192)
    top = search(LLAMA, cluster, job, params=PLAIT, keep=3)
    every = search(LLAMA, cluster, job, params=PLAIT)
    assert [str(p.layout) for p in top.plans[:3]] == [str(p.layout) for p in every.plans[:3]]
    assert {p.compiled for p in every.plans} == {0.0, 1.0}  # the search priced both kinds of layout
