"""The one progress display of plait (``train``, ``sweep``, ``profile``): a rich bar on a terminal,
plain numbered lines otherwise (files, pipes, CI logs), nothing when disabled (e.g. ranks other than 0).

No torch here; rich is imported only when a bar is drawn.
"""

from __future__ import annotations

import sys

CLOCKS = ("remaining", "elapsed")  # the time column a bar may show


class ProgressBar:
    """``total`` items, ``done`` of them already done at the start.

    On a terminal: the bar ``label [bar] done/total status [clock]``. Otherwise, when ``lines`` is
    true, each ``advance`` prints ``"{unit} {done}/{total} {status}"`` for every ``every``-th item
    and the last one (``unit`` defaults to ``label``).
    """

    def __init__(self, label: str, total: int, enabled: bool = True, *, done: int = 0, every: int = 1,
                 unit: str | None = None, lines: bool = True, clock: str | None = None):
        if clock is not None and clock not in CLOCKS:
            raise ValueError(f"clock {clock!r}: one of {CLOCKS} or None")
        self.enabled, self.total, self.done, self.every = enabled, total, done, max(1, every)
        self.unit, self.lines = unit or label, lines
        self.bar = _rich_bar(label, total, done, clock) if enabled and sys.stdout.isatty() else None
        self.task = self.bar.add_task(label, total=total, completed=done, status="") if self.bar else None
        if self.bar is not None:
            self.bar.start()

    def status(self, text: str) -> None:
        """Show ``text`` beside the bar (nothing without a bar)."""
        if self.bar is not None:
            self.bar.update(self.task, status=text)

    def advance(self, status: str = "") -> None:
        """One more item done; ``status`` says what (the bar's text, or the plain line's tail)."""
        self.done += 1
        if self.bar is not None:
            self.bar.update(self.task, advance=1, status=status)
        elif self.enabled and self.lines and (self.done == 1 or self.done % self.every == 0
                                              or self.done == self.total):  # 1, N, 2N, ... and the last
            print(f"{self.unit} {self.done}/{self.total} {status}", flush=True)

    def message(self, text: str, markup: bool = True) -> None:
        """A line above the bar (or a plain line); ``markup=False``: printed as is, rich markup and
        highlighting off."""
        if not self.enabled:
            return
        if self.bar is None:
            print(text, flush=True)
        elif markup:
            self.bar.console.print(text)
        else:
            self.bar.console.print(text, markup=False, highlight=False)

    def close(self) -> None:
        """Stop drawing the bar (again: no-op)."""
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


def _rich_bar(label: str, total: int, done: int, clock: str | None):
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = [TextColumn(label), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[status]}")]
    if clock == "remaining":
        columns.append(TimeRemainingColumn())
    elif clock == "elapsed":
        columns.append(TimeElapsedColumn())
    return Progress(*columns)
