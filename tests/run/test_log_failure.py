"""A metrics log that cannot be written (issue 31 item 5): the run stops after a checkpoint is saved, with
one line naming the log and the reason, instead of a traceback that loses the steps since the last
checkpoint; a checkpoint write on a full disk says "No space left on device" whatever torch's writer
said."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

pytest.importorskip("torch")

import checkpoint_tasks
from torch.distributed.checkpoint.api import CheckpointException

from plait.run.checkpoint import dcp, store


def test_a_failing_log_write_stops_after_a_checkpoint_with_one_line(dist_pool, tmp_path):
    # /dev/full: every write fails with ENOSPC, as on a full disk
    out = dist_pool(2).run(checkpoint_tasks.train_with_failing_log, "dp=2", steps=6, checkpoint_dir=str(tmp_path))
    error = out[0]["error"]
    assert error.startswith("could not write the metrics log /dev/full (No space left on device); training "
                            "stopped after step "), error
    assert "\n" not in error and out[1]["error"] is None
    saved = store.complete_dirs(tmp_path)
    assert len(saved) == 1 and f"checkpoint {saved[0].name} saved in {tmp_path}" in error
    assert store.verify(saved[0]).step < 6


def test_a_full_disk_is_named_whatever_the_writer_says(tmp_path, monkeypatch):
    torch_said = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    monkeypatch.setattr(dcp, "free_bytes", lambda directory: 0)
    assert dcp.write_failure(torch_said, tmp_path / "step_2.tmp").startswith("No space left on device")
    monkeypatch.setattr(dcp, "free_bytes", lambda directory: 10 * 2**30)
    assert dcp.write_failure(torch_said, tmp_path) == str(torch_said)  # not full: the writer's words
    wrapped = CheckpointException("save failed", {1: (OSError(errno.ENOSPC, "x", "/ck/__1_0.distcp"), "tb")})
    assert dcp.write_failure(wrapped, Path("/ck")) == "No space left on device: /ck/__1_0.distcp"
