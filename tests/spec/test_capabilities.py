"""The runtime's capabilities as rules with ids, and the search that ranks only what plait train runs."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plait.errors import PlaitError
from plait.plan.plan import Plan, evaluate, read_plan
from plait.plan.search import SearchConstraints, rank_with_headroom, require_plans, search
from plait.run.config import RunConfig, RuntimeConfig, TrainJob, plan_parts
from plait.spec import capabilities
from plait.spec.capabilities import RUNTIME_RULES, runtime_violations
from plait.spec.hardware import CLUSTERS, get_cluster
from plait.spec.layout import JobSpec, Layout
from plait.spec.model import ModelSpec
from plait.spec.models import get_model
from plait.spec.units import divisors

FAST = SearchConstraints(max_pp=8, max_mbs=4)
TINY = get_model("tiny")
JOB = JobSpec(global_batch=8, seq_len=64)


@st.composite
def problems(draw):
    n_heads = draw(st.sampled_from((4, 8, 16)))
    hidden = n_heads * 64
    model = ModelSpec(name="random", arch=draw(st.sampled_from(("llama", "gpt"))), n_layers=draw(st.integers(2, 24)),
                      hidden=hidden, ffn_hidden=64 * draw(st.integers(hidden // 64, 4 * hidden // 64)),
                      n_heads=n_heads, n_kv_heads=n_heads, vocab=draw(st.integers(1000, 60000)),
                      max_seq_len=draw(st.sampled_from((2048, 8192))), tied_embeddings=draw(st.booleans()),
                      dropout=draw(st.booleans()))
    cluster = CLUSTERS[draw(st.sampled_from(sorted(CLUSTERS)))].with_gpus(draw(st.sampled_from((1, 2, 4, 8))))
    job = JobSpec(global_batch=cluster.n_gpus * draw(st.integers(1, 4)),
                  seq_len=draw(st.sampled_from((1024, 4096, 8192))))
    return model, cluster, job, draw(st.booleans())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_runnable_search_keeps_only_what_plait_train_runs(problem):
    model, cluster, job, compile = problem
    every = search(model, cluster, job, FAST, compile=compile)
    runnable = search(model, cluster, job, FAST, runnable=True, compile=compile)
    assert runnable.all_fitting() == every.plans
    # the runnable plans are ranked among themselves: the fastest first, except that the roomiest of
    # those within 1% of it leads (rank_with_headroom), which may differ from where it sat among all
    by_speed = sorted(every.plans, key=lambda p: (-p.step.tokens_per_s_per_gpu, p.memory.total))
    assert runnable.plans == rank_with_headroom([p for p in by_speed if not p.runtime_violations])
    for plan in every.plans:
        assert plan.layout.offload_target != "disk"  # the offload-directory checks never apply here
        config = RunConfig(job=TrainJob(model=model, layout=plan.layout, global_batch=job.global_batch,
                                        seq_len=job.seq_len), runtime=RuntimeConfig(compile=compile))
        assert [v.message for v in plan.runtime_violations] == config.runtime_problems(), str(plan.layout)
        assert all(v.rule in RUNTIME_RULES and v.severity == "error" for v in plan.runtime_violations)
    for plan in runnable.plans:
        assert plan.runtime_violations == () and plan.runnable


@pytest.mark.parametrize("model,layout,seq_len,compile,rule", [
    (TINY, "dp=2,pp=2,cp=2", 64, False, "runtime-cp-with-pp"),
    (dataclasses.replace(TINY, dropout=True), "cp=2", 64, False, "runtime-cp-dropout"),
    (TINY, "cp=2", 64, True, "runtime-compile-cp"),
    (TINY, "offload=0.5", 64, True, "runtime-compile-offload"),
    (TINY, "opt_offload=1", 64, False, "runtime-opt-offload"),
    (TINY, "tp=2,precision=mxfp8", 64, False, "runtime-mxfp8-tp"),
    (dataclasses.replace(TINY, tied_embeddings=True), "pp=2", 64, False, "runtime-tied-embeddings-pp"),
    (get_model("tiny-gpt"), "dp=1", TINY.max_seq_len * 2, False, "runtime-seq-len"),  # learned positions only
    (TINY, "pp=2,schedule=zero-bubble", 64, True, "runtime-compile-zero-bubble"),
])
def test_each_rule_has_an_id_and_the_runtime_message(model, layout, seq_len, compile, rule):
    lay = Layout.parse(layout)
    found = runtime_violations(model, lay, JobSpec(8, seq_len), compile=compile)
    assert [v.rule for v in found] == [rule]
    config = RunConfig(job=TrainJob(model=model, layout=lay, global_batch=8, seq_len=seq_len),
                       runtime=RuntimeConfig(compile=compile))
    assert config.runtime_problems() == [found[0].message]
    if compile:  # the --compile rules apply only with --compile
        assert runtime_violations(model, lay, JobSpec(8, seq_len)) == []


def test_fp8_runs_with_torchao_and_is_refused_without(monkeypatch):
    lay = Layout.parse("precision=fp8")
    monkeypatch.setattr(capabilities, "torchao_installed", lambda: True)
    assert runtime_violations(TINY, lay, JOB) == []
    monkeypatch.setattr(capabilities, "torchao_installed", lambda: False)
    found = runtime_violations(TINY, lay, JOB)
    assert [v.rule for v in found] == ["runtime-fp8"] and "install torchao" in found[0].message
    config = RunConfig(job=TrainJob(model=TINY, layout=lay, global_batch=8, seq_len=64))
    assert config.runtime_problems() == [found[0].message]


def test_messages_that_the_cli_tests_grep():
    messages = [v.message for v in runtime_violations(TINY, Layout.parse("dp=2,pp=2,cp=2,opt_offload=1"), JOB)]
    assert messages[0] == ("context parallelism with pipeline parallelism (cp > 1 with pp > 1) is planned but not "
                           "run yet; use pp=1 or cp=1")
    assert messages[1] == "optimizer offload (opt_offload=1) is planned but not run yet"


def test_require_plans_explains_when_no_fitting_layout_is_runnable():
    cluster = get_cluster("dgx-h100").with_gpus(8)
    constraints = SearchConstraints(fixed=(("cp", 2), ("pp", 2)), max_pp=2, max_mbs=2)
    job = JobSpec(global_batch=16, seq_len=1024)
    result = search(get_model("llama-125m"), cluster, job, constraints, runnable=True)
    assert result.plans == [] and result.all_fitting()
    assert result.unrunnable_ahead(3) == len(result.all_fitting())
    with pytest.raises(PlaitError) as info:
        require_plans(get_model("llama-125m"), cluster, job, result, constraints)
    text = str(info.value)
    assert "\n" not in text and "is one plait train runs yet" in text and "(cp > 1 with pp > 1) is planned" in text
    assert require_plans(get_model("llama-125m"), cluster, job,
                         search(get_model("llama-125m"), cluster, job, constraints), constraints)


def test_unrunnable_ahead_counts_what_the_runtime_skips():
    cluster = get_cluster("dgx-h100").with_gpus(8)
    job = JobSpec(global_batch=16, seq_len=8192)
    result = search(get_model("llama3-8b"), cluster, job, SearchConstraints(max_pp=4, max_mbs=2), runnable=True)
    ranked = result.all_fitting()
    assert 0 < result.unrunnable_ahead(100) < len(ranked) - len(result.plans)  # cp with pp, among others
    for k in (1, 2, 50, 100, 10_000):
        kept = dropped = 0
        for plan in ranked:  # what sweep's old hand loop counted
            if plan.runtime_violations:
                dropped += 1
            elif (kept := kept + 1) == k:
                break
        assert result.unrunnable_ahead(k) == dropped


# ---------------------------------------------------------------------------- plan files
def test_plan_dict_round_trip(tmp_path):
    cluster = get_cluster("dgx-h100").with_gpus(8)
    job = JobSpec(global_batch=32, seq_len=4096)
    model = get_model("llama3-8b")
    plans = [evaluate(model, cluster, job, Layout.parse("dp=2,tp=4,ckpt=full,offload=cpu:0.5,opt_offload=1")),
             evaluate(model, cluster, job, Layout.parse("dp=2,tp=2,pp=2,mbs=1,ckpt=selective"))]
    plans += search(model, cluster, job, FAST).plans[:3]
    for plan in plans:
        assert Plan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    assert plans[0].memory.host_bytes > 0 and plans[0].runtime_violations
    path = tmp_path / "p.json"
    plans[1].save(path)
    assert read_plan(path) == plans[1]
    assert plan_parts(plans[1].to_dict(), str(path)) == (model, plans[1].layout, job, "h100-sxm")


def test_plan_file_errors_are_one_line(tmp_path):
    plan = evaluate(TINY, get_cluster("dgx-h100").with_gpus(2), JOB, Layout(dp=2))
    data = plan.to_dict()
    del data["job"]
    with pytest.raises(PlaitError, match=r"^x.json: plan file is missing 'job'; write it with plait plan --save$"):
        Plan.from_dict(data, "x.json")
    data = plan.to_dict()
    del data["prediction"]["time_items_s"]
    with pytest.raises(PlaitError, match="plan file is missing 'time_items_s'"):
        Plan.from_dict(data, "x.json")
    assert plan_parts(data, "x.json")[1] == Layout(dp=2)  # the parts need no prediction
    path = tmp_path / "other.json"
    path.write_text(json.dumps({**plan.to_dict(), "format": "plait-plan/0"}))
    with pytest.raises(PlaitError, match="not a plait plan"):
        read_plan(path)


def test_allocated_memory_leaves_out_context_buffers_and_fragmentation():
    memory = evaluate(TINY, get_cluster("dgx-h100").with_gpus(2), JOB, Layout(dp=2)).memory
    expected = memory.total - memory.cuda_context - memory.comm_buffers - memory.fragmentation
    assert memory.allocated == pytest.approx(expected, rel=1e-12)


def test_divisors():
    assert divisors(12) == [1, 2, 3, 4, 6, 12] and divisors(12, 4) == [1, 2, 3, 4] and divisors(1) == [1]
