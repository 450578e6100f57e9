"""Appending one run's markdown to a results file in ``bench/results/`` (shared by the benchmarks)."""

from __future__ import annotations

from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def append_result(name: str, title: str, script: str, text: str) -> Path:
    """Append ``text`` to ``bench/results/NAME``, created with ``title`` and a line naming ``script``."""
    path = RESULTS / name
    if not path.exists():
        path.write_text(f"# {title}\n\nWritten by `python bench/{script}`; newest run last.\n\n")
    with path.open("a") as out:
        out.write("\n" + text)
    return path
