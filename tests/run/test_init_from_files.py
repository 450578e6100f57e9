"""``--init-from`` file problems name the file (issue 31 item 6): a truncated safetensors file and a header
whose byte ranges lie are refused before launch, and NaN weights when they are read - instead of a
safetensors traceback, or a non-finite loss blamed on the learning rate and the data."""

from __future__ import annotations

import json
import struct

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

import hf_models
import torch

from plait.cli import main
from plait.errors import PlaitError
from plait.run.checkpoint.hf.load import load_hf_weights
from plait.spec.hf_config import model_from_hf_config

DRY = ["--global-batch", "4", "--seq-len", "16", "--device", "cpu", "--dry-run"]


@pytest.fixture
def saved(tmp_path):
    return hf_models.save(hf_models.llama(), tmp_path / "llama")


def header_of(file):
    raw = file.read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + size]), raw[8 + size:]


def write_header(file, header, data) -> None:
    text = json.dumps(header).encode()
    file.write_bytes(struct.pack("<Q", len(text)) + text + data)


def refused(capsys, directory) -> str:
    assert main(["train", "--init-from", str(directory), *DRY]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_a_truncated_weight_file_is_named(saved, capsys):
    file = saved / "model.safetensors"
    file.write_bytes(file.read_bytes()[:-100])
    err = refused(capsys, saved)
    assert str(file) in err and "truncated?" in err


def test_a_header_whose_offsets_lie_is_named(saved, capsys):
    file = saved / "model.safetensors"
    header, data = header_of(file)
    name = next(n for n in header if n != "__metadata__")
    begin, end = header[name]["data_offsets"]
    header[name]["data_offsets"] = [begin, end - 4]
    write_header(file, header, data)
    err = refused(capsys, saved)
    assert str(file) in err and f"tensor {name} bytes {begin}..{end - 4}" in err


def test_nan_weights_are_named_when_read(saved):
    model = hf_models.load(saved)
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight[0, 0] = float("nan")
    hf_models.save(model, saved)
    spec = model_from_hf_config(saved)
    with pytest.raises(PlaitError, match=r"tensor model.layers.0.mlp.up_proj.weight in model.safetensors holds NaN"):
        load_hf_weights(saved, hf_models.plait_model(spec).named_parameters(), spec, "cpu")
