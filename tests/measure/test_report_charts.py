"""The numbers behind the report's charts: memory axis scaling, the step-time waterfall, the measured
spread, the per-stage memory of a plan, and the timeline's window selection. No pixels, no torch."""

from __future__ import annotations


import pytest

from plait.measure.report.chart_data import GIB, MIB, duration, memory_axis, step_spread, waterfall_bars
from plait.measure.report.plots import spread_errors
from plait.measure.report.stage_memory import stage_memories
from plait.plan.memory import rank_in_flight as stage_in_flight
from plait.measure.report.timeline import (
    BUBBLE,
    busy_spans,
    hidden_spans,
    pipeline_timeline,
    timeline_bubble_fraction,
    timeline_windows,
)
from plait.measure.sweep.csv_file import SweepRow
from plait.plan.cost import bubble_fraction
from plait.plan.memory import estimate_memory
from plait.plan.plan import evaluate
from plait.spec.hardware import cluster_for_gpu
from plait.spec.layout import JobSpec, Layout
from plait.spec.models import get_model


# ----------------------------------------------------------------- memory axis
def test_a_tiny_model_is_not_drawn_against_80_gib():
    axis = memory_axis([1.0 * MIB, 0.5 * MIB], 80 * GIB)
    assert axis.unit == "MiB" and axis.unit_bytes == MIB
    assert not axis.show_capacity
    assert axis.limit_bytes == pytest.approx(1.1 * MIB)  # AXIS_MARGIN beyond the largest value


def test_a_layout_near_capacity_shows_the_capacity_line():
    axis = memory_axis([70 * GIB, 30 * GIB, None], 80 * GIB)
    assert axis.unit == "GiB" and axis.show_capacity
    assert axis.limit_bytes == pytest.approx(1.1 * 80 * GIB)
    over = memory_axis([90 * GIB], 80 * GIB)  # over capacity: the axis reaches the bar, past the line
    assert over.show_capacity and over.limit_bytes == pytest.approx(1.1 * 90 * GIB)
    quarter = memory_axis([20 * GIB], 80 * GIB)  # exactly CAPACITY_SHOWN_ABOVE of it
    assert quarter.show_capacity


def test_host_memory_without_a_capacity_is_scaled_to_the_data():
    axis = memory_axis([3.0e8, 2.9e8, 1.2e7], None)
    assert axis.unit == "MiB" and not axis.show_capacity
    assert axis.limit_bytes == pytest.approx(1.1 * 3.0e8)
    assert memory_axis([], None).limit_bytes > 0  # nothing measured: still a valid axis


# ----------------------------------------------------------------- waterfall
def test_waterfall_bars_follow_each_other_and_end_at_the_step_time():
    items = {"compute": 3.0, "tp_comm": 0.5, "bubble": 0.0, "dp_comm": 0.25, "overhead": 0.25}
    bars = waterfall_bars(items, 4.0)
    assert [b.label for b in bars] == ["compute", "tp comm", "dp comm", "overhead", "step time"]  # zero left out
    assert [b.start for b in bars[:-1]] == [0.0, 3.0, 3.5, 3.75]
    assert bars[-2].start + bars[-2].width == 4.0 and bars[-1] == ("step time", 0.0, 4.0)


def test_waterfall_shows_what_the_items_do_not_add_up_to():
    bars = waterfall_bars({"compute": 3.0}, 3.5)
    assert bars[1].label == "not itemized" and bars[1].width == pytest.approx(0.5)
    bars = waterfall_bars({"compute": 3.0, "dp_comm": 1.0}, 3.5)
    assert bars[2].label == "overlap" and bars[2].width == pytest.approx(-0.5)


def test_planner_waterfall_adds_up_to_its_step_time():
    plan = evaluate(get_model("llama3-8b"), cluster_for_gpu("h100-sxm", 8, 8), JobSpec(global_batch=64, seq_len=4096),
                    Layout.parse("pp=4,tp=2,mbs=1"))
    bars = waterfall_bars(plan.step.items(), plan.step.step_time)
    assert bars[-1].width == plan.step.step_time
    assert bars[-2].start + bars[-2].width == pytest.approx(plan.step.step_time, rel=1e-9)


def test_duration_picks_a_readable_unit():
    assert duration(17.6229) == "17.62 s" and duration(0.0235) == "23.50 ms" and duration(4.12e-4) == "412.0 µs"


# ----------------------------------------------------------------- measured spread
def test_step_spread_is_the_distance_from_the_median_to_min_and_max():
    assert step_spread(0.10, 0.09, 0.13) == pytest.approx((0.01, 0.03))
    assert step_spread(0.10, None, 0.13) is None and step_spread(None, 0.09, 0.13) is None
    rows = [SweepRow("dp=2", "ok", measured_step_time_s=0.2, step_time_min_s=0.15,
                     step_time_max_s=0.3),
            SweepRow("tp=2", "ok", measured_step_time_s=0.1)]
    below, above = spread_errors(rows)
    assert below == pytest.approx([0.05, 0.0]) and above == pytest.approx([0.1, 0.0])
    assert spread_errors(rows[1:]) is None


