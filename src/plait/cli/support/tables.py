"""Rich tables for the CLI: ranked plans, itemized memory and time, validation results, sweep results."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from plait.measure.sweep.csv_file import SweepRow
from plait.measure.sweep.stats import top1_text
from plait.measure.validate.runs import RunResult
from plait.plan.plan import Plan
from plait.spec.model import ModelSpec
from plait.spec.units import GIB


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms" if seconds < 10 else f"{seconds:,.2f} s"


def count_text(n: float) -> str:
    """1_235_814_400 -> "1.24B" (K, M, B, T: powers of 1000)."""
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{suffix}"
    return f"{n:.0f}"


def model_line(model: ModelSpec, seq_len: int) -> str:
    """What the planner read: exact parameter counts and model FLOPs per token (6·N + attention)."""
    family = f", {model.family}" if model.family else ""
    flops = model.model_flops_per_token(seq_len)
    return (f"model {model.name} ({model.arch}{family}): {model.total_params():,} parameters "
            f"({count_text(model.total_params())}; {count_text(model.non_embedding_params())} non-embedding), "
            f"{flops / 1e9:,.2f} GFLOP per trained token at seq_len {seq_len} (forward + backward, causal)")


def training_time_line(plan: Plan, tokens: float) -> str:
    """How long ``tokens`` training tokens take on ``plan``'s layout at its predicted throughput."""
    seconds = tokens / (plan.step.tokens_per_s_per_gpu * plan.layout.world_size)
    steps = tokens / plan.job.tokens_per_step
    days = seconds / 86400
    when = f"{days:,.1f} days" if days >= 1 else f"{seconds / 3600:,.1f} hours" if seconds >= 3600 else f"{seconds:,.0f} s"
    gpu_hours = seconds * plan.layout.world_size / 3600
    return (f"{count_text(tokens)} tokens on {plan.layout} ({plan.layout.world_size} GPUs): {when} "
            f"({steps:,.0f} steps, {gpu_hours:,.0f} GPU-hours) at the predicted {_ms(plan.step.step_time)} per step")


def plans_table(plans: list[Plan], title: str, headroom: float | None = None) -> Table:
    """Ranked plans; with ``headroom`` (a fraction of HBM), a plan inside it is marked ``risky``."""
    from plait.plan.memory import is_risky

    table = Table(title=title, title_justify="left")
    for column in ("#", "layout", "memory/GPU", "step time", "tokens/s/GPU", "MFU", "bottleneck"):
        table.add_column(column, justify="right" if column not in ("layout", "bottleneck") else "left")
    for rank, plan in enumerate(plans, 1):
        memory = plan.memory
        mem_text = f"{memory.total / GIB:.1f} / {memory.capacity / GIB:.0f} GiB"
        if not memory.fits:
            mem_text = f"[red]{mem_text} (OOM)[/red]"
        elif headroom is not None and is_risky(memory, headroom):
            mem_text = f"[yellow]{mem_text} risky[/yellow]"
        table.add_row(str(rank), str(plan.layout) + ("" if plan.runnable else " *"), mem_text, _ms(plan.step.step_time),
                      f"{plan.step.tokens_per_s_per_gpu:,.0f}", f"{100 * plan.step.mfu:.1f}%",
                      plan.step.bottleneck.replace("_", " "))  # as the --explain items name it
    return table


