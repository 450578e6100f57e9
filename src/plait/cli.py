"""plait command line: ``plait plan``, ``plait validate``, ``plait models``, ``plait clusters``.

Every user error ends with one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import sys
from pathlib import Path

from plait.errors import PlaitError

EXIT_USAGE = 2


def _add_plan_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="preset name (plait models), config.json or model JSON")
    parser.add_argument("--cluster", default="dgx-h100", help="preset name (plait clusters) or a JSON file")
    parser.add_argument("--gpus", type=int, help="GPUs in the job (default: one node)")
    parser.add_argument("--global-batch", type=int, required=True, help="sequences per optimizer step")
    parser.add_argument("--seq-len", type=int, required=True, help="tokens per sequence")
    parser.add_argument("--calibration", help="calibration JSON replacing the default cost parameters")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="plait", description="Plan, run and measure LLM parallelization layouts.")
    sub = parser.add_subparsers(dest="command", required=True)

    plan = sub.add_parser("plan", help="rank layouts by predicted throughput, or evaluate one")
    _add_plan_args(plan)
    plan.add_argument("--layout", help='evaluate one layout, e.g. "dp=8,tp=4,pp=2,mbs=1,ckpt=selective"')
    plan.add_argument("--top", type=int, default=5, help="how many layouts to show (default 5)")
    plan.add_argument("--fix", action="append", default=[], metavar="KEY=VALUE",
                      help="pin a layout key in the search (repeatable), e.g. --fix tp=8")
    plan.add_argument("--max-pp", type=int, default=128, help="largest pipeline degree to search")
    plan.add_argument("--max-mbs", type=int, default=16, help="largest micro-batch size to search")
    plan.add_argument("--schedule", help="only this pipeline schedule (gpipe, 1f1b, interleaved-1f1b, zero-bubble)")
    plan.add_argument("--no-offload", action="store_true", help="never offload to make a layout fit")
    plan.add_argument("--explain", action="store_true", help="itemized memory and time of the best (or given) layout")
    plan.add_argument("--json", action="store_true", help="print JSON instead of tables")
    plan.add_argument("--save", help="write the best (or given) plan to this file (for plait train --plan)")

    validate = sub.add_parser("validate", help="predict published runs and report the error")
    validate.add_argument("--runs", required=True, help="CSV of runs (schema: shared/data/README.md)")
    validate.add_argument("--out", help="write per-run predictions to this CSV")
    validate.add_argument("--calibration", help="calibration JSON replacing the default cost parameters")
    validate.add_argument("--json", action="store_true", help="print the error summary as JSON")

    sub.add_parser("models", help="list model presets")
    sub.add_parser("clusters", help="list cluster and GPU presets")
    return parser


def _console():
    """A rich console; wide when the output is not a terminal (files, pipes, CI logs)."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=200)


def _cost_params(path: str | None, cluster=None):
    """(CostParams, cluster with GPU overrides applied) from a calibration file, else defaults."""
    from plait.plan.params import DEFAULT_PARAMS, load_calibration

    if not path:
        return DEFAULT_PARAMS, cluster
    params, overrides, gpu_name = load_calibration(path)
    if cluster is not None:
        if gpu_name and gpu_name != cluster.gpu.name:
            print(f"plait: warning: calibration {path} is for {gpu_name}, the cluster has {cluster.gpu.name}",
                  file=sys.stderr)
        bad = {k: v for k, v in overrides.items() if isinstance(v, bool) or not isinstance(v, (int, float))}
        if bad:
            raise PlaitError(f"{path}: gpu_overrides must be numbers, got {bad}")
        try:
            cluster = dataclasses.replace(cluster, gpu=dataclasses.replace(cluster.gpu, **overrides))
        except TypeError as exc:
            raise PlaitError(f"{path}: bad gpu_overrides ({exc})") from None
    return params, cluster


def _parse_fixed(items: list[str]) -> tuple:
    from plait.spec.layout import Layout

    fixed = {}
    for item in items:
        parsed = Layout.parse(item)  # validates key and value
        key = item.split("=", 1)[0].strip().lower().replace("-", "_")
        if key == "ckpt":
            fixed["ckpt"] = parsed.ckpt
        elif key == "offload":
            raise PlaitError("--fix offload is not supported; evaluate the layout with --layout")
        else:
            fixed[key] = getattr(parsed, key)
    return tuple(sorted(fixed.items()))


