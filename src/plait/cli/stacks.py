"""``plait stacks``: list the software stacks ``plait plan --stack`` prices for, or show one with the
source of each of its numbers."""

from __future__ import annotations

import argparse

from plait.cli.support.common import console

HELP = "list the software stacks (plait plan --stack) or show one with its sources"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--show", metavar="STACK", help="a stack's every number and default, with its source "
                                                        "(a built-in name or a stack .toml file)")


def run(args) -> int:
    from rich.table import Table

    from plait.spec.stack import get_stack, stack_names

    out = console()
    if args.show:
        stack = get_stack(args.show)
        out.print(f"[bold]{stack.name}[/bold]: {stack.summary}")
        out.print(f"memory model: {stack.runtime}; attention: {stack.attention_kernel or '-'}; "
                  f"context-parallel kernels: {', '.join(stack.cp_impls)}; file: {stack.path}")
        table = Table(title_justify="left")
        for column in ("what", "value", "source"):
            table.add_column(column, overflow="fold")
        values = {f"attention_efficiency[{g}]": i.value for g, i in stack.attention_efficiency.items()}
        values.update({f"params.{n}": i.value for n, i in stack.params.items()})
        values.update({f"defaults.{n}": i.value for n, i in stack.defaults.items()})
        values.update({f"run.{n}": i.value for n, i in stack.run.items()})
        for what, source in stack.sources().items():
            table.add_row(what, f"{values[what]:g}" if isinstance(values[what], float) else str(values[what]), source)
        if not values:
            out.print("(the planner's defaults: no number of its own)")
        else:
            out.print(table)
        return 0
    table = Table(title="Software stacks (plait plan --stack NAME; plait stacks --show NAME for the sources)",
                  title_justify="left")
    for column in ("name", "memory model", "numbers", "defaults", "summary"):
        table.add_column(column, overflow="fold")
    for name in stack_names():
        stack = get_stack(name)
        defaults = ", ".join(f"{k}={v}" for k, v in stack.default_values().items()) or "-"
        table.add_row(name, stack.runtime, str(len(stack.params) + len(stack.attention_efficiency)), defaults,
                      stack.summary)
    out.print(table)
    return 0