def explain(console: Console, plan: Plan, params=None, runtime: str = "torch") -> None:
    """Print the itemized memory and time of one plan, and why it ranks where it does (``params``, the
    plan's cost parameters, and ``runtime``, its stack's: the parts of ``moe sync``)."""
    memory, step = plan.memory, plan.step
    console.print(f"[bold]{plan.layout}[/bold]  -  {plan.model.name} on {plan.cluster.n_gpus} x "
                  f"{plan.cluster.gpu.name}, global batch {plan.job.global_batch} x {plan.job.seq_len} tokens, "
                  f"{plan.layout.micro_batches(plan.job.global_batch)} micro-batches per step")
    mem_table = Table(title=f"Memory per GPU (most loaded: {memory.stage} stage)", title_justify="left")
    mem_table.add_column("item")
    mem_table.add_column("GiB", justify="right")
    mem_table.add_column("share", justify="right")
    from plait.plan.memory import OVERHEAD_ITEMS

    items = memory.items()
    tensors = {k: v for k, v in items.items() if k not in OVERHEAD_ITEMS}
    overheads = {k: v for k, v in items.items() if k in OVERHEAD_ITEMS}
    for group, title in ((tensors, None), (overheads, "[dim]beyond the tensors (allocator, NCCL, CUDA):[/dim]")):
        if title:
            mem_table.add_row(title, "", "")
        for name, value in group.items():
            if value > 0:
                mem_table.add_row(name.replace("_", " "), f"{value / GIB:.2f}", f"{100 * value / memory.total:.0f}%")
    mem_table.add_row("[bold]total[/bold]", f"[bold]{memory.total / GIB:.2f}[/bold]",
                      f"{100 * memory.total / memory.capacity:.0f}% of {memory.capacity / GIB:.0f} GiB")
    if memory.host_bytes:
        mem_table.add_row("(host memory)", f"{memory.host_bytes / GIB:.2f}", "")
    console.print(mem_table)
    if memory.pipeline_buffers > 0:
        console.print(f"[dim]pipeline buffers: plait train builds its schedule on torch.distributed.pipelining, which "
                      f"allocates a receive buffer for every micro-batch ({plan.layout.micro_batches(plan.job.global_batch)}) "
                      "and stage chunk when the schedule is built and keeps them for the run (the interleaved and "
                      "zero-bubble schedules also hold every send until the step ends); Megatron-Core reuses a few "
                      "(--stack megatron-core prices that). Fewer micro-batches, or mbs > 1, shrink it.[/dim]")
    time_table = Table(title="Step time (critical path)", title_justify="left")
    time_table.add_column("item")
    time_table.add_column("time", justify="right")
    time_table.add_column("share", justify="right")
    for name, value in step.items().items():
        if value > 0:
            time_table.add_row(name.replace("_", " "), _ms(value), f"{100 * value / step.step_time:.1f}%")
    time_table.add_row("[bold]step[/bold]", f"[bold]{_ms(step.step_time)}[/bold]", "")
    console.print(time_table)
    if step.moe_sync > 0 and params is not None:
        console.print(f"[dim]{moe_sync_note(plan, params, runtime)}[/dim]")
    console.print(f"tokens/s/GPU {step.tokens_per_s_per_gpu:,.0f}   MFU {100 * step.mfu:.1f}%   "
                  f"HFU {100 * step.hfu:.1f}%   bottleneck: {step.bottleneck.replace('_', ' ')}")
    console.print(f"element-wise work: {compile_words(plan.compiled)}")
    for warning in plan.warnings:
        console.print(f"[yellow]{warning}[/yellow]")


def moe_sync_note(plan: Plan, params, runtime: str) -> str:
    """What ``moe sync`` holds, per MoE layer and micro-batch (``plait.plan.moe.sync``), in words."""
    from plait.plan.moe.sync import expert_gemm_kernels, moe_kernels, moe_sync_layer

    model, lay, gpu = plan.model, plan.layout, plan.cluster.gpu
    parts = moe_sync_layer(model, plan.cluster, lay, params, runtime)
    kernels = sum(moe_kernels(model, lay, params, runtime, gpu))
    gemms = sum(expert_gemm_kernels(model, lay, runtime, gpu))
    return (f"moe sync, per MoE layer and micro-batch: the token-count exchange {1e6 * sum(parts.counts):.0f} us, "
            f"the counts' copy to the host and its stream sync {1e6 * sum(parts.sync):.0f} us, and "
            f"{kernels:.0f} kernel launches (forward and backward; {gemms:.0f} of them the expert GEMMs and their fp8 "
            f"casts) at "
            f"{1e6 * params.moe_launch_s:.0f} us each, {1e3 * sum(parts.launches):.2f} ms: the sync empties the "
            f"GPU's queue, so each launch is exposed; CUDA graphs (Megatron-Core's router graphs) remove launches")


def compile_words(compiled: float) -> str:
    """How a plan's blocks were priced: compiled (torch.compile), eager, or a share of each."""
    if compiled >= 1.0:
        return "priced compiled (torch.compile: inductor's fused regions, counted from the model's shapes)"
    if compiled <= 0.0:
        return ("priced eager (elementwise_passes: the software runs no torch.compile here, or the layout breaks "
                "a compile rule of plait train)")
    return f"priced with {100 * compiled:.0f}% of the blocks compiled (torch.compile), the rest eager"


def compile_note(plans: list[Plan]) -> str:
    """One line on how the plans shown were priced: compiled or eager, and which ranks differ."""
    compiled = [rank for rank, plan in enumerate(plans, 1) if plan.compiled > 0]
    if not compiled:
        return "priced eager (no torch.compile; plait train --compile, or plait plan --compile, prices compiled blocks)"
    eager = [str(rank) for rank, plan in enumerate(plans, 1) if plan.compiled <= 0]
    text = "priced compiled (torch.compile, plait train's default on CUDA; --no-compile prices eager)"
    if eager:
        text += f"; eager: #{', #'.join(eager)} (a compile rule of plait train keeps them eager)"
    return text