def cmd_plan(args) -> int:
    from plait import report
    from plait.plan.plan import evaluate
    from plait.plan.search import SearchConstraints, require_plans, search
    from plait.spec.hardware import get_cluster
    from plait.spec.layout import JobSpec, Layout
    from plait.spec.models import get_model

    model = get_model(args.model)
    cluster = get_cluster(args.cluster)
    cluster = cluster.with_gpus(args.gpus if args.gpus is not None else cluster.gpus_per_node)
    if cluster.n_gpus < 1:
        raise PlaitError(f"--gpus {cluster.n_gpus}: need at least one GPU")
    job = JobSpec(global_batch=args.global_batch, seq_len=args.seq_len)
    params, cluster = _cost_params(args.calibration, cluster)
    console = _console()
    if args.layout is not None:
        plans = [evaluate(model, cluster, job, Layout.parse(args.layout), params)]
        title = f"{model.name} on {cluster.n_gpus} x {cluster.gpu.name}: given layout"
        stats = ""
    else:
        if args.top < 1:
            raise PlaitError("--top must be at least 1")
        constraints = SearchConstraints(
            fixed=_parse_fixed(args.fix), max_pp=args.max_pp, max_mbs=args.max_mbs,
            schedules=(args.schedule,) if args.schedule else SearchConstraints().schedules,
            allow_offload=not args.no_offload)
        if args.schedule:
            Layout(schedule=args.schedule)  # validates the name
        result = search(model, cluster, job, constraints, params)
        plans = require_plans(model, cluster, job, result, constraints)
        title = (f"{model.name} on {cluster.n_gpus} x {cluster.gpu.name} ({cluster.name}), global batch "
                 f"{job.global_batch} x {job.seq_len}: top {min(args.top, len(plans))} of {len(plans)} fitting layouts")
        stats = (f"searched {result.evaluated:,} layouts in {result.seconds:.2f} s "
                 f"({result.layouts_per_second:,.0f}/s); {result.rejected_oom:,} do not fit")
    best = plans[0]
    if args.save:
        best.save(args.save)
    if args.json:
        print(json.dumps([p.to_dict() for p in plans[: args.top]], indent=2))
        return 0
    console.print(report.plans_table(plans[: args.top], title))
    if stats:
        console.print(f"[dim]{stats}[/dim]")
    if args.explain or args.layout is not None:
        explain_plan = best
        report.explain(console, explain_plan)
    if not best.fits:
        over = (best.memory.total - best.memory.capacity) / 2**30
        console.print(f"[red]does not fit: {over:.1f} GiB over; try ckpt=full, zero=3, larger tp/pp, "
                      "or offload=cpu:1[/red]")
    report.confidence_note(console)
    if args.save:
        console.print(f"saved the plan to {args.save}")
    return 0 if best.fits else 1


def cmd_validate(args) -> int:
    from plait import report
    from plait.measure.published import predict_runs

    params, _ = _cost_params(args.calibration)
    results = predict_runs(args.runs, params)
    summary = report.error_summary(results)
    if args.out:
        _write_predictions(args.out, results)
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    console = _console()
    console.print(report.validation_table(results))
    console.print(report.summary_table(summary))
    if args.out:
        console.print(f"wrote {len(results)} rows to {args.out}")
    return 0


def _write_predictions(path: str, results) -> None:
    columns = ["id", "status", "predicted_step_time_s", "predicted_mfu", "predicted_mem_gb",
               "predicted_tokens_per_s_per_gpu", "reported_mfu", "reported_tokens_per_s_per_gpu",
               "reported_mem_gb", "mfu_error_points", "notes"]
    try:
        with Path(path).open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(columns)
            for r in results:
                values = {"id": r.id, "status": r.status, "notes": "; ".join(r.notes),
                          "mfu_error_points": r.mfu_error_points}
                for column in columns:
                    if column not in values:
                        values[column] = getattr(r, column)
                writer.writerow(["" if values[c] is None else (f"{values[c]:.6g}" if isinstance(values[c], float) else values[c])
                                 for c in columns])
    except OSError as exc:
        raise PlaitError(f"cannot write {path}: {exc}") from None


def cmd_models(args) -> int:
    from rich.table import Table

    from plait.spec.models import MODELS

    table = Table(title="Model presets (sources: plait/spec/models.py)", title_justify="left")
    for column in ("name", "arch", "layers", "hidden", "ffn", "heads", "kv heads", "vocab", "parameters"):
        table.add_column(column, justify="left" if column in ("name", "arch") else "right")
    for m in MODELS.values():
        table.add_row(m.name, m.arch, str(m.n_layers), str(m.hidden), str(m.ffn_hidden), str(m.n_heads),
                      str(m.n_kv_heads), str(m.vocab), f"{m.total_params():,}")
    _console().print(table)
    return 0


def cmd_clusters(args) -> int:
    from rich.table import Table

    from plait.spec.hardware import CLUSTERS, GIB

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
    _console().print(table)
    return 0


COMMANDS = {"plan": cmd_plan, "validate": cmd_validate, "models": cmd_models, "clusters": cmd_clusters}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except PlaitError as exc:
        print(f"plait: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("plait: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
