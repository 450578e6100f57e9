"""A worker that neither saves, resumes nor pipelines never imports DCP or torch.distributed.pipelining
(together about as slow to import as torch itself): one tiny training step in a fresh process,
then (the control) one that saves a checkpoint, which does import DCP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

SRC = Path(__file__).resolve().parents[2] / "src"
HEAVY = ("torch.distributed.checkpoint", "torch.distributed.pipelining")

SCRIPT = """
import json, os, sys, tempfile
import torch, torch.distributed as dist
import plait.run.worker  # what `python -m plait.run.worker` imports
from plait.run.config import CheckpointConfig, RunConfig, RuntimeConfig, TrainJob
from plait.run.trainer import run_training
from plait.spec.layout import Layout
from plait.spec.models import get_model

torch.set_num_threads(1)
with tempfile.TemporaryDirectory() as tmp:
    dist.init_process_group("gloo", store=dist.FileStore(os.path.join(tmp, "store"), 1), rank=0, world_size=1)
    job = TrainJob(model=get_model("tiny"), layout=Layout.parse(sys.argv[1]), global_batch=2, seq_len=16, steps=1)
    out = {}
    for name, saving in (("plain", CheckpointConfig()), ("saving", CheckpointConfig(dir=os.path.join(tmp, "ck")))):
        result = run_training(RunConfig(job=job, checkpoint=saving, runtime=RuntimeConfig(device="cpu")),
                              device=torch.device("cpu"))
        out[name] = {"loss": result.records[0].loss,
                     "heavy": sorted({m.split(".")[2] for m in sys.modules if m.startswith(tuple(sys.argv[2:]))})}
    dist.destroy_process_group()
print(json.dumps(out))
"""


def _train_in_fresh_process(layout: str) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, "-c", SCRIPT, layout, *HEAVY], capture_output=True, text=True,
                          timeout=180, env=env, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_plain_run_imports_neither_dcp_nor_pipelining():
    out = _train_in_fresh_process("dp=1")
    assert out["plain"]["loss"] > 0
    assert out["plain"]["heavy"] == []
    assert out["saving"]["heavy"] == ["checkpoint"]  # the check sees an import when there is one
