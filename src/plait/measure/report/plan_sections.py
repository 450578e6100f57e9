"""The report's sections about one saved plan (``plait report --plan``, with or without a sweep):
what the planner predicts for it, its memory per pipeline stage and step-time waterfall
(``plan_plots``). No torch."""

from __future__ import annotations

from pathlib import Path

from plait.measure.report.chart_data import duration
from plait.measure.report.render import Section, Table
from plait.plan.params import CostParams
from plait.plan.plan import Plan
from plait.spec.units import GIB


def plan_summary_section(plan: Plan, plan_path: str, params_note: str, notes: list[str] | tuple[str, ...],
                         step_rows: tuple[tuple[str, str], ...] = ()) -> Section:
    """The plan's table: model, cluster, job, layout, its step time (and ``step_rows``: the saved and
    re-priced step times beside it), rates, memory and the cost parameters it was priced with."""
    step, memory, layout = plan.step, plan.memory, plan.layout
    m = layout.micro_batches(plan.job.global_batch)
    rows = (("model", plan.model.name),
            ("cluster", f"{plan.cluster.n_gpus} x {plan.cluster.gpu.name} ({plan.cluster.name})"),
            ("job", f"global batch {plan.job.global_batch} x {plan.job.seq_len} tokens, {m} micro-batch"
                    f"{'es' if m > 1 else ''} of {layout.mbs}"),
            ("layout", str(layout)),
            ("step time", duration(step.step_time)),
            *step_rows,
            ("tokens/s/GPU", f"{step.tokens_per_s_per_gpu:,.0f}"),
            ("MFU / HFU", f"{100 * step.mfu:.1f}% / {100 * step.hfu:.1f}%"),
            ("bottleneck", step.bottleneck.replace("_", " ")),
            ("memory (most loaded GPU)", f"{memory.total / GIB:.2f} GiB of {memory.capacity / GIB:.0f} GiB "
                                         f"({memory.stage} stage); " + ("fits" if plan.fits else "DOES NOT FIT")),
            ("cost parameters", params_note))
    if memory.host_bytes:
        rows += (("host memory per GPU", f"{memory.host_bytes / GIB:.2f} GiB (offloaded)"),)
    return Section(f"Plan: {Path(plan_path).name}", [], Table(("what", "value"), rows, (0, 1)),
                   notes=[*notes, *(f"warning: {w}" for w in plan.warnings)])


def plan_picture_section(plan: Plan, params: CostParams, path: Path, pricing: str = "") -> Section:
    """The plan's memory per stage (priced with ``params``) and step-time waterfall; ``pricing``: how
    it was priced, written under the picture's title and above its table."""
    from plait.measure.report.plan_plots import plan_plot
    from plait.measure.report.stage_memory import stage_memories

    stages = stage_memories(plan.model, plan.cluster, plan.job, plan.layout, params)
    image = plan_plot(plan, stages, path, pricing)
    text = ("Left: the planner's memory of every pipeline stage (the first holds the embedding and the most "
            "micro-batches in flight, the last the LM head and the logits); hatched items are outside the "
            "allocator's count (CUDA context, NCCL buffers, fragmentation). Right: the step time as a waterfall of "
            "its critical-path items - communication is what stays exposed after overlap, by kind.")
    body = tuple((s.stage, f"{s.allocated / GIB:.3f}", f"{s.total / GIB:.3f}", f"{100 * s.total / s.capacity:.1f}%")
                 for s in stages)
    if pricing:
        text += f" Priced with: {pricing}."
    return Section("Memory per stage and step time", [text],
                   Table(("stage", "allocated GiB", "total GiB", "of capacity"), body), image=image)
