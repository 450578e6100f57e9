"""Completion of partial layouts and the memory headroom (plait.plan.complete, plan.search.rank_with_headroom)."""

from dataclasses import replace

import pytest

from plait.cli import main
from plait.errors import PlaitError
from plait.plan.complete import complete, given_keys, pick
from plait.plan.memory import estimate_memory, is_risky
from plait.plan.search import SearchConstraints, rank_with_headroom, search
from plait.spec.hardware import get_cluster
from plait.spec.layout import JobSpec, Layout
from plait.spec.models import get_model


def test_given_keys_are_what_the_text_writes():
    assert given_keys("dp=8") == {"dp": 8}
    assert given_keys("tp=2, ckpt=full:4") == {"tp": 2, "ckpt": "full", "ckpt_layers": 4}
    assert given_keys("vpp=2") == {"vpp": 2, "schedule": "interleaved-1f1b"}
    with pytest.raises(PlaitError):
        given_keys("banana=2")


def test_completion_keeps_the_given_keys_and_names_the_others():
    model, cluster, job = get_model("llama3-8b"), get_cluster("dgx-h100", 16), JobSpec(128, 4096)
    done = complete(model, cluster, job, {"tp": 2, "zero": 1})
    assert done.layout.tp == 2 and done.layout.zero == 1 and done.fits and not done.risky
    named = dict(done.completed)
    assert "tp" not in named and "zero" not in named
    assert {"pp", "dp", "mbs", "ckpt", "sp"} <= set(named)
    assert int(named["mbs"]) == done.layout.mbs
    assert done.note().startswith("completed: ") and done.note().endswith("— fastest that fits")


def test_completion_is_the_fastest_safe_layout_of_the_search_space():
    """Nothing faster that fits with the headroom exists among the layouts with the given keys."""
    model, cluster, job = get_model("llama2-13b"), get_cluster("dgx-a100", 16), JobSpec(64, 4096)
    done = complete(model, cluster, job, {"dp": 4})
    constraints = SearchConstraints(fixed=(("dp", 4), ("hsdp", 1)), allow_offload=False, max_mbs=16)
    plans = [p for p in search(model, cluster, job, constraints).plans if not is_risky(p.memory)]
    assert plans and done.step.tokens_per_s_per_gpu >= 0.99 * max(p.step.tokens_per_s_per_gpu for p in plans)


def test_nothing_fits_is_said():
    model, cluster, job = get_model("llama3-70b"), get_cluster("dgx-h100", 8), JobSpec(8, 8192)
    done = complete(model, cluster, job, {"dp": 8, "zero": 0})
    assert not done.fits and "none fits" in done.note()


def test_pick_prefers_headroom_among_near_ties():
    class Option:
        def __init__(self, tokens, total):
            self.tokens, self.memory = tokens, replace(MEMORY, weights=total - MEMORY.total + MEMORY.weights)

    fast_full, near_roomy, slow_roomier = Option(100.0, 79 * 2**30), Option(99.5, 40 * 2**30), Option(90.0, 20 * 2**30)
    # the fastest is inside the 5% headroom: the near-tie with room wins; far slower ones never do
    assert pick([fast_full, near_roomy, slow_roomier], 0.05, tokens=lambda o: o.tokens) is near_roomy
    # only risky layouts fit: the fastest of them is taken
    assert pick([fast_full], 0.05, tokens=lambda o: o.tokens) is fast_full


MEMORY = estimate_memory(get_model("tiny"), get_cluster("dgx-h100", 1), JobSpec(8, 64), Layout())


@pytest.mark.parametrize("name,cluster,gpus,batch,seq", [("llama3-70b", "dgx-h100", 64, 256, 8192),
                                                         ("llama2-13b", "dgx-a100", 16, 64, 4096),
                                                         ("llama3-8b", "dgx-h100", 8, 64, 8192)])
def test_search_top1_is_never_inside_the_headroom_while_a_safe_layout_fits(name, cluster, gpus, batch, seq):
    result = search(get_model(name), get_cluster(cluster, gpus), JobSpec(batch, seq))
    plans = result.plans
    assert plans
    if any(not is_risky(p.memory) for p in plans):
        assert not is_risky(plans[0].memory)
        safe = [p for p in plans if not is_risky(p.memory)]
        assert plans[0].step.tokens_per_s_per_gpu >= 0.99 * max(p.step.tokens_per_s_per_gpu for p in safe)
    assert rank_with_headroom(plans) == plans  # ranking is stable


def test_plan_complete_cli_reports_the_completed_knobs(capsys):
    code = main(["plan", "--model", "llama3-8b", "--gpus", "8", "--global-batch", "64", "--seq-len", "4096",
                 "--layout", "dp=8", "--complete"])
    out = capsys.readouterr().out
    assert code == 0
    assert "completed: " in out and "mbs=" in out and "fastest that fits" in out


def test_plan_complete_json_keeps_stdout_json_and_names_the_completion_on_stderr(capsys):
    import json

    code = main(["plan", "--model", "llama3-8b", "--gpus", "8", "--global-batch", "64", "--seq-len", "4096",
                 "--layout", "dp=8", "--complete", "--json"])
    captured = capsys.readouterr()
    assert code == 0
    plans = json.loads(captured.out)
    assert f"mbs={plans[0]['layout']['mbs']}" in captured.err and "completed: " in captured.err


def test_plan_memory_headroom_marks_risky(capsys):
    args = ["plan", "--model", "llama3-8b", "--gpus", "8", "--global-batch", "64", "--seq-len", "4096",
            "--layout", "dp=8,mbs=1,zero=1"]
    main(args + ["--memory-headroom", "0.0"])
    assert "risky" not in capsys.readouterr().out
    main(args + ["--memory-headroom", "0.9"])
    assert "risky" in capsys.readouterr().out
    assert main(args + ["--memory-headroom", "1.5"]) == 2
    assert "--memory-headroom 1.5" in capsys.readouterr().err


def test_explain_keeps_the_allocator_terms_apart(capsys):
    main(["plan", "--model", "llama3-8b", "--gpus", "8", "--global-batch", "64", "--seq-len", "4096",
          "--layout", "dp=8,mbs=1,zero=1"])
    out = capsys.readouterr().out
    tensors, _, beyond = out.partition("beyond the tensors")
    assert "activations" in tensors and "fragmentation" in beyond and "cuda context" in beyond


def test_plan_fix_names_what_the_search_completed(capsys):
    code = main(["plan", "--model", "llama3-8b", "--gpus", "8", "--global-batch", "64", "--seq-len", "4096",
                 "--fix", "tp=2", "--top", "1"])
    out = capsys.readouterr().out
    assert code == 0
    line = next(text for text in out.splitlines() if text.startswith("completed by search (#1): "))
    assert "tp=" not in line and "mbs=" in line and "zero=" in line and "ckpt=" in line