def confidence_note(console: Console) -> None:
    from plait.measure.validate.runs import shipped_accuracy

    record = shipped_accuracy()
    if record is None:
        return
    console.print(f"[dim]How sure: on {record['runs_compared']} published runs of {record['sources']} code bases, each "
                  "predicted by defaults fitted without its own code base, the median MFU error is "
                  f"{record['held_out_median_points']:.1f} points ({100 * record['held_out_within_4_points']:.0f}% "
                  f"within 4; {record['worst_source_median_points']:.1f} for the worst code base; plait validate "
                  "--cross-validate source). Plan for the software you run (--stack) and calibrate on your "
                  "hardware (plait profile, plait calibrate fit) to get closer.[/dim]")


def validation_table(results: list[RunResult]) -> Table:
    table = Table(title="Published runs: predicted vs reported (MFU on plait's basis)", title_justify="left")
    for column in ("id", "status", "pred MFU", "rep MFU", "err (pts)", "pred tok/s/GPU", "rep tok/s/GPU", "pred/rep GiB"):
        table.add_column(column, justify="left" if column in ("id", "status") else "right")
    for r in results:
        err = r.mfu_error_points
        mem = ""
        if r.predicted_mem_gb is not None:
            mem = f"{r.predicted_mem_gb:.0f}" + (f" / {r.reported_mem_gb:.0f}" if r.reported_mem_gb else "")
        table.add_row(
            r.id, r.status if len(r.status) < 48 else r.status[:45] + "...",
            f"{100 * r.predicted_mfu:.1f}%" if r.predicted_mfu is not None else "",
            f"{100 * r.reported_mfu:.1f}%" if r.reported_mfu is not None else "",
            f"{err:+.1f}" if err is not None else "",
            f"{r.predicted_tokens_per_s_per_gpu:,.0f}" if r.predicted_tokens_per_s_per_gpu else "",
            f"{r.reported_tokens_per_s_per_gpu:,.0f}" if r.reported_tokens_per_s_per_gpu else "",
            mem,
        )
    return table


def summary_table(summary: dict) -> Table:
    table = Table(title=(f"{summary['rows']} rows: {summary['complete']} complete "
                         f"({summary['incomplete']} incomplete, {summary['unsupported']} unsupported, "
                         f"{summary.get('invalid', 0)} invalid), "
                         f"{summary['compared']} compared, coverage {100 * summary['coverage']:.0f}%"),
                  title_justify="left")
    for column in ("source", "rows", "median |err|", "mean |err|", "within 4 pts"):
        table.add_column(column, justify="left" if column == "source" else "right")

    def row(name: str, s: dict) -> None:
        if not s["n"]:
            return
        table.add_row(name, str(s["n"]), f"{s['median_abs_error']:.1f}", f"{s['mean_abs_error']:.1f}",
                      f"{100 * s['within_4_points']:.0f}%")

    for source, s in summary["per_source"].items():
        row(source[:60], s)
    row("[bold]all[/bold]", summary["overall"])
    return table


