"""Outputs honour the umask (issue 31 item 8): a checkpoint (manifest, DCP files), a token file, a
plan-like atomic output and an exported Hugging Face directory (safetensors included) are 0644
under the usual umask 022 and 0640 under 027 - not mkstemp's or safetensors' 0600, which kept a
teammate from resuming or exporting a checkpoint in a shared directory. A file an atomic write
replaces keeps its mode."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from plait.atomic import atomic_write_text


@pytest.fixture
def umask():
    previous = os.umask(0o022)

    def set_umask(value: int) -> None:
        os.umask(value)

    yield set_umask
    os.umask(previous)


def modes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): oct(stat.S_IMODE(p.stat().st_mode)) for p in sorted(root.rglob("*"))
            if p.is_file()}


@pytest.mark.parametrize(("mask", "mode"), [(0o022, "0o644"), (0o027, "0o640")], ids=["umask022", "umask027"])
def test_atomic_outputs_get_the_umask_mode_and_replaced_files_keep_theirs(tmp_path, umask, mask, mode):
    umask(mask)
    atomic_write_text(tmp_path / "plan.json", "{}", "plan")
    assert modes(tmp_path) == {"plan.json": mode}
    os.chmod(tmp_path / "plan.json", 0o604)
    atomic_write_text(tmp_path / "plan.json", "{} ", "plan")
    assert modes(tmp_path) == {"plan.json": "0o604"}


def test_a_checkpoint_and_its_export_are_readable_by_the_group_and_others(tmp_path, umask):
    pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    import runtime_tasks

    from plait.cli import main

    umask(0o022)
    runtime_tasks.reference(steps=1, checkpoint_dir=str(tmp_path / "ckpt"))
    assert main(["data", "prepare", "--out", str(tmp_path / "corpus.tok")]) == 0
    assert main(["export", "--checkpoint", str(tmp_path / "ckpt"), "--to", str(tmp_path / "hf")]) == 0
    found = modes(tmp_path)
    assert "ckpt/step_00000001/manifest.json" in found and "hf/model.safetensors" in found, found
    assert "corpus.tok" in found
    assert set(found.values()) == {"0o644"}, found