MODEL, CLUSTER = get_model("llama3-8b"), cluster_for_gpu("h100-sxm", 8, 8)
JOB = JobSpec(global_batch=64, seq_len=4096)


@pytest.mark.parametrize("text", ["pp=4,tp=2,mbs=1", "pp=8,mbs=1,schedule=gpipe", "pp=4,vpp=2,tp=2,mbs=1,ckpt=full",
                                  "pp=2,tp=4,zero=1,mbs=2", "tp=8,mbs=1"])
def test_the_most_loaded_stage_is_the_planners(text):
    layout = Layout.parse(text)
    stages = stage_memories(MODEL, CLUSTER, JOB, layout)
    planner = estimate_memory(MODEL, CLUSTER, JOB, layout)
    assert len(stages) == layout.pp
    assert max(s.total for s in stages) == pytest.approx(planner.total, rel=1e-12)
    if layout.pp > 1:
        assert [s.stage for s in stages] == [str(r) for r in range(layout.pp)]


def test_stage_weights_add_up_to_the_model():
    layout = Layout.parse("pp=4,mbs=1")  # no tp, no ZeRO: every parameter once, 2 bytes in bf16
    stages = stage_memories(MODEL, CLUSTER, JOB, layout)
    assert sum(s.weights for s in stages) == pytest.approx(2.0 * MODEL.total_params(), rel=1e-12)
    assert stages[0].embedding_activations > 0 and all(s.embedding_activations == 0 for s in stages[1:])
    assert stages[-1].logits > 0 and all(s.logits == 0 for s in stages[:-1])
    assert stages[1].activations > stages[2].activations  # 1F1B: rank r holds p - r micro-batches


def test_micro_batches_in_flight_per_stage():
    m = 16
    one_f_one_b = Layout.parse("pp=4,mbs=1")
    assert [stage_in_flight(one_f_one_b, m, r) for r in range(4)] == [4, 3, 2, 1]
    assert [stage_in_flight(Layout.parse("pp=4,mbs=1,schedule=gpipe"), m, r) for r in range(4)] == [16] * 4
    interleaved = Layout.parse("pp=4,vpp=2,mbs=1")
    factor = 1 + 3 / 8
    assert [stage_in_flight(interleaved, m, r) for r in range(4)] == pytest.approx(
        [4 * factor, 3 * factor, 2 * factor, 1])
    assert stage_in_flight(one_f_one_b, 2, 1) == 2  # never more than the micro-batches there are


# ----------------------------------------------------------------- timeline window
def test_few_micro_batches_are_drawn_whole():
    intervals = pipeline_timeline("1f1b", 4, 8, 1.0, 2.0)
    assert timeline_windows(intervals) == [(0.0, max(i.end for i in intervals))]
    assert hidden_spans(timeline_windows(intervals)) == []


@pytest.mark.parametrize("schedule,pp,m,vpp,breaks", [("1f1b", 4, 256, 1, 1), ("interleaved-1f1b", 4, 256, 2, 1),
                                                      ("gpipe", 4, 64, 1, 2), ("1f1b", 8, 512, 1, 1)])
def test_many_micro_batches_hide_only_steady_state(schedule, pp, m, vpp, breaks):
    intervals = pipeline_timeline(schedule, pp, m, 1.0, 2.0, vpp)
    windows = timeline_windows(intervals)
    hidden = hidden_spans(windows)
    assert len(hidden) == breaks and windows[0][0] == 0.0 and windows[-1][1] == max(i.end for i in intervals)
    margin = 2 * (1.0 + 2.0)  # keep_cycles · (forward + backward)
    for a, b in hidden:  # inside a bubble-free span, at least a margin from its ends: no bubble is hidden
        assert any(start + margin <= a + 1e-9 and b <= end - margin + 1e-9 for start, end in busy_spans(intervals))
        assert not any(i.kind == BUBBLE and i.start < b and i.end > a for i in intervals)
    # the hidden part has no bubble, so every bubble is drawn; the step's fraction stays the planner's
    shown = sum(b - a for a, b in windows)
    assert shown < 0.25 * max(i.end for i in intervals)  # most of a long step is left out
    assert timeline_bubble_fraction(intervals) == pytest.approx(bubble_fraction(schedule, pp, m, vpp))


def test_timeline_section_caption_matches_the_picture(tmp_path):
    from plait.measure.report.sections import timeline_section

    model, job = get_model("llama-125m"), JobSpec(global_batch=256, seq_len=1024)
    plan = evaluate(model, cluster_for_gpu("h100-sxm", 4, 4), job, Layout.parse("pp=4,mbs=1"))
    section = timeline_section(plan, "a test plan", tmp_path / "timeline.png")
    text = section.paragraphs[0]
    assert "256 micro-batches" in text and "Not drawn:" in text and "no bubble" in text
    assert f"Bubble {100 * bubble_fraction('1f1b', 4, 256):.1f}% of the busy time" in text
    assert section.image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
