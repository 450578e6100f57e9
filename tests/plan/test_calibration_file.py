"""The calibration file: one module holds its format tag, reader and writer."""

from __future__ import annotations

import json

import pytest

from plait.errors import PlaitError
from plait.plan.calibration import FORMAT, read_calibration, write_calibration
from plait.plan.params import DEFAULT_PARAMS


def test_written_file_reads_back(tmp_path):
    path = tmp_path / "sub" / "cal.json"
    write_calibration(path, {"kind": "fit", "gpu": "h100", "device": "cuda",
                             "params": {"elementwise_passes": 60.0}, "gpu_overrides": {"gemm_efficiency": 0.7}})
    data = json.loads(path.read_text())
    assert list(data)[0] == "format" and data["format"] == FORMAT
    calibration = read_calibration(path)
    assert calibration.gpu == "h100-sxm" and calibration.params.elementwise_passes == 60.0
    assert dict(calibration.gpu_overrides) == {"gemm_efficiency": 0.7}


def test_a_file_without_a_format_tag_is_read_as_before(tmp_path):
    path = tmp_path / "legacy.json"
    path.write_text(json.dumps({"params": {}}))
    assert read_calibration(path).params == DEFAULT_PARAMS


def test_another_format_tag_is_refused_in_one_line(tmp_path):
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"format": "plait-plan/1", "params": {}}))
    with pytest.raises(PlaitError) as info:
        read_calibration(path)
    assert str(info.value) == (f"{path}: not a plait calibration file (format 'plait-plan/1', "
                               f"expected '{FORMAT}')")
    with pytest.raises(PlaitError, match="is not"):
        write_calibration(tmp_path / "x.json", {"format": "plait-plan/1"})


def test_unwritable_path_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(PlaitError, match="^cannot write"):
        write_calibration(blocker / "cal.json", {"params": {}})
