"""``plait clusters``: list the cluster and GPU presets."""

from __future__ import annotations

import argparse

from plait.cli.support.common import console

HELP = "list cluster and GPU presets"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """No flags."""


def run(args) -> int:
    from rich.table import Table

    from plait.spec.hardware import CLUSTERS
    from plait.spec.units import GIB

    table = Table(title="Cluster presets (per GPU; bandwidths per direction)", title_justify="left")
    for column in ("name", "gpu", "GPUs/node", "bf16 TFLOP/s", "fp8 TFLOP/s", "HBM GiB", "HBM TB/s",
                   "NVLink GB/s", "network GB/s", "PCIe GB/s"):
        table.add_column(column, justify="left" if column in ("name", "gpu") else "right")
    for c in CLUSTERS.values():
        g = c.gpu
        table.add_row(c.name, g.name, str(c.gpus_per_node), f"{g.bf16_flops / 1e12:.0f}",
                      f"{g.fp8_flops / 1e12:.0f}" if g.fp8_flops else "-", f"{g.hbm_bytes / GIB:.0f}",
                      f"{g.hbm_bandwidth / 1e12:.2f}", f"{c.intra_node_bandwidth / 1e9:.0f}",
                      f"{c.inter_node_bandwidth / 1e9:.1f}", f"{c.host_link_bandwidth / 1e9:.0f}")
    console().print(table)
    return 0
