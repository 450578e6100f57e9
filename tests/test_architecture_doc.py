"""The architecture page and the package docstrings cannot go stale (read from the source text, no imports).

- ``docs/architecture.md``'s tree names every module of ``src/plait`` in its folder, and every module
  it names exists there;
- every package's ``__init__`` docstring names each of its modules and sub-folders (the folder rule:
  a folder is one concept and its ``__init__`` says which module holds what).

To see the check fail, remove a module in a scratch copy, as
``test_a_removed_or_unnamed_module_is_found`` does: ``tree_problems(copy_root, doc_text)`` then names it.
"""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "plait"
DOC = ROOT / "docs" / "architecture.md"
SPECIAL = ("__init__.py", "__main__.py")
MODULE_TOKEN = re.compile(r"(?<![\w/*.])([A-Za-z_]\w*)\.py\b")


def tree_block(doc_text: str) -> str:
    """The fenced block under the page's ``## The tree`` heading."""
    after = doc_text.split("## The tree", 1)[1]
    return after.split("```", 2)[1]


def named_in_tree(doc_text: str) -> dict[str, set[str]]:
    """Folder (relative to ``src/plait``, ``""`` for the package itself) -> module stems the tree names.

    A line whose first word ends in ``/`` opens a folder, nested by its indent (two spaces a level,
    the top level at two); the ``name.py`` words of that line and of the lines that follow it, up to
    the next folder line, are its modules. A line at the top indent that opens no folder is the package's.
    """
    named: dict[str, set[str]] = {"": set()}
    stack: list[str] = []
    current = ""
    for line in tree_block(doc_text).splitlines():
        stripped = line.strip()
        if not stripped or stripped == "src/plait/":
            continue
        indent = len(line) - len(line.lstrip(" "))
        first = stripped.split()[0]
        if first.endswith("/"):
            depth = max(indent // 2 - 1, 0)
            stack = stack[:depth] + [first.rstrip("/")]
            current = "/".join(stack)
            named.setdefault(current, set())
        elif indent <= 2:
            stack, current = [], ""
        named[current] |= {stem for stem in MODULE_TOKEN.findall(stripped) if f"{stem}.py" not in SPECIAL}
    return named


def modules_on_disk(root: Path) -> dict[str, set[str]]:
    """Folder -> module stems, for every Python package folder under ``root``."""
    found: dict[str, set[str]] = {}
    for init in sorted(root.rglob("__init__.py")):
        folder = init.parent
        key = "" if folder == root else folder.relative_to(root).as_posix()
        found[key] = {p.stem for p in folder.glob("*.py") if p.name not in SPECIAL}
    return found


def tree_problems(root: Path, doc_text: str) -> list[str]:
    """What the tree omits or names wrongly, one line each (empty: the tree is right)."""
    named, on_disk = named_in_tree(doc_text), modules_on_disk(root)
    problems = [f"{folder or '.'}/: not in the tree" for folder in on_disk if folder and folder not in named]
    for folder, stems in on_disk.items():
        for stem in sorted(stems - named.get(folder, set())):
            problems.append(f"{folder or '.'}/{stem}.py: a module the tree does not name")
    for folder, stems in named.items():
        for stem in sorted(stems - on_disk.get(folder, set())):
            problems.append(f"{folder or '.'}/{stem}.py: named in the tree, not in src/plait")
    return problems


def init_problems(root: Path) -> list[str]:
    """Modules and sub-folders a package's ``__init__`` docstring does not name."""
    problems = []
    for init in sorted(root.rglob("__init__.py")):
        folder = init.parent
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        words = set(re.findall(r"[A-Za-z_]\w*", doc))
        parts = [p.stem for p in folder.glob("*.py") if p.name not in SPECIAL]
        parts += [p.name for p in folder.iterdir() if (p / "__init__.py").is_file()]
        for part in sorted(parts):
            if part not in words:
                problems.append(f"{init.relative_to(root.parent).as_posix()}: does not name {part}")
    return problems


def test_the_tree_names_every_module_and_only_modules_that_exist():
    assert tree_problems(PACKAGE, DOC.read_text(encoding="utf-8")) == []


def test_every_package_docstring_names_its_modules():
    assert init_problems(PACKAGE) == []


def test_a_removed_or_unnamed_module_is_found(tmp_path):
    copy = tmp_path / "plait"
    def skip(folder: str, names: list[str]) -> list[str]:  # caches, and the package data (no modules)
        return [n for n in names if n == "__pycache__" or (Path(folder) == PACKAGE and n == "data")]

    shutil.copytree(PACKAGE, copy, ignore=skip)
    doc_text = DOC.read_text(encoding="utf-8")
    assert tree_problems(copy, doc_text) == []
    (copy / "plan" / "search.py").unlink()
    (copy / "run" / "parallel" / "brand_new.py").write_text('"""A module nobody documented."""\n')
    assert tree_problems(copy, doc_text) == [
        "run/parallel/brand_new.py: a module the tree does not name",
        "plan/search.py: named in the tree, not in src/plait",
    ]
    assert "plait/run/parallel/__init__.py: does not name brand_new" in init_problems(copy)


def test_the_tree_reader_follows_the_indents():
    doc_text = ("## The tree\n\n```\nsrc/plait/\n  errors.py\n  run/   a.py\n         b.py (what b holds)\n"
                "    parallel/  c.py\n  cli/  d.py\n  e.py\n```\n")
    assert named_in_tree(doc_text) == {"": {"errors", "e"}, "run": {"a", "b"}, "run/parallel": {"c"}, "cli": {"d"}}
