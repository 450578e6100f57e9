"""A search that cannot find a runnable layout says so at once: rules that only the model and the job
decide (``spec.capabilities.model_blockers``) are checked before the search enumerates anything."""

from __future__ import annotations

from plait.cli import main
from plait.spec.capabilities import MODEL_RULES, model_blockers, runtime_violations
from plait.spec.layout import JobSpec, Layout
from plait.spec.models import get_model


def test_model_blockers_are_broken_by_every_layout():
    model, job = get_model("tiny-gpt"), JobSpec(global_batch=8, seq_len=512)  # 256 learned positions
    blockers = model_blockers(model, job)
    assert [v.rule for v in blockers] == ["runtime-seq-len"]
    for layout in (Layout(dp=2, tp=2), Layout(dp=4, zero=3, ckpt="full"), Layout(dp=2, pp=2)):
        assert {v.rule for v in blockers} <= {v.rule for v in runtime_violations(model, layout, job)}
    assert model_blockers(model, JobSpec(global_batch=8, seq_len=256)) == []
    assert model_blockers(get_model("tiny"), job) == []  # RoPE runs past max_position_embeddings
    for runs in ("deepseek-v3", "gpt-oss-120b"):  # MLA; GPT-OSS's biased, clamped experts
        assert model_blockers(get_model(runs), JobSpec(global_batch=16, seq_len=4096)) == [], runs
    assert set(MODEL_RULES) >= {"runtime-seq-len", "runtime-moe"}


def test_plan_refuses_at_once_and_any_runtime_still_ranks(capsys):
    argv = ["plan", "--model", "tiny-gpt", "--gpus", "2", "--global-batch", "8", "--seq-len", "512"]
    assert main(argv) == 2  # 512 tokens past tiny-gpt's 256 learned positions: no layout runs
    err = capsys.readouterr().err
    assert "plait train runs no layout of tiny-gpt" in err and "runtime-seq-len" in err and "--any-runtime" in err
    assert err.count("\n") == 1
    # a model plait train runs goes on to the search as before
    assert main(["plan", "--model", "tiny", "--gpus", "2", "--global-batch", "8", "--seq-len", "256",
                 "--top", "1", "--json"]) == 0
