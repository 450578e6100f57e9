"""Rule runtime-moe: plait train runs MoE models (GQA or multi-head latent attention, softmax or
sigmoid routers, GPT-OSS's router and expert biases and clamped SwiGLU) with ep dividing dp·cp,
etp 1 or tp, cp > 1 and fp8 (plait.run.modules.moe, .experts, .mla, plait.run.parallel.expert,
.moe_tensor; every moe_overlap runs) and refuses the rest (etp other than 1 or tp, etp > 1 with
expert biases, mxfp8 with experts); the planner ranks those only with --any-runtime."""

from __future__ import annotations

import dataclasses

import pytest

from plait.cli import main
from plait.plan.search import SearchConstraints, search
from plait.run.config import RunConfig, TrainJob
from plait.spec.capabilities import RUNTIME_RULES, runtime_violations
from plait.spec.hardware import get_cluster
from plait.spec.layout import JobSpec, Layout
from plait.spec.models import get_model

JOB = JobSpec(global_batch=8, seq_len=64)


@pytest.mark.parametrize("model,layout,named", [
    (get_model("tiny-gpt-oss"), "tp=2,etp=2,attn=flex", "etp=2 with expert biases"),
    (get_model("tiny-moe"), "tp=4,etp=2", "etp=2 other than 1 or tp=4"),
    (get_model("tiny-moe"), "dp=2,tp=2,ep=2,etp=2,moe_overlap=chunked", "moe_overlap=chunked with etp=2 and ep=2"),
    (get_model("tiny-moe"), "dp=2,tp=2,ep=2,etp=2,order=cp-dp-tp-pp", "needs tp innermost"),
    (get_model("tiny-moe"), "dp=2,precision=mxfp8", "precision=mxfp8 with an MoE model"),
    (get_model("tiny-moe"), "tp=2,ep=2", "ep=2 not dividing dp·cp = 1"),
    (get_model("tiny"), "dp=2,ep=2", "layout sets ep=2 for a dense model"),
])
def test_moe_models_and_expert_layouts_are_refused_by_plait_train(model, layout, named):
    lay = Layout.parse(layout)
    found = runtime_violations(model, lay, JOB)
    assert [v.rule for v in found] == ["runtime-moe"] and "runtime-moe" in RUNTIME_RULES
    assert named in found[0].message and "--any-runtime" in found[0].message
    config = RunConfig(job=TrainJob(model=model, layout=lay, global_batch=8, seq_len=64))
    assert config.runtime_problems() == [found[0].message]


def test_attention_sinks_run_with_flex_or_eager_attention():
    """Sinks are no MoE feature: a dense model with them runs on attn=flex or eager, or any cp kernel but torch's."""
    sinks = dataclasses.replace(get_model("tiny"), sinks=True)
    for layout in ("dp=2,attn=flex", "dp=2,attn=eager", "cp=2,cp_impl=ring", "cp=2,cp_impl=ulysses"):
        assert runtime_violations(sinks, Layout.parse(layout), JOB) == [], layout
    assert [v.rule for v in runtime_violations(sinks, Layout.parse("dp=2"), JOB)] == ["runtime-attn-softcap"]
    assert [v.rule for v in runtime_violations(sinks, Layout.parse("cp=2,cp_impl=torch"), JOB)] == [
        "runtime-cp-attention-options"]


def test_dense_models_with_dense_layouts_break_no_moe_rule():
    assert runtime_violations(get_model("tiny"), Layout.parse("dp=2,tp=2"), JOB) == []


@pytest.mark.parametrize("layout", ["dp=2", "dp=2,ep=2", "dp=4,ep=2,zero=3", "dp=2,tp=2,ep=2", "pp=2,dp=2,ep=2",
                                    "dp=4,ep=4"])
def test_the_runtime_runs_tiny_moe_with_ep_carved_out_of_dp(layout):
    assert runtime_violations(get_model("tiny-moe"), Layout.parse(layout), JOB) == []


def test_the_runtime_runs_deepseek_routing_without_mla():
    tiny = get_model("tiny-moe")
    routed = dataclasses.replace(tiny, moe=dataclasses.replace(tiny.moe, router="sigmoid", n_groups=4, topk_groups=2,
                                                               route_scale=2.5, capacity_factor=1.25))
    assert runtime_violations(routed, Layout.parse("dp=2,ep=2"), JOB) == []


