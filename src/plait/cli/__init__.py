"""plait command line: ``plait plan``, ``train``, ``data prepare``, ``validate``, ``models``, ``clusters``.

Every user error ends with one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import csv
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


def _add_train_args(train: argparse.ArgumentParser) -> None:
    what = train.add_argument_group("what to train (a saved plan, or model + layout + batch)")
    what.add_argument("--plan", help="plan file written by plait plan --save")
    what.add_argument("--model", help="model preset, config.json or model JSON")
    what.add_argument("--layout", help='e.g. "dp=2,tp=2,pp=2,zero=3,ckpt=selective" (default: dp over all processes)')
    what.add_argument("--global-batch", type=int, help="sequences per optimizer step")
    what.add_argument("--seq-len", type=int, help="tokens per sequence")
    what.add_argument("--steps", type=int, help="optimizer steps in all (default 20; resumed: the saved run's)")
    what.add_argument("--seed", type=int, help="seed of weights, data order and dropout (default 0)")
    what.add_argument("--data", default="synthetic", help="synthetic, or a token file (plait data prepare)")
    what.add_argument("--log", help="JSONL metrics file: one line per step, then a summary line")
    opt = train.add_argument_group("optimizer")
    opt.add_argument("--lr", type=float, help="peak learning rate (default 3e-4)")
    opt.add_argument("--warmup-steps", type=int, default=None, help="linear warm-up steps (default: 10%% of steps)")
    opt.add_argument("--weight-decay", type=float, help="AdamW weight decay of matrices (default 0.1)")
    opt.add_argument("--grad-clip", type=float, help="max global gradient norm (default 1.0; 0: off)")
    where = train.add_argument_group("where to run (torchrun)")
    where.add_argument("--nproc-per-node", "--nproc", type=int, help="processes (GPUs) per node")
    where.add_argument("--gpus", type=int, help="processes in all (alternative to --nproc-per-node)")
    where.add_argument("--nnodes", default="1",
                       help="nodes (run the same command on each); elastic: MIN:MAX with --rdzv-endpoint")
    where.add_argument("--rdzv-endpoint", help="host:port of the rendezvous, for several nodes")
    where.add_argument("--rdzv-id", default="plait", help="job id shared by the nodes of one run")
    where.add_argument("--node-rank", type=int, help="this node's rank (static rendezvous, with --master-addr)")
    where.add_argument("--master-addr", help="address of node 0 (static rendezvous)")
    where.add_argument("--master-port", type=int, help="port on node 0 (static rendezvous; default 29500)")
    where.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="default: cuda if present")
    where.add_argument("--gpu", help="GPU spec for MFU and the memory check (plait clusters); default: from the device name")
    where.add_argument("--compile", action="store_true", help="torch.compile every block")
    where.add_argument("--compile-backend", default="inductor", help="torch.compile backend (default inductor)")
    where.add_argument("--offload-dir", default=None,
                       help="offload=disk:α writes activations under this directory (default: the temp dir)")
    where.add_argument("--timeout", type=float, default=600.0,
                       help="collective timeout in seconds: ranks waiting on a dead peer give up (default 600)")
    where.add_argument("--allow-oom", action="store_true", help="run even if the planner predicts out-of-memory")
    where.add_argument("--log-every", type=int, default=1, help="print every N steps when not on a terminal")
    where.add_argument("--run-dir", help="keep the run's config and error files here (default: a temporary dir)")
    where.add_argument("--dry-run", action="store_true", help="check everything, print the torchrun command, do not run")
    ckpt = train.add_argument_group("checkpoints, resume, failures")
    ckpt.add_argument("--checkpoint-dir", help="save checkpoints here (step_NNNNNNNN directories, DCP + manifest)")
    ckpt.add_argument("--checkpoint-every", type=int, help="save every N steps (default: only on SIGTERM and at the end)")
    ckpt.add_argument("--keep-checkpoints", type=int, help="keep the newest K complete checkpoints (default 3; 0: all)")
    ckpt.add_argument("--async-checkpoint", choices=("auto", "on", "off"), default="auto",
                      help="write checkpoints from a background thread (auto: on GPU)")
    ckpt.add_argument("--resume", metavar="DIR",
                      help="resume from a checkpoint directory, or the newest valid one in a --checkpoint-dir; "
                           "with another --layout or process count (re-planned when the world size changed)")
    ckpt.add_argument("--max-restarts", type=int, default=0,
                      help="torchrun restarts after a worker dies; each restart resumes from the newest checkpoint")
    ckpt.add_argument("--on-nan", choices=("stop", "skip"), default="stop",
                      help="non-finite loss or gradient norm: stop naming the step, or skip that optimizer step")


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

    _add_train_args(sub.add_parser("train", help="train a layout with torchrun (CPU: gloo, GPU: NCCL)"))

    _add_calibration_args(sub)

    data = sub.add_parser("data", help="prepare training data")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    prepare = data_sub.add_parser("prepare", help="tokenize text files into a token file for plait train --data")
    prepare.add_argument("inputs", nargs="*", help="text files or directories of *.txt (default: the sample corpus)")
    prepare.add_argument("--out", required=True, help="token file to write")
    prepare.add_argument("--tokenizer", default="bytes", help="tokenizer (bytes: UTF-8 bytes, vocab 257)")

    sub.add_parser("models", help="list model presets")
    sub.add_parser("clusters", help="list cluster and GPU presets")
    _add_measure_args(sub)
    return parser


def _add_calibration_args(sub) -> None:
    """``plait profile`` and ``plait calibrate fit``: their flags and commands live in plait.measure
    (each parser's ``handler`` default is its command function)."""
    from plait.cli import calibrate as calibrate_command
    from plait.cli import profile as profile_command

    profile_command.register(sub)
    calibrate_command.register(sub)


def _add_measure_args(sub) -> None:
    """``plait sweep`` and ``plait report``: their flags and commands live in plait.measure
    (each parser's ``handler`` default is its command function)."""
    from plait.cli import report as report_command
    from plait.cli import sweep as sweep_command

    sweep_command.register(sub)
    report_command.register(sub)


def _console():
    """A rich console; wide when the output is not a terminal (files, pipes, CI logs)."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=200)


def _cost_params(path: str | None, cluster=None):
    """(CostParams, cluster with GPU overrides applied) from a calibration file, else defaults."""
    from plait.plan.calibration import read_calibration
    from plait.plan.params import DEFAULT_PARAMS

    if not path:
        return DEFAULT_PARAMS, cluster
    calibration = read_calibration(path)  # checks every field; GPU and link overrides included
    if cluster is not None:
        cluster, warnings = calibration.apply(cluster)
        params = calibration.params
    else:  # e.g. validate: published runs on other GPUs
        params, warnings = calibration.params_for_runs_elsewhere()
    for warning in warnings:
        print(f"plait: warning: {warning}", file=sys.stderr)
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
    from plait.cli import tables as report
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
    from plait.cli import tables as report
    from plait.measure.published import error_summary, predict_runs

    params, _ = _cost_params(args.calibration)
    results = predict_runs(args.runs, params)
    summary = error_summary(results)
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


def cmd_train(args) -> int:
    from plait.cli.train import train_command

    return train_command(args)


def cmd_data(args) -> int:
    from plait.run.data.tokens import prepare, sample_corpus_path

    inputs = args.inputs or [str(sample_corpus_path())]
    summary = prepare(inputs, args.out, tokenizer=args.tokenizer)
    print(f"wrote {summary['n_tokens']:,} tokens ({summary['dtype']}, vocab {summary['vocab_size']}) from "
          f"{summary['n_files']} files ({summary['n_bytes_text']:,} bytes of text) to {summary['path']}")
    return 0


COMMANDS = {"plan": cmd_plan, "train": cmd_train, "data": cmd_data, "validate": cmd_validate, "models": cmd_models, "clusters": cmd_clusters}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        handler = getattr(args, "handler", None) or COMMANDS[args.command]  # handler: commands of other modules
        return handler(args)
    except PlaitError as exc:
        print(f"plait: error: {exc}", file=sys.stderr)
        return getattr(exc, "exit_code", EXIT_USAGE)
    except KeyboardInterrupt:
        print("plait: interrupted", file=sys.stderr)
        return 130


