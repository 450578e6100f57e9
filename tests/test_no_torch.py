"""The planner must import and run without torch."""

import subprocess
import sys

SCRIPT = """
import builtins, sys
real_import = builtins.__import__
def guarded(name, *args, **kwargs):
    if name == "torch" or name.startswith("torch."):
        raise ImportError("torch is not allowed in the planner")
    return real_import(name, *args, **kwargs)
builtins.__import__ = guarded
from plait.cli import main
code = main(["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16",
             "--global-batch", "64", "--seq-len", "4096", "--top", "2"])
assert code == 0, code
assert not any(m == "torch" or m.startswith("torch.") for m in sys.modules)
print("ok-without-torch")
"""


def test_plan_runs_with_torch_blocked():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "ok-without-torch" in out.stdout
