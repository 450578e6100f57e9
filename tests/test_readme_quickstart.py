"""The README's first screen - a virtual environment, the install, a plan - run as a script.

CI (``.ci/run``, in a fresh clone) runs the Quickstart's two commands word for word: the first
creates ``.venv``, activates it, installs ``.[cpu,test]`` and runs the ``plait plan`` line; the
second runs the suite in that environment. A full ``pip install`` into a new environment takes
minutes on two cores (about 4.5 on this machine, torch's wheel included) and needs the package
index, so no test repeats it; this file checks what CI's run rests on, cheaply:

* ``.ci/run``'s two commands are the README's, character for character (so CI runs the
  first screen as the README writes it, and the README's test command);
* the first command creates the environment before installing into it and activates it in the
  same shell (a Debian/Ubuntu system Python refuses ``pip install`` outside one), and the
  extras it names exist in pyproject.toml;
* its ``plait plan`` line runs for real (a subprocess, as a user's shell runs it) and ranks the
  layouts the README's sample output shows, in that order.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
CI = (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def quickstart_commands() -> list[str]:
    """The bash blocks of the README's Quickstart section, one command each."""
    section = README.split("\n## Quickstart\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```bash\n(.*?)^```", section, flags=re.S | re.M)
    return [block.strip() for block in blocks]


def ci_command(label: str) -> str:
    """The line after ``# README <label>:`` in .ci/run."""
    lines = CI.splitlines()
    return lines[lines.index(f"# README {label}:") + 1].strip()


def test_ci_runs_the_readme_quickstart_word_for_word():
    first, tests = quickstart_commands()
    assert ci_command("first command") == first
    assert ci_command("test command") == tests == "python -m pytest -q"
    assert CI.index("# README first command:") < CI.index("# README test command:")  # the suite runs in .venv


def test_the_first_command_installs_into_a_new_virtual_environment():
    steps = [step.strip() for step in quickstart_commands()[0].split("&&")]
    assert len(steps) == 4, steps
    create, activate, install, plan = (shlex.split(step) for step in steps)
    assert create[:3] == ["python3", "-m", "venv"]
    assert activate == [".", f"{create[3]}/bin/activate"]  # sourced: the rest of the line runs in it
    assert install[:3] == ["pip", "install", "-e"]
    extras = re.fullmatch(r"\.\[([\w,]+)\]", install[3]).group(1).split(",")
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert set(extras) <= set(declared["optional-dependencies"])
    assert plan[:2] == ["plait", "plan"]
    assert "plait = \"plait.cli:main\"" in (ROOT / "pyproject.toml").read_text(encoding="utf-8")


def test_the_first_commands_plan_ranks_what_the_readme_shows():
    plan = shlex.split(quickstart_commands()[0].split("&&")[-1])
    intro = README.split("\n## Quickstart\n", 1)[0]
    assert f"What `{shlex.join(plan)}` prints:" in intro  # the sample output is of this very command
    shown = re.findall(r"^│ \d+ │ (\S+)", intro, flags=re.M)
    assert len(shown) == int(plan[plan.index("--top") + 1])
    env = {**os.environ, "COLUMNS": "200"}
    done = subprocess.run([sys.executable, "-m", "plait.cli", *plan[1:]], capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert re.findall(r"^│ \d+ │ (\S+)", done.stdout, flags=re.M) == shown, done.stdout
