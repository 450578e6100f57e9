"""The items of a predicted step (``plait.plan.cost.StepBreakdown``), declared once: their order,
what each holds, and which are the pipeline stage's own work per micro-batch (what the report's
timeline spreads over a schedule, ``plait.measure.report.timeline``). Seconds per optimizer step."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TimeItem:
    name: str
    holds: str
    stage_work: bool  # done by a pipeline stage for each micro-batch (else per step, or waiting)


TIME_ITEMS = (
    TimeItem("compute", "GEMMs, attention and LM head of every micro-batch, slowest stage", True),
    TimeItem("elementwise", "norms, activations, residuals (HBM-bound)", True),
    TimeItem("recompute", "forward work repeated by activation checkpointing", True),
    TimeItem("tp_comm", "exposed tensor/sequence-parallel collectives", True),
    TimeItem("cp_comm", "exposed context-parallel K/V exchange", True),
    TimeItem("pp_comm", "pipeline send/recv beyond what the software hides", True),
    TimeItem("bubble", "pipeline fill and drain", False),
    TimeItem("dp_comm", "exposed data-parallel / ZeRO communication", False),
    TimeItem("ep_comm", "exposed expert all-to-all (dispatch and combine); with moe_overlap=chunked also what "
             "splitting costs: smaller expert GEMMs, the rows' regroup, the chunks' weight-gradient sums", False),
    TimeItem("moe_sync", "the dropless dispatcher's per-MoE-layer synchronisation: token counts exchanged over ep, "
             "copied to the host, and the MoE block's kernel launches that sync exposes (launch time fitted: "
             "moe_launch_s); at ep=1 too, less under CUDA graphs", False),
    TimeItem("offload", "exposed activation/optimizer traffic over the host link", False),
    TimeItem("optimizer", "optimizer step", False),
    TimeItem("overhead", "fixed per-step and per-micro-batch costs, and the runtime's host time per layer", False),
)
TIME_ITEM_NAMES = tuple(item.name for item in TIME_ITEMS)
STAGE_WORK_ITEMS = tuple(item.name for item in TIME_ITEMS if item.stage_work)
