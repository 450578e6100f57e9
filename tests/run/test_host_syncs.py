"""The training loop reads nothing on the host on non-logging steps, and clipping plus AdamW
run as a fixed number of (foreach / fused) ops, however many parameter tensors there are.

* ``--log-every 3`` over 6 steps: steps 0, 2 and 5 (0-based: the first, the 3rd and the last) are
  sync steps; on steps 1, 3 and 4 no tensor value is read on the host (``sync_tasks.StepCounter``) and the loop issues exactly
  one collective of its own (the all-reduce of [loss, stop flag]); the JSONL log still has one
  line per step with every field. On 1 rank and on 2 gloo ranks (DDP, and TP, whose gradient
  norm sums over shards).
* A stop request (SIGTERM) seen in a non-logging step ends the run one step later on every
  rank, with its checkpoint; a NaN loss between logging steps stops the run naming its step,
  before the next checkpoint would be saved.
* Clip + AdamW step: the same aten ops, the same number of times, for 2 and 6 layers (1 rank),
  and for 2 and 4 layers with TP and with PP × TP and FSDP × TP (params on several meshes).
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import checkpoint_tasks
import runtime_tasks
import sync_tasks

from plait.run.checkpoint import store

STEPS, LOG_EVERY = 6, 3
SYNC_STEPS = {0, 2, 5}
STEP_FIELDS = {"step", "loss", "lr", "grad_norm", "step_time_s", "tokens_per_s", "mfu", "time"}


def assert_no_syncs_off_logging_steps(counts: dict) -> None:
    quiet = sorted(set(range(STEPS)) - SYNC_STEPS)
    for step in quiet:
        assert counts["reads"].get(step, 0) == 0, f"step {step}: host reads {counts['what'].get(step)}"
        assert counts["loop_collectives"].get(step, 0) == 1, f"step {step}: loop collectives {counts['what'].get(step)}"
    # the counter sees reads where they belong: the sync steps read the pending numbers
    assert all(counts["reads"].get(step, 0) > 0 for step in SYNC_STEPS)


def assert_one_line_per_step(lines: list[dict]) -> None:
    assert [line["step"] for line in lines] == list(range(1, STEPS + 1))  # JSONL steps count from 1
    for line in lines:
        assert STEP_FIELDS <= set(line)
        assert line["loss"] > 0 and line["grad_norm"] > 0 and line["step_time_s"] > 0


def test_one_rank_reads_nothing_on_non_logging_steps(tmp_path):
    counts = runtime_tasks.in_one_process(sync_tasks.count_step_syncs, "dp=1", str(tmp_path), STEPS, LOG_EVERY)
    assert_no_syncs_off_logging_steps(counts)
    assert_one_line_per_step(counts["lines"])


# tp=2 runs 2 micro-batches of 2 sequences (mbs=2), not 4 of 1: a host read in a micro-batch would show in
# either, and a tp micro-batch is ~50 gloo collectives
@pytest.mark.parametrize("layout", ["dp=2", "tp=2,mbs=2"])
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
    large = runtime_tasks.in_one_process(sync_tasks.count_optimizer_ops, "dp=1", 6)
    assert_same_ops(small, large)
    assert any("_fused_adamw" in op for op in small["ops"]), small["ops"]


# the micro-batches are as large as the layouts allow (mbs; pp: 2 micro-batches for its 2 stages): the ops
# counted are clip's and AdamW's, after the forward-backward, and a tp micro-batch is ~50 gloo collectives
@pytest.mark.parametrize(("world", "layout"), [(2, "tp=2,mbs=4"), (4, "pp=2,tp=2,mbs=2"), (4, "dp=2,tp=2,zero=3,mbs=2")])
def test_clip_and_adamw_ops_do_not_grow_on_distributed_layouts(dist_pool, world, layout):
    pool = dist_pool(world)
    small = pool.run(sync_tasks.count_optimizer_ops, layout, 2 * (world // 2), timeout=240)
    large = pool.run(sync_tasks.count_optimizer_ops, layout, 4 * (world // 2), timeout=240)
    for rank_small, rank_large in zip(small, large, strict=True):
        assert_same_ops(rank_small, rank_large)


def test_a_stop_request_in_a_non_logging_step_ends_the_run_one_step_later(dist_pool, tmp_path):
    # the stand-in SIGTERM is first set in step 1, not a logging step (--log-every 4): its flag is
    # read in step 2, and every rank stops after step 2 and saves the checkpoint of 3 steps
    out = dist_pool(2).run(checkpoint_tasks.train, "dp=2", stop_after=2, steps=STEPS, with_params=False,
                           checkpoint_dir=str(tmp_path), log_every=4)
    for rank in out:
        assert rank["steps"] == [0, 1, 2] and rank["summary"]["stopped_early"]
        assert rank["summary"]["checkpoints"] == [3]
    assert [p.name for p in store.complete_dirs(tmp_path)] == [store.final_name(3)]


def test_a_non_finite_step_between_logging_steps_is_named_before_any_checkpoint(dist_pool, tmp_path):
    # NaN loss in step 1 (not a logging step); step 2 precedes a checkpoint save (every 3), so it
    # reads steps 1 and 2 before its optimizer step and stops, naming step 1 (printed 1-based: step 2,
    # read at step 3, as the JSONL counts); nothing is saved
    with pytest.raises(Exception, match=r"loss is nan at step 2 .*read at step 3 .*--on-nan skip"):
        dist_pool(2).run(checkpoint_tasks.train_with_fault, "dp=2", "rank=1,step=1,kind=nan", steps=STEPS,
                         log_every=4, checkpoint_dir=str(tmp_path), checkpoint_every=3)
    assert store.complete_dirs(tmp_path) == []
