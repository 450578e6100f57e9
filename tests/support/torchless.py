"""Run a plait command in a fresh interpreter where importing torch fails (tests of the torch-free parts)."""

from __future__ import annotations

import subprocess
import sys

_SCRIPT = """
import builtins, sys
real_import = builtins.__import__
def guarded(name, *args, **kwargs):
    if name == "torch" or name.startswith("torch."):
        raise ImportError("torch is not allowed here")
    return real_import(name, *args, **kwargs)
builtins.__import__ = guarded
from plait.cli import main
code = main({argv!r})
assert code == 0, code
assert not any(m == "torch" or m.startswith("torch.") for m in sys.modules)
print("ok-without-torch")
"""


def assert_runs_without_torch(argv: list[str]) -> None:
    """``plait <argv>`` exits 0 and never imports torch."""
    out = subprocess.run([sys.executable, "-c", _SCRIPT.format(argv=list(argv))], capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ok-without-torch" in out.stdout
