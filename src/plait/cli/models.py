"""``plait models``: list the model presets, or show what plait reads from one model (``--show``)."""

from __future__ import annotations

import argparse

from plait.cli.support.common import console

HELP = "list model presets"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--show", metavar="MODEL",
                        help="every field plait reads from this preset, config.json or model JSON, with its "
                             "exact parameter counts")


def run(args) -> int:
    from rich.table import Table

    from plait.spec.models import MODELS, get_model

    if args.show:
        model = get_model(args.show)
        table = Table(title=f"Model {model.name}", title_justify="left", show_header=False)
        for field, value in model.to_dict().items():
            table.add_row(field, str(value))
        table.add_row("parameters", f"{model.total_params():,}")
        table.add_row("non-embedding parameters", f"{model.non_embedding_params():,}")
        if model.moe is not None:  # parameters one token uses (the routed experts it skips left out)
            table.add_row("active parameters", f"{model.active_params():,}")
        console().print(table)
        return 0

    table = Table(title="Model presets (sources: plait/spec/models.py)", title_justify="left")
    columns = ("name", "arch", "layers", "hidden", "ffn", "heads", "kv heads", "vocab", "parameters", "active",
               "experts")
    for column in columns:
        table.add_column(column, justify="left" if column in ("name", "arch", "experts") else "right")
    for m in MODELS.values():
        # active: parameters one token uses (= parameters for a dense model); experts: routed top-k (+ shared)
        experts = "" if m.moe is None else (f"{m.moe.n_experts} top-{m.moe.top_k}"
                                            + (f" +{m.moe.n_shared} shared" if m.moe.n_shared else ""))
        table.add_row(m.name, m.arch, str(m.n_layers), str(m.hidden), str(m.ffn_hidden), str(m.n_heads),
                      str(m.n_kv_heads), str(m.vocab), f"{m.total_params():,}", f"{m.active_params():,}", experts)
    console().print(table)
    return 0
