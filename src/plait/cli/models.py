"""``plait models``: list the model presets."""

from __future__ import annotations

import argparse

from plait.cli.support.common import console

HELP = "list model presets"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """No flags."""


def run(args) -> int:
    from rich.table import Table

    from plait.spec.models import MODELS

    table = Table(title="Model presets (sources: plait/spec/models.py)", title_justify="left")
    for column in ("name", "arch", "layers", "hidden", "ffn", "heads", "kv heads", "vocab", "parameters"):
        table.add_column(column, justify="left" if column in ("name", "arch") else "right")
    for m in MODELS.values():
        table.add_row(m.name, m.arch, str(m.n_layers), str(m.hidden), str(m.ffn_hidden), str(m.n_heads),
                      str(m.n_kv_heads), str(m.vocab), f"{m.total_params():,}")
    console().print(table)
    return 0
