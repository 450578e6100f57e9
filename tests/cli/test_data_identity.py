"""The run's data is recorded by absolute path and fingerprint (issue 31 item 3): a resume from another
working directory finds it, and another token file at that path is refused in one line unless
``--allow-data-change``. In-process, no workers: checkpoints as in tests/cli/test_requeue.py."""

from __future__ import annotations

import dataclasses
import json
import zlib

import numpy as np
from test_requeue import ARGS, fake_checkpoint, request_of

from plait.cli import main
from plait.run.data.tokens import HEADER, MAGIC, VERSION
from plait.run.launcher.resolve import fresh_config


def write_tokens(path, n_tokens: int, seed: int) -> None:
    ids = np.random.default_rng(seed).integers(0, 512, n_tokens).astype("<u2")
    path.write_bytes(HEADER.pack(MAGIC, VERSION, 2, 512, n_tokens, zlib.crc32(ids.tobytes()), 0, b"random")
                     + ids.tobytes())


def test_data_is_recorded_absolutely_and_checked_on_resume(tmp_path, monkeypatch, capsys):
    (tmp_path / "data").mkdir()
    (tmp_path / "elsewhere").mkdir()
    tokens = tmp_path / "data" / "train.tok"
    write_tokens(tokens, 4000, seed=0)
    monkeypatch.chdir(tmp_path / "data")
    config = fresh_config(dataclasses.replace(request_of(), data="train.tok")).config
    assert config.job.data == str(tokens)
    assert config.job.data_id == f"crc32={zlib.crc32(tokens.read_bytes()[64:]):08x},tokens=4000,bytes=8064"
    ckpt = tmp_path / "ckpt"
    fake_checkpoint(ckpt, 2, run=config.to_dict())

    monkeypatch.chdir(tmp_path / "elsewhere")  # before: "token file train.tok not found"
    resume = ["train", "--resume", str(ckpt), "--device", "cpu", "--nproc-per-node", "2", "--dry-run"]
    assert main(resume) == 0, capsys.readouterr().err
    saved = json.loads(capsys.readouterr().out.split("config.json:\n", 1)[1])["job"]
    assert saved["data"] == str(tokens) and saved["data_id"] == config.job.data_id

    write_tokens(tokens, 4000, seed=1)  # another file at the same path: refused, one line
    assert main(resume) == 2
    err = capsys.readouterr().err
    assert f"token file {tokens} is not the one checkpoint" in err and "--allow-data-change" in err, err
    assert len(err.strip().splitlines()) == 1
    assert main(["train", *ARGS, "--data", str(tokens), "--checkpoint-dir", str(ckpt), "--dry-run"]) == 2
    assert "is not the one checkpoint" in capsys.readouterr().err  # the requeue's command line too
    assert main([*resume, "--allow-data-change"]) == 0
    captured = capsys.readouterr()
    assert f"--allow-data-change: training on {tokens}" in captured.out, captured.err
    changed = json.loads(captured.out.split("config.json:\n", 1)[1])["job"]
    assert changed["data_id"] != config.job.data_id  # the new checkpoints record the new file
