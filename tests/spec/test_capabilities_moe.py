"""Rule runtime-moe: plait train does not run mixture-of-experts models or expert layouts yet; the
planner plans them and ranks them only with --any-runtime."""

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
    (get_model("tiny-moe"), "dp=2", "routed experts (moe)"),
    (get_model("tiny-moe"), "dp=2,ep=2", "routed experts (moe)"),
    (get_model("tiny"), "tp=2,etp=2,moe_overlap=shared", "layout sets etp=2, moe_overlap=shared"),
    (dataclasses.replace(get_model("tiny"), sinks=True), "dp=2", "attention sinks (sinks)"),
    (get_model("tiny"), "dp=2,ep=2", "layout sets ep=2"),
])
def test_moe_models_and_expert_layouts_are_refused_by_plait_train(model, layout, named):
    lay = Layout.parse(layout)
    found = runtime_violations(model, lay, JOB)
    assert [v.rule for v in found] == ["runtime-moe"] and "runtime-moe" in RUNTIME_RULES
    assert named in found[0].message and "--any-runtime" in found[0].message
    config = RunConfig(job=TrainJob(model=model, layout=lay, global_batch=8, seq_len=64))
    assert config.runtime_problems() == [found[0].message]


def test_dense_models_with_dense_layouts_break_no_moe_rule():
    assert runtime_violations(get_model("tiny"), Layout.parse("dp=2,tp=2"), JOB) == []


def test_the_runnable_search_keeps_no_moe_layout_and_any_runtime_ranks_them():
    model, cluster = get_model("tiny-moe"), get_cluster("dgx-h100").with_gpus(4)
    job = JobSpec(global_batch=8, seq_len=256)
    constraints = SearchConstraints(max_pp=2, max_mbs=2)
    every = search(model, cluster, job, constraints)
    runnable = search(model, cluster, job, constraints, runnable=True)
    assert runnable.plans == [] and runnable.all_fitting() == every.plans
    assert any(p.layout.ep > 1 for p in every.plans)
    assert all([v.rule for v in p.runtime_violations] == ["runtime-moe"] for p in every.plans)


def test_plait_train_refuses_tiny_moe_with_one_line(capsys):
    code = main(["train", "--model", "tiny-moe", "--layout", "dp=2,ep=2", "--nproc-per-node", "2",
                 "--global-batch", "8", "--seq-len", "64", "--steps", "1", "--dry-run", "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2 and "mixture-of-experts models and expert parallelism are planned but not run" in err
    assert "Traceback" not in err
