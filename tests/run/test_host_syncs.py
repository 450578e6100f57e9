"""The training loop reads nothing on the host on non-logging steps, and clipping plus AdamW
run as a fixed number of (foreach / fused) ops, however many parameter tensors there are.

* ``--log-every 3`` over 6 steps: steps 0, 3 and 5 (the last) are sync steps; on steps 1, 2 and
  4 no tensor value is read on the host (``sync_tasks.StepCounter``) and the loop issues exactly
  one collective of its own (the all-reduce of [loss, stop flag]); the JSONL log still has one
  line per step with every field. On 1 rank and on 2 gloo ranks (DDP, and TP, whose gradient
  norm sums over shards).
* Clip + AdamW step: the same aten ops, the same number of times, for 2 and 8 layers (1 rank),
  and for 2 and 4 layers with TP and with PP × TP and FSDP × TP (params on several meshes).
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import runtime_tasks
import sync_tasks

STEPS, LOG_EVERY = 6, 3
SYNC_STEPS = {0, 3, 5}
STEP_FIELDS = {"step", "loss", "lr", "grad_norm", "step_time_s", "tokens_per_s", "mfu", "time"}


def assert_no_syncs_off_logging_steps(counts: dict) -> None:
    quiet = sorted(set(range(STEPS)) - SYNC_STEPS)
    for step in quiet:
        assert counts["reads"].get(step, 0) == 0, f"step {step}: host reads {counts['what'].get(step)}"
        assert counts["loop_collectives"].get(step, 0) == 1, f"step {step}: loop collectives {counts['what'].get(step)}"
    # the counter sees reads where they belong: the sync steps read the pending numbers
    assert all(counts["reads"].get(step, 0) > 0 for step in SYNC_STEPS)
    math = {counts["math_collectives"].get(step, 0) for step in range(STEPS)}
    assert len(math) == 1, f"the math's collectives vary by step: {counts['math_collectives']}"


def assert_one_line_per_step(lines: list[dict]) -> None:
    assert [line["step"] for line in lines] == list(range(STEPS))
    for line in lines:
        assert STEP_FIELDS <= set(line)
        assert line["loss"] > 0 and line["grad_norm"] > 0 and line["step_time_s"] > 0


def test_one_rank_reads_nothing_on_non_logging_steps(tmp_path):
    counts = runtime_tasks.in_one_process(sync_tasks.count_step_syncs, "dp=1", str(tmp_path), STEPS, LOG_EVERY)
    assert_no_syncs_off_logging_steps(counts)
    assert_one_line_per_step(counts["lines"])


@pytest.mark.parametrize("layout", ["dp=2", "tp=2"])
def test_two_ranks_read_nothing_on_non_logging_steps(dist_pool, tmp_path, layout):
    out = dist_pool(2).run(sync_tasks.count_step_syncs, layout, str(tmp_path), STEPS, LOG_EVERY, timeout=240)
    for counts in out:
        assert_no_syncs_off_logging_steps(counts)
    assert_one_line_per_step(out[0]["lines"])
    if layout == "dp=2":
        assert out[0]["math_collectives"][1] > 0, "DDP's gradient all-reduce is seen (and counted as math)"


def assert_same_ops(small: dict, large: dict) -> None:
    assert large["tensors"] > small["tensors"]
    assert small["ops"] == large["ops"], "clip + AdamW ops grow with the number of parameter tensors"


def test_clip_and_adamw_ops_do_not_grow_with_the_number_of_tensors():
    small = runtime_tasks.in_one_process(sync_tasks.count_optimizer_ops, "dp=1", 2)
    large = runtime_tasks.in_one_process(sync_tasks.count_optimizer_ops, "dp=1", 8)
    assert_same_ops(small, large)
    assert any("_fused_adamw" in op for op in small["ops"]), small["ops"]


@pytest.mark.parametrize(("world", "layout"), [(2, "tp=2"), (4, "pp=2,tp=2"), (4, "dp=2,tp=2,zero=3")])
def test_clip_and_adamw_ops_do_not_grow_on_distributed_layouts(dist_pool, world, layout):
    pool = dist_pool(world)
    small = pool.run(sync_tasks.count_optimizer_ops, layout, 2 * (world // 2), timeout=240)
    large = pool.run(sync_tasks.count_optimizer_ops, layout, 4 * (world // 2), timeout=240)
    for rank_small, rank_large in zip(small, large, strict=True):
        assert_same_ops(rank_small, rank_large)
