"""Two promises of ``plait.run``, read from the source text (``ast``, nothing imported):

  * rank code does not stand below the launcher: no module under ``run/`` outside ``run/launcher/``
    imports ``plait.run.launcher`` (the GPU-or-CPU decision the ranks need is ``plait.run.device``);
  * one mesh: ``run/`` constructs exactly one DeviceMesh (``init_device_mesh`` or ``DeviceMesh(...)``),
    the world mesh of ``plait.run.parallel.mesh``; every other group is a view of it.
"""

from __future__ import annotations

import ast
from pathlib import Path

RUN = Path(__file__).resolve().parents[2] / "src" / "plait" / "run"
LAUNCHER = "plait.run.launcher"
MESH_CONSTRUCTORS = {"DeviceMesh", "init_device_mesh"}


def _modules(folder: Path):
    for path in sorted(folder.rglob("*.py")):
        yield path, ast.parse(path.read_text(), filename=str(path))


def launcher_imports(tree: ast.AST) -> list[str]:
    """The modules named ``plait.run.launcher`` or below that ``tree`` imports (``import``,
    ``from ... import``, ``from plait.run import launcher``), at any depth (lazy imports included)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name == LAUNCHER or a.name.startswith(LAUNCHER + ".")]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module == LAUNCHER or node.module.startswith(LAUNCHER + "."):
                found.append(node.module)
            elif node.module == "plait.run":
                found += [f"plait.run.{a.name}" for a in node.names if a.name == "launcher"]
    return found


def mesh_constructions(tree: ast.AST) -> int:
    """Calls in ``tree`` that construct a DeviceMesh: ``DeviceMesh(...)`` or ``init_device_mesh(...)``,
    by bare name or as an attribute (``device_mesh.init_device_mesh(...)``)."""
    count = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            count += name in MESH_CONSTRUCTORS
    return count


def test_the_checks_see_what_they_look_for():
    """Both checks on snippets: every import spelling is caught, views are not constructions."""
    for source in ("import plait.run.launcher.launch", "from plait.run.launcher.device import x",
                   "from plait.run import launcher", "def f():\n    from plait.run.launcher import resolve"):
        assert launcher_imports(ast.parse(source)), source
    assert launcher_imports(ast.parse("from plait.run.device import rank_device\nimport plait.run.env")) == []
    assert mesh_constructions(ast.parse("m = init_device_mesh('cpu', (2,))\nn = dm.DeviceMesh('cpu', r)")) == 2
    assert mesh_constructions(ast.parse("v = m['dp', 'cp']._flatten('dp_cp')._unflatten(0, (2, 2), n)")) == 0


def test_rank_code_imports_no_launcher():
    offenders = {str(path.relative_to(RUN)): names for path, tree in _modules(RUN)
                 if "launcher" not in path.relative_to(RUN).parts[:-1] and (names := launcher_imports(tree))}
    assert offenders == {}, f"rank-side modules importing {LAUNCHER}: {offenders}"


def test_run_constructs_one_device_mesh():
    counts = {str(path.relative_to(RUN)): n for path, tree in _modules(RUN) if (n := mesh_constructions(tree))}
    assert counts == {"parallel/mesh.py": 1}, f"DeviceMesh constructions in run/: {counts}"
