"""Run a plait command, or any code, in a fresh interpreter where importing torch fails (tests of the
torch-free parts)."""

from __future__ import annotations

import subprocess
import sys

_GUARD = """
import builtins
real_import = builtins.__import__
def guarded(name, *args, **kwargs):
    if name == "torch" or name.startswith("torch."):
        raise ImportError("torch imported")
    return real_import(name, *args, **kwargs)
builtins.__import__ = guarded
"""

_COMMAND = """
import sys
from plait.cli import main
code = main({argv!r})
assert code == 0, code
assert not any(m == "torch" or m.startswith("torch.") for m in sys.modules)
print("ok-without-torch")
"""


def run_without_torch(code: str) -> subprocess.CompletedProcess:
    """``code`` run by a fresh interpreter in which any import of torch raises ImportError("torch
    imported"); its completed process (stdout and stderr as text)."""
    return subprocess.run([sys.executable, "-c", _GUARD + code], capture_output=True, text=True, timeout=120,
                          check=False)


def assert_runs_without_torch(argv: list[str]) -> None:
    """``plait <argv>`` exits 0 and never imports torch."""
    out = run_without_torch(_COMMAND.format(argv=list(argv)))
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ok-without-torch" in out.stdout
