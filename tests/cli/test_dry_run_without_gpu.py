"""``plait train --dry-run --device cuda`` on a machine without a GPU (a login node) checks the run as
the GPU nodes will run it: the plan's GPU and its memory, not this host's; without ``--device cuda``
the host-memory refusal says how to check it that way."""

from __future__ import annotations

import pytest
import torch

from plait.cli import main

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine that has no GPU")

PLAN = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16", "--global-batch", "64",
        "--seq-len", "131072", "--top", "1"]
WHERE = ["--nproc-per-node", "8", "--nnodes", "2", "--rdzv-endpoint", "node0:29500"]


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    assert main([*PLAN, "--save", str(path)]) == 0
    return path


def test_a_gpu_plan_dry_runs_here_as_on_its_gpus(plan_file, capsys):
    capsys.readouterr()
    assert main(["train", "--plan", str(plan_file), "--dry-run", "--device", "cuda", *WHERE]) == 0
    captured = capsys.readouterr()
    assert "this machine has no GPU: checked as a run of 16 process(es) on h100-sxm GPUs" in captured.err
    assert "torchrun" in captured.out and '"gpu": "h100-sxm"' in captured.out  # predicted for the plan's GPU


def test_auto_device_names_the_way_to_check_the_gpu_run(plan_file, capsys):
    capsys.readouterr()
    assert main(["train", "--plan", str(plan_file), "--dry-run", *WHERE]) == 2
    err = capsys.readouterr().err
    assert "host memory" in err and "--device cuda --dry-run checks the run on h100-sxm GPUs" in err


def test_no_gpu_named_is_refused_in_one_line_and_gpu_names_it(capsys):
    tiny = ["train", "--model", "tiny", "--layout", "dp=2,mbs=1", "--global-batch", "8", "--seq-len", "128",
            "--dry-run", "--device", "cuda", "--nproc-per-node", "2"]
    assert main(tiny) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("plait: error: --dry-run --device cuda on a machine without a GPU: name the GPU")
    assert main([*tiny, "--gpu", "h100-sxm"]) == 0
    assert "checked as a run of 2 process(es) on h100-sxm GPUs" in capsys.readouterr().err
