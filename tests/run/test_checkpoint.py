"""Checkpoints: exact resume, resume on another layout or world size, async save, pruning.

Every run trains the tiny model on CPU (gloo, fp32) for 6 steps of a global batch of 8 × 32
tokens. A run stopped after k steps (as SIGTERM would stop it) writes a checkpoint; a second
run resumes from it and must reproduce the uninterrupted run:

  * same layout: bit-exact losses and final parameters (the state round-trips exactly, and
    the learning rate, data order and dropout RNG are functions of the step);
  * another layout or world size: losses within tolerances.LOSS_RTOL, parameters within
    tolerances.param_atol(6) - derived from fp32 rounding (tests/support/tolerances.py), since
    the layouts sum in different orders.
"""

from __future__ import annotations

import functools
import json

import pytest

pytest.importorskip("torch")

import checkpoint_tasks
import runtime_tasks
import tolerances
import torch

from plait.errors import PlaitError
from plait.run.checkpoint import store

STEPS = 6
LOSS_RTOL = tolerances.LOSS_RTOL
PARAM_ATOL = tolerances.param_atol(STEPS)


def assert_close_run(resumed: dict, full: dict, start: int, exact: bool) -> None:
    assert resumed["steps"] == list(range(start, STEPS))
    got, want = resumed["losses"], full["losses"][start:]
    if exact:
        assert got == want
    else:
        assert got == pytest.approx(want, rel=LOSS_RTOL)
    assert set(resumed["params"]) == set(full["params"])
    for name, value in full["params"].items():
        if exact:
            assert torch.equal(resumed["params"][name], value), name
        else:
            diff = (resumed["params"][name] - value).abs().max().item()
            assert diff <= PARAM_ATOL, f"{name}: {diff:.2e}"


@pytest.fixture(scope="module")
def uninterrupted():
    """The single-process run of all STEPS steps (the reference for every resume)."""
    return runtime_tasks.reference(steps=STEPS)


@pytest.fixture(scope="module")
def full_runs(dist_pool):
    """``full_runs(layout)``: the uninterrupted STEPS-step run of ``layout`` on 2 ranks, run once per module
    (the same-layout resumes and the async-checkpoint test read the dp=2,zero=3 one)."""
    return functools.cache(lambda layout: dist_pool(2).run(checkpoint_tasks.train, layout, steps=STEPS)[0])


# tp=2 runs 2 micro-batches of 4 sequences (mbs=4), not 8 of 1: a resume restores the same state
# whatever the micro-batching, and a tp micro-batch is ~50 gloo collectives (4x the run's time with 8)
@pytest.mark.parametrize("layout", ["dp=2,zero=3", "pp=2,vpp=2", "tp=2,ckpt=selective,mbs=4"])
def test_resume_on_the_same_layout_is_bit_exact(dist_pool, full_runs, tmp_path, layout):
    pool = dist_pool(2)
    full = full_runs(layout)
    stopped = pool.run(checkpoint_tasks.train, layout, stop_after=2, steps=STEPS, with_params=False,
                       checkpoint_dir=str(tmp_path))[0]
    assert stopped["steps"] == [0, 1] and stopped["summary"]["stopped_early"]
    assert stopped["losses"] == full["losses"][:2]
    checkpoint = tmp_path / store.final_name(2)
    assert store.verify(checkpoint).step == 2
    resumed = pool.run(checkpoint_tasks.train, layout, steps=STEPS, resume_from=str(checkpoint))[0]
    assert resumed["summary"]["start_step"] == 2
    assert_close_run(resumed, full, 2, exact=True)


SAVE_LAYOUT = "dp=4,zero=3"
# the tp layouts run fewer, larger micro-batches (mbs=2) than the save did: the resumed state is the
# same whatever the micro-batching, and a tp micro-batch is ~50 gloo collectives
RESUME_LAYOUTS = [
    (4, "dp=2,tp=2,zero=3,mbs=2"),
    (4, "pp=2,dp=2"),
    (4, "pp=2,tp=2,ckpt=full,mbs=2"),
    (2, "dp=2"),
    (2, "pp=2,schedule=gpipe"),
    (4, "dp=2,cp=2,zero=3"),
]


@pytest.fixture(scope="module")
def saved_under_fsdp4(dist_pool, tmp_path_factory):
    """A checkpoint after 3 of 6 steps, written by FSDP ZeRO-3 over 4 ranks."""
    root = tmp_path_factory.mktemp("ckpt-dp4")
    pool = dist_pool(4)
    stopped = pool.run(checkpoint_tasks.train, SAVE_LAYOUT, stop_after=3, steps=STEPS, with_params=False,
                       checkpoint_dir=str(root))[0]
    assert stopped["steps"] == [0, 1, 2]
    return store.verify(root / store.final_name(3))


@pytest.mark.parametrize(("world", "layout"), RESUME_LAYOUTS)
def test_resume_on_another_layout_matches_the_uninterrupted_run(dist_pool, saved_under_fsdp4, uninterrupted,
                                                                world, layout):
    resumed = dist_pool(world).run(checkpoint_tasks.train, layout, steps=STEPS,
                                   resume_from=str(saved_under_fsdp4.path))[0]
    assert_close_run(resumed, uninterrupted, 3, exact=False)


def test_resume_in_a_single_process(saved_under_fsdp4, uninterrupted):
    resumed = runtime_tasks.reference(steps=STEPS, resume_from=str(saved_under_fsdp4.path))
    assert resumed["losses"] == pytest.approx(uninterrupted["losses"][3:], rel=LOSS_RTOL)
    for name, value in uninterrupted["params"].items():
        assert (resumed["params"][name] - value).abs().max().item() <= PARAM_ATOL, name