# ------------------------------------------------------------------ plait sweep
def _num(value: float | None, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


def _pct(value: float | None) -> str:
    return "" if value is None else f"{100 * value:+.1f}%"


def sweep_table(rows: list[SweepRow]) -> Table:
    table = Table(title="Sweep: predicted vs measured per layout", title_justify="left")
    for column in ("layout", "status", "rank", "pred s/step", "meas s/step", "err", "pred mem GiB",
                   "meas mem GiB", "pred MFU", "meas MFU", "tokens/s", "reason"):
        table.add_column(column, justify="left" if column in ("layout", "status", "reason") else "right")
    for r in rows:
        kind = " (RSS)" if r.memory_kind == "host_rss" else " (tensors)" if r.memory_kind == "host_tensors" else ""
        table.add_row(
            r.layout + (" +compile" if r.compile else ""), r.status,
            "pred OOM" if r.predicted_fits is False else _num(r.planner_rank, "d"),
            _num(r.predicted_step_time_s, ".4f"), _num(r.measured_step_time_s, ".4f"), _pct(r.step_time_error),
            _num(r.predicted_memory_bytes and r.predicted_memory_bytes / GIB, ".2f"),
            (_num(r.measured_memory_bytes / GIB, ".2f") + kind) if r.measured_memory_bytes is not None else "",
            _pct(r.predicted_mfu).lstrip("+"), _pct(r.measured_mfu).lstrip("+"), _num(r.tokens_per_s, ",.0f"),
            (r.reason[:70] + "...") if len(r.reason) > 73 else r.reason)
    return table


def sweep_summary_table(summary: dict) -> Table:
    table = Table(title="Sweep summary", title_justify="left", show_header=False)
    table.add_column("what")
    table.add_column("value")
    counts = ", ".join(f"{n} {s}" for s, n in summary["by_status"].items() if n)
    table.add_row("layouts", f"{summary['rows']} ({counts})")
    rho = summary["rank_correlation"]
    table.add_row("Spearman rank correlation",
                  (f"{rho['spearman']:+.3f}" if rho["spearman"] is not None else "n/a (fewer than 2 ranked runs "
                   "or a constant order)") + f" over {rho['n']} layouts: {rho['basis']}")
    for key, label in (("step_time_error", "step-time error"), ("memory_error", "memory error"),
                       ("mfu_error", "MFU error")):
        e = summary[key]
        table.add_row(label, f"median |err| {100 * e['median_abs']:.1f}%, mean |err| {100 * e['mean_abs']:.1f}% "
                             f"over {e['n']}" if e["n"] else "n/a (no predictions recorded or nothing comparable)")
    for check in summary.get("top1_checks", []):
        table.add_row("planner's top-1" + (" (compiled)" if check["compile"] else ""),
                      top1_text(check, summary["top1_tolerance"]))
    if summary.get("calibration"):
        table.add_row("calibration", f"{summary['calibration']} (sha256 {summary['calibration_sha256']})")
    return table


def cross_validation_table(result) -> Table:
    """``plait validate --cross-validate source``: per source, its rows' median |MFU error| held out
    (fit without it) and in-sample (shipped defaults), the share within 4 points, and the fit."""
    import statistics

    from plait.measure.validate.cross import WITHIN_POINTS, within

    record = result.record()
    table = Table(title=(f"Leave one source out: {record['runs_compared']} published runs, {record['sources']} sources; "
                         f"for each, {', '.join(result.names)} fitted on the others, its runs predicted"),
                  title_justify="left")
    for name, justify in (("source", "left"), ("rows", "right"), ("held out: median |err|", "right"),
                          (f"within {WITHIN_POINTS:g} pts", "right"), ("shipped defaults", "right")):
        table.add_column(name, justify=justify)
    for s in sorted(result.sources, key=lambda s: -s.rows):
        table.add_row(s.source, str(s.rows), f"{statistics.median(s.held_out):.1f}", f"{100 * within(s.held_out):.0f}%",
                      f"{statistics.median(s.in_sample):.1f}")
    held = result.all("held_out")
    table.add_row("[bold]all[/bold]", str(len(held)), f"[bold]{record['held_out_median_points']:.1f}[/bold]",
                  f"{100 * within(held):.0f}%", f"{record['in_sample_median_points']:.1f}")
    return table


def search_stats(found, top: int) -> str:
    """The line under the table: what the search evaluated, skipped and rejected."""
    stats = (f"searched {found.evaluated:,} layouts in {found.seconds:.2f} s ({found.layouts_per_second:,.0f}/s); "
             f"{found.rejected_oom:,} do not fit")
    if found.implied_oom:
        stats += f" ({found.implied_oom:,} of them known from their sharding's ckpt=full, which does not)"
    if found.skipped:
        stats += (f"; {found.skipped:,} skipped: a lower bound on their step time is slower than the top {top} "
                  "(--exhaustive evaluates them)")
    return stats


def why_first(plans, headroom: float) -> str:
    """A line when the first row is not the fastest shown: the ranking rule (``plan.search.
    rank_with_headroom``) that put it there, with the numbers; "" otherwise."""
    from plait.plan.memory import is_risky

    if len(plans) < 2:
        return ""
    best, fastest = plans[0], max(plans, key=lambda p: p.step.tokens_per_s_per_gpu)
    if fastest is best or fastest.step.tokens_per_s_per_gpu <= best.step.tokens_per_s_per_gpu:
        return ""
    slower = 100 * (1 - best.step.tokens_per_s_per_gpu / fastest.step.tokens_per_s_per_gpu)
    if is_risky(fastest.memory, headroom):
        return (f"#1 ranks above a {slower:.1f}% faster layout that leaves less than the {100 * headroom:.0f}% "
                "memory headroom (--memory-headroom)")
    freed = (best.memory.headroom - fastest.memory.headroom) / GIB
    return (f"#1 is {slower:.1f}% slower than the fastest shown but keeps {freed:.1f} GiB more free memory: "
            "among layouts within 1% of the fastest, the roomiest ranks first")
