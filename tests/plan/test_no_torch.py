"""The planner must import and run without torch."""

from torchless import assert_runs_without_torch


def test_plan_runs_with_torch_blocked():
    assert_runs_without_torch(["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16",
                               "--global-batch", "64", "--seq-len", "4096", "--top", "2"])