def test_periodic_checkpoints_keep_the_newest(dist_pool, tmp_path):
    pool = dist_pool(2)
    run = pool.run(checkpoint_tasks.train, "dp=2", steps=STEPS, with_params=False, checkpoint_dir=str(tmp_path),
                   checkpoint_every=2, keep_checkpoints=2)[0]
    assert run["summary"]["checkpoints"] == [2, 4, 6]
    assert [p.name for p in store.complete_dirs(tmp_path)] == [store.final_name(4), store.final_name(6)]
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
    manifest = store.verify(tmp_path / store.final_name(6)).manifest
    assert manifest["layout"].startswith("dp=2,") and manifest["world_size"] == 2
    assert manifest["run"]["job"]["global_batch"] == 8 and manifest["run"]["job"]["model"]["name"] == "tiny"
    assert ".metadata" in manifest["files"]


def test_async_checkpoints_every_step_commit_while_training_and_resume_exactly(dist_pool, full_runs, tmp_path):
    pool = dist_pool(2)
    full = full_runs("dp=2,zero=3")
    run = pool.run(checkpoint_tasks.train, "dp=2,zero=3", steps=STEPS, with_params=False, checkpoint_dir=str(tmp_path),
                   checkpoint_every=1, keep_checkpoints=0, async_checkpoint=True)[0]
    assert run["losses"] == full["losses"]
    assert run["summary"]["checkpoints"] == list(range(1, STEPS + 1))
    assert [store.verify(p).step for p in store.complete_dirs(tmp_path)] == list(range(1, STEPS + 1))
    resumed = pool.run(checkpoint_tasks.train, "dp=2,zero=3", steps=STEPS,
                       resume_from=str(tmp_path / store.final_name(3)))[0]
    assert_close_run(resumed, full, 3, exact=True)


def test_async_save_holds_the_values_at_save_time(dist_pool, tmp_path):
    pool = dist_pool(2)
    out = pool.run(checkpoint_tasks.save_then_scribble, "dp=2,zero=3", str(tmp_path), steps=3)
    checkpoint = store.verify(tmp_path / store.final_name(3))
    # the scribbled model must be restored to its pre-save values by loading the checkpoint
    resumed = runtime_tasks.reference(steps=4, resume_from=str(checkpoint.path))
    assert len(resumed["losses"]) == 1
    reloaded = pool.run(checkpoint_tasks.train, "dp=2", steps=4, with_params=True,
                        resume_from=str(checkpoint.path), optim=runtime_tasks.OPTIM.__class__(lr=0.0, warmup_steps=1,
                                                                                             weight_decay=0.0))[0]
    for name, value in out[0]["before"].items():
        assert torch.equal(reloaded["params"][name], value), name


def test_loading_another_models_checkpoint_is_refused(dist_pool, saved_under_fsdp4):
    with pytest.raises(Exception, match="holds model tiny, not tiny-gpt"):
        dist_pool(2).run(checkpoint_tasks.train, "dp=2", steps=STEPS, model="tiny-gpt",
                         resume_from=str(saved_under_fsdp4.path))


def test_manifest_detects_truncation_and_corruption(saved_under_fsdp4, tmp_path):
    import shutil

    for damage in ("truncate", "flip", "delete"):
        copy = tmp_path / damage / store.final_name(3)
        shutil.copytree(saved_under_fsdp4.path, copy)
        victim = min(p for p in copy.iterdir() if p.suffix == ".distcp")
        data = victim.read_bytes()
        if damage == "truncate":
            victim.write_bytes(data[: len(data) // 2])
        elif damage == "flip":
            victim.write_bytes(data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])
        else:
            victim.unlink()
        with pytest.raises(PlaitError, match=r"corrupt|incomplete"):
            store.verify(copy)
    manifest = json.loads((saved_under_fsdp4.path / store.MANIFEST).read_text())
    assert all(len(record["crc32"]) == 8 for record in manifest["files"].values())


def test_nan_loss_skips_the_step_when_asked_and_stops_naming_it_otherwise(dist_pool):
    pool = dist_pool(2)
    skipped = pool.run(checkpoint_tasks.train_with_fault, "dp=2", "rank=1,step=2,kind=nan", steps=4, on_nan="skip")[0]
    clean = pool.run(checkpoint_tasks.train, "dp=2", steps=4, with_params=False)[0]
    assert skipped["steps"] == [0, 1, 2, 3]
    assert skipped["losses"][:2] == clean["losses"][:2]
    assert skipped["losses"][2] != skipped["losses"][2]  # NaN, recorded
    assert skipped["losses"][3] != clean["losses"][3]  # the step-2 update was skipped
    with pytest.raises(Exception, match=r"loss is nan at step 3 .*--on-nan skip"):
        pool.run(checkpoint_tasks.train_with_fault, "dp=2", "rank=0,step=2,kind=nan", steps=4)


def test_worker_replans_when_torchrun_gives_another_world_size(dist_pool):
    from plait.spec.layout import Layout

    layouts = dist_pool(2).run(checkpoint_tasks.elastic_layout, "dp=4,zero=3")
    assert len(set(layouts)) == 1, "every rank must choose the same layout"
    assert Layout.parse(layouts[0]).world_size == 2


def test_disk_full_during_a_save_stops_with_the_reason_and_keeps_the_last_checkpoint(dist_pool, tmp_path):
    with pytest.raises(Exception, match=r"could not write checkpoint .*No space left on device.*previous checkpoints"):
        dist_pool(2).run(checkpoint_tasks.train_with_full_disk, "dp=2", 4, steps=STEPS, checkpoint_dir=str(tmp_path),
                         checkpoint_every=2)
    assert [p.name for p in store.complete_dirs(tmp_path)] == [store.final_name(2)]
    store.verify(tmp_path / store.final_name(2))
