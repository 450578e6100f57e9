"""plait train --layout without mbs picks the micro-batch and says which (plait.run.launcher.micro_batch)."""

from dataclasses import replace

from plait.run.launcher.micro_batch import (
    choose_mbs,
    cpu_process_bytes,
    host_available_bytes,
    host_mbs,
    keep_saved_mbs,
    mbs_given,
)
from plait.plan.memory import estimate_memory
from plait.spec.hardware import get_cluster
from plait.spec.layout import JobSpec, Layout
from plait.spec.models import get_model

GIB = 2**30


def test_mbs_given_reads_the_layout_text():
    assert mbs_given("dp=2,mbs=4") and not mbs_given("dp=2") and not mbs_given(None)


def test_meminfo_is_read(tmp_path):
    path = tmp_path / "meminfo"
    path.write_text("MemTotal:  1000 kB\nMemAvailable:  2048 kB\n")
    assert host_available_bytes(path) == 2048 * 1024
    assert host_available_bytes(tmp_path / "missing") is None


def _need(model, job, layout, mbs, processes):
    memory = estimate_memory(model, get_cluster("dgx-h100", layout.world_size), job, replace(layout, mbs=mbs))
    return processes * cpu_process_bytes(memory)


def test_host_rule_takes_the_largest_fitting_divisor():
    model, job, layout = get_model("llama3-8b"), JobSpec(16, 2048), Layout(dp=2)
    needs = {m: _need(model, job, layout, m, 2) for m in (1, 2, 4, 8)}
    assert needs[1] < needs[2] < needs[4] < needs[8]  # more sequences per micro-batch, more memory
    # a host whose half holds mbs=4 but not 8 gets 4; one that holds everything gets the per-rank batch
    available = needs[4] + needs[8]  # half of it (HOST_HEADROOM) lies between the two
    assert host_mbs(model, job, layout, 2, available)[0] == 4
    assert host_mbs(model, job, layout, 2, 1e15)[0] == 8
    mbs, why = host_mbs(model, job, layout, 2, 1.0)
    assert mbs == 1 and "does not" in why


def test_choose_says_which():
    model, job = get_model("tiny"), JobSpec(8, 32)
    layout, note = choose_mbs(model, job, Layout(dp=2), None, False, 2)
    assert note.startswith(f"completed: mbs={layout.mbs} — ")
    layout, note = choose_mbs(model, job, Layout(dp=2), "h100-sxm", False, 2)
    assert "the planner's fastest micro-batch that fits on h100-sxm" in note and 8 // 2 % layout.mbs == 0
    layout, note = choose_mbs(model, job, Layout(dp=2), None, True, 2)
    assert layout.mbs == 1 and "no spec" in note


def test_a_resumed_run_keeps_the_saved_mbs():
    assert keep_saved_mbs(Layout(dp=2), Layout(dp=4, mbs=2), 8).mbs == 2
    assert keep_saved_mbs(Layout(dp=8), Layout(dp=4, mbs=2), 8).mbs == 1  # 8/8 = 1 per rank: 2 does not divide
