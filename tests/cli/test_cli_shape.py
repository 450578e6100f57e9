"""The command line has one shape: every command is a module of ``plait.cli.COMMANDS`` with
``add_arguments(parser)`` and ``run(args) -> int``, and argparse stops at ``plait.cli``."""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
from pathlib import Path

import plait
from plait.cli import COMMANDS, build_parser

SRC = Path(plait.__file__).resolve().parent


def test_every_command_module_has_add_arguments_and_run():
    for name, module in COMMANDS.items():
        module = importlib.import_module(module.__name__)
        assert callable(getattr(module, "add_arguments", None)), name
        assert callable(getattr(module, "run", None)), name
        assert isinstance(getattr(module, "HELP", None), str), name
        public = {n for n, f in inspect.getmembers(module, inspect.isfunction)
                  if f.__module__ == module.__name__ and not n.startswith("_")}
        assert public == {"add_arguments", "run"}, (name, public)


def test_the_parser_knows_exactly_the_registered_commands():
    parser = build_parser()
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(actions) == 1
    assert list(actions[0].choices) == list(COMMANDS)


def test_no_module_outside_cli_mentions_argparse():
    offenders = []
    for path in SRC.rglob("*.py"):
        if path.relative_to(SRC).parts[0] == "cli":
            continue
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        imported = any(isinstance(node, ast.Import) and any(a.name == "argparse" for a in node.names)
                       or isinstance(node, ast.ImportFrom) and node.module == "argparse" for node in ast.walk(tree))
        if imported or "argparse" in text:
            offenders.append(str(path.relative_to(SRC)))
    assert offenders == []