def test_the_runnable_search_keeps_runnable_expert_layouts_and_any_runtime_ranks_the_rest():
    model, cluster = get_model("tiny-moe"), get_cluster("dgx-h100").with_gpus(4)
    job = JobSpec(global_batch=8, seq_len=256)
    constraints = SearchConstraints(max_pp=2, max_mbs=2)
    every = search(model, cluster, job, constraints)
    runnable = search(model, cluster, job, constraints, runnable=True)
    assert any(p.layout.ep > 1 for p in runnable.plans)
    assert all(not p.runtime_violations for p in runnable.plans)
    refused = [p for p in every.plans if p.runtime_violations]
    assert refused and all("runtime-moe" in [v.rule for v in p.runtime_violations] for p in refused
                           if p.layout.ep > 1 and (p.layout.dp * p.layout.cp) % p.layout.ep)


@pytest.mark.parametrize("layout", ["tp=2,etp=2", "dp=2,tp=2,ep=2,etp=2", "tp=2,sp=0,etp=2", "dp=2,cp=2",
                                    "cp=2,ep=2", "dp=2,precision=fp8", "dp=2,ep=2,precision=fp8"])
def test_the_runtime_runs_etp_cp_and_fp8_with_experts(layout):
    for name in ("tiny-moe", "tiny-dsv3"):
        assert runtime_violations(get_model(name), Layout.parse(layout), JOB) == [], (name, layout)


def test_mla_under_cp_needs_a_kernel_that_takes_its_score_scale():
    found = runtime_violations(get_model("tiny-dsv3"), Layout.parse("cp=2,cp_impl=torch"), JOB)
    assert [v.rule for v in found] == ["runtime-cp-attention-options"] and "mla" in found[0].message


@pytest.mark.parametrize("layout", ["dp=2", "tp=2", "dp=2,ep=2,zero=3", "pp=2,dp=2,ep=2", "dp=2,tp=2,ep=2"])
def test_the_runtime_runs_mla_models(layout):
    for name in ("tiny-dsv3", "deepseek-v3"):
        assert runtime_violations(get_model(name), Layout.parse(layout), JOB) == []


@pytest.mark.parametrize("layout", ["dp=2,attn=flex", "dp=2,ep=2,zero=3,attn=eager", "tp=2,attn=eager",
                                    "pp=2,dp=2,ep=2,attn=eager", "dp=2,tp=2,ep=2,attn=flex"])
def test_the_runtime_runs_gpt_oss(layout):
    """Router and expert biases and the clamped SwiGLU run; the sinks want attn=flex or eager."""
    for name in ("tiny-gpt-oss", "gpt-oss-120b"):
        assert runtime_violations(get_model(name), Layout.parse(layout), JOB) == []


def test_plait_train_takes_mla_and_gpt_oss_and_refuses_ep_outside_dp_with_one_line(capsys):
    args = ["--nproc-per-node", "2", "--global-batch", "8", "--seq-len", "64", "--steps", "1", "--dry-run",
            "--device", "cpu"]
    assert main(["train", "--model", "tiny-dsv3", "--layout", "dp=2,ep=2", *args]) == 0
    assert main(["train", "--model", "tiny-gpt-oss", "--layout", "dp=2,ep=2,zero=3,attn=eager", *args]) == 0
    capsys.readouterr()
    code = main(["train", "--model", "tiny-moe", "--layout", "tp=2,ep=2", *args])
    err = capsys.readouterr().err
    assert code == 2 and "ep=2 not dividing dp·cp" in err and "planned but not run by plait train" in err
    assert "Traceback" not in err and err.count("\n") == 1


@pytest.mark.parametrize("model,layout,says", [
    ("mixtral-8x7b", "dp=64,moe_overlap=chunked", "with ep=1"),
    ("mixtral-8x7b", "dp=64,ep=8,moe_overlap=shared", "no shared experts"),
    ("llama3-8b", "dp=64,moe_overlap=chunked", "dense model"),
])
def test_an_overlap_with_nothing_to_overlap_runs_as_none_and_says_so(model, layout, says):
    """moe_overlap at ep=1, shared without shared experts, or on a dense model: the layout is valid and
    runs as none (planner and runtime); the planner warns, naming what would give it something to hide."""
    from plait.spec.validate import validate

    spec, lay = get_model(model), Layout.parse(layout)
    violations = validate(spec, get_cluster("dgx-h100", 64), JobSpec(512, 4096), lay)
    assert [v.severity for v in violations if v.rule == "moe-overlap-noop"] == ["warning"]
    assert says in next(v.message for v in violations if v.rule == "moe-overlap-noop")
    for fine in ("dp=64,ep=8,moe_overlap=chunked", "dp=64,ep=8"):
        if spec.moe is not None:
            assert not [v for v in validate(spec, get_cluster("dgx-h100", 64), JobSpec(512, 4096), Layout.parse(fine))
                        if v.rule == "moe-overlap-noop"]
