"""The package's shape, checked from the source text (no imports, no torch).

- no import cycles among the modules of ``src/plait``, counting imports inside functions;
- the layers only look down: errors/progress <- spec <- plan <- run <- measure <- cli;
- no module over 400 lines.

A folder is one concept and its ``__init__`` says which module holds what: that rule, and the tree of
``docs/architecture.md``, are checked by ``tests/test_architecture_doc.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "plait"
MAX_MODULE_LINES = 400
# a module of a layer may import its own layer and the layers listed before it
LAYERS = ("base", "spec", "plan", "run", "measure", "cli")


def module_name(path: Path) -> str:
    name = ".".join(path.relative_to(SRC).with_suffix("").parts)
    return name.removesuffix(".__init__")


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """Modules of plait that ``name`` imports anywhere in its body (relative imports resolved)."""
    found: set[str] = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = name.split(".")
                keep = len(parts) - node.level + (1 if is_package else 0)
                base = ".".join(parts[:keep] + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    # importing a name from one's own parent package is not an edge between modules
    return {m for m in found if m in known and m != name and not name.startswith(m + ".")}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; components with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            advanced = False
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def layer_of(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS) else "base"


def import_graph() -> dict[str, set[str]]:
    modules = all_modules()
    return {name: imported_modules(name, path, set(modules)) for name, path in modules.items()}


def test_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert strongly_connected(graph) == [["a", "b", "c"]]


def test_no_import_cycles():
    assert strongly_connected(import_graph()) == []


def test_layers_only_import_downwards():
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    upward = []
    for name, targets in import_graph().items():
        if name == "plait":
            continue
        for target in targets:
            if target != "plait" and rank[layer_of(target)] > rank[layer_of(name)]:
                upward.append(f"{name} -> {target}")
    assert upward == []


def test_module_sizes():
    too_long = {module_name(p): n for p in PACKAGE.rglob("*.py")
                if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert too_long == {}


# modules the architecture promises never import torch at import time: the planner side, and the
# launcher side of plait train (torch is imported inside the functions that need it)
TORCH_FREE_AT_IMPORT = ("plait.cli", "plait.run.config", "plait.run.env", "plait.run.replan",
                        "plait.run.launcher.resolve", "plait.run.launcher.checkpoint_dir", "plait.run.launcher.launch",
                        "plait.run.launcher.preflight",
                        "plait.run.device", "plait.run.launcher.outcome", "plait.run.checkpoint.store",
                        "plait.run.checkpoint.select", "plait.run.checkpoint.hf.files", "plait.measure.validate.runs",
                        "plait.measure.sweep.loop",
                        "plait.measure.report.build")


def test_launcher_and_planner_modules_import_without_torch():
    import subprocess
    import sys

    script = ("import builtins\nreal = builtins.__import__\n"
              "def guarded(name, *a, **k):\n"
              "    if name == 'torch' or name.startswith('torch.'):\n"
              "        raise ImportError('torch imported at import time')\n"
              "    return real(name, *a, **k)\n"
              "builtins.__import__ = guarded\n"
              + "".join(f"import {name}\n" for name in TORCH_FREE_AT_IMPORT))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
