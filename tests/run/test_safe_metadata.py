"""Checkpoint loading never unpickles arbitrary classes (issue 31 item 7): DCP's ``.metadata`` is read by a
restricted unpickler (plait.run.checkpoint.safe_reader). A crafted checkpoint - its manifest's checksums
recomputed, as an attacker would - is refused in one line by ``plait export`` and by a resume, and the
code its pickle names never runs."""

from __future__ import annotations

import json
import os
import pickle

import pytest

pytest.importorskip("torch")

import runtime_tasks
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from plait.cli import main
from plait.errors import PlaitError
from plait.run.checkpoint import store
from plait.run.checkpoint.safe_reader import SafeFileSystemReader


class Payload:
    """Unpickling this calls os.mkdir(marker): code execution, made visible."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return os.mkdir, (self.marker,)


def plant(checkpoint, marker) -> None:
    """Replace ``checkpoint``'s .metadata with the payload and recompute its manifest."""
    (checkpoint / ".metadata").write_bytes(pickle.dumps(Payload(str(marker))))
    manifest = json.loads((checkpoint / store.MANIFEST).read_text())
    extra = {k: v for k, v in manifest.items() if k not in ("format", "version", "step", "created", "files", "run",
                                                           "checksum")}
    store.write_manifest(checkpoint, manifest["step"], store.file_records(checkpoint, store.data_files(checkpoint)),
                         manifest["run"], extra)


# no_dist=True is this test's intent: torch still warns that it saves and loads in one process
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_the_reader_loads_dcp_metadata_and_refuses_anything_else(tmp_path):
    state = {"a": torch.arange(6.0).reshape(2, 3), "b": torch.ones(4, dtype=torch.bfloat16)}
    dcp.save(state, checkpoint_id=tmp_path / "ck", no_dist=True)
    loaded = {"a": torch.zeros(2, 3), "b": torch.zeros(4, dtype=torch.bfloat16)}
    dcp.load(loaded, storage_reader=SafeFileSystemReader(tmp_path / "ck"), no_dist=True)
    assert torch.equal(loaded["a"], state["a"]) and torch.equal(loaded["b"], state["b"])
    marker = tmp_path / "pwned"
    (tmp_path / "ck" / ".metadata").write_bytes(pickle.dumps(Payload(str(marker))))
    with pytest.raises(CheckpointException, match="posix.mkdir is not part of DCP metadata"):
        dcp.load(loaded, storage_reader=SafeFileSystemReader(tmp_path / "ck"), no_dist=True)
    assert not marker.exists()


def test_a_crafted_checkpoint_is_refused_by_export_and_resume(tmp_path, capsys):
    runtime_tasks.reference(steps=1, checkpoint_dir=str(tmp_path / "ckpt"))
    checkpoint = tmp_path / "ckpt" / store.final_name(1)
    marker = tmp_path / "pwned"
    plant(checkpoint, marker)
    store.verify(checkpoint)  # the checksums pass: only the unpickler stands in the way
    assert main(["export", "--checkpoint", str(checkpoint), "--to", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert "is not a checkpoint's DCP metadata" in err and "posix.mkdir" in err and err.count("\n") == 1, err
    with pytest.raises(PlaitError, match="cannot load checkpoint .*posix.mkdir is not part of DCP metadata"):
        runtime_tasks.reference(steps=2, resume_from=str(checkpoint))
    assert not marker.exists() and not (tmp_path / "hf").exists()
