"""Every plan the README and docs/*.md show can be saved and handed to ``plait train --plan ... --dry-run``.

The planner ranks only layouts the runtime runs (``--any-runtime`` aside), so the top layout of
each ``plait plan`` command in the README and the docs - in code blocks and inline - must pass every check
``plait train`` makes before launching. Commands with placeholders (``...``) or input files the
checkout does not hold are skipped; so are ``--any-runtime`` ones, which say they rank layouts
plait train does not run yet, and ``--stack`` ones for another software (priced for it, not saved).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from plait.cli import main

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FILE_FLAGS = ("--calibration", "--runs", "--cluster")


def readme_plan_commands() -> list[str]:
    text = "\n".join(path.read_text(encoding="utf-8") for path in DOCUMENTS)
    commands = []
    # fences start a line; a block in another language (```toml, ```python) is skipped whole
    for language, block in re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M):
        if language not in ("", "bash", "sh"):
            continue
        joined = re.sub(r"\\\n\s*", " ", block)
        commands += [line.split("#")[0].strip() for line in joined.splitlines()]
    commands += re.findall(r"`(plait plan [^`]+)`", text)
    out = []
    for command in commands:
        command = command.split("&&")[-1].strip()
        if command.startswith("plait plan --model") and "..." not in command and command not in out:
            out.append(command)
    return out


def runnable_in_this_checkout(argv: list[str]) -> bool:
    for flag in FILE_FLAGS:
        if flag in argv:
            value = argv[argv.index(flag) + 1]
            if value.endswith(".json") and not Path(value).exists():
                return False
    if "--stack" in argv and argv[argv.index("--stack") + 1] != "plait":
        return False
    return "--any-runtime" not in argv


COMMANDS = readme_plan_commands()


def test_the_readme_shows_plans():
    assert len(COMMANDS) >= 4


@pytest.mark.parametrize("command", COMMANDS)
def test_readme_plan_saves_and_dry_runs(command, tmp_path, capsys):
    argv = shlex.split(command)[1:]
    if not runnable_in_this_checkout(argv):
        pytest.skip("needs a file the checkout does not hold, or asks for --any-runtime")
    argv = [a for a in argv if a not in ("--explain", "--json")]
    for flag in ("--save", "--plot"):  # the test writes only into tmp_path
        if flag in argv:
            i = argv.index(flag)
            del argv[i:i + 2]
    plan = tmp_path / "plan.json"
    assert main([*argv, "--save", str(plan)]) == 0, capsys.readouterr()
    capsys.readouterr()
    # --allow-oom: these are GPU plans; on this CPU host the preflight would refuse them for host memory
    assert main(["train", "--plan", str(plan), "--dry-run", "--device", "cpu", "--allow-oom"]) == 0, \
        capsys.readouterr().err
    assert "torchrun" in capsys.readouterr().out
