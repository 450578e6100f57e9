"""The checkpoint benchmark's smoke run: tiny model, sync and async save, verify, load, a results table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

BENCH = Path(__file__).resolve().parents[2] / "bench" / "checkpoint_bench.py"


def test_checkpoint_bench_smoke(tmp_path):
    proc = subprocess.run([sys.executable, str(BENCH), "--model", "tiny", "--async", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, check=False, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "async save: training stall" in proc.stdout
    record = json.loads((tmp_path / "checkpoint.json").read_text())["result"]
    # fp32 weights + two fp32 Adam moments: 12 bytes per parameter, plus per-tensor metadata
    assert 12.0 <= record["bytes"] / record["parameters"] < 13.0
    for key in ("save_s", "load_s", "verify_s", "async_stall_s", "async_commit_s"):
        assert record[key] > 0, key
    assert "| checkpoint size" in (tmp_path / "checkpoint.md").read_text()
