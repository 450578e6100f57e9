"""The planner must import and run without torch."""

from torchless import assert_runs_without_torch


def test_plan_runs_with_torch_blocked():
    assert_runs_without_torch(["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16",
                               "--global-batch", "64", "--seq-len", "4096", "--top", "2"])


def test_an_moe_plan_explained_runs_with_torch_blocked():
    assert_runs_without_torch(["plan", "--model", "deepseek-v3", "--cluster", "dgx-h100", "--gpus", "2048",
                               "--global-batch", "15360", "--seq-len", "4096", "--layout",
                               "dp=128,pp=16,ep=64,zero=1,precision=fp8,ckpt=balanced,mbs=1,split=uneven", "--explain"])
