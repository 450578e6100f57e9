"""``plait plan``: rank layouts by predicted throughput, or evaluate one."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import TYPE_CHECKING

from plait.cli.support.common import console, cost_params, doc_len_of, warn
from plait.cli.jobfile.read import add_config_flags
from plait.errors import PlaitError
from plait.spec.units import GIB

if TYPE_CHECKING:  # the planner is imported inside the functions: plait --help stays quick
    from plait.plan.params import CostParams
    from plait.spec.hardware import ClusterSpec
    from plait.spec.layout import JobSpec
    from plait.spec.model import ModelSpec
    from plait.spec.stack import Stack

HELP = "rank layouts by predicted throughput, or evaluate one"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="preset name (plait models), config.json or model JSON")
    parser.add_argument("--cluster", default="dgx-h100", help="preset name (plait clusters) or a JSON file")
    parser.add_argument("--gpus", type=int, help="GPUs in the job (default: one node)")
    parser.add_argument("--global-batch", type=int, required=True, help="sequences per optimizer step")
    parser.add_argument("--seq-len", type=int, required=True, help="tokens per sequence")
    parser.add_argument("--doc-len", metavar="L|FILE",
                        help="packed documents with a document mask (plait train --doc-mask): their mean length "
                             "in tokens, or a token file to measure it from; attention is priced within documents")
    parser.add_argument("--calibration", help="calibration JSON replacing the default cost parameters")
    parser.add_argument("--stack", default="plait",
                        help="the training software to plan for: plait (plait train, the default), megatron-core, "
                             "megatron-lm, torchtitan, llm-foundry, deepspeed (plait stacks lists them), or a stack "
                             ".toml file; its kernels, overlaps and defaults price every layout")
    parser.add_argument("--layout", help='evaluate one layout, e.g. "dp=8,tp=4,pp=2,mbs=1,ckpt=selective"')
    parser.add_argument("--complete", action="store_true",
                        help="with --layout: keep the keys given and search those left out (mbs, zero, ckpt, sp, "
                             "schedule/vpp, cp, tp/pp/dp); the fastest layout that fits, completed knobs listed")
    parser.add_argument("--memory-headroom", type=float, default=0.05, metavar="F",
                        help="fraction of GPU memory kept free (default 0.05): a layout above capacity·(1-F) is "
                             "shown risky and never ranked first while one with headroom fits")
    parser.add_argument("--top", type=int, default=5, help="how many layouts to show (default 5)")
    parser.add_argument("--fix", action="append", default=[], metavar="KEY=VALUE",
                        help="pin a layout key in the search (repeatable), e.g. --fix tp=8")
    parser.add_argument("--max-pp", type=int, default=128, help="largest pipeline degree to search")
    parser.add_argument("--max-mbs", type=int, default=16, help="largest micro-batch size to search")
    parser.add_argument("--schedule", help="only this pipeline schedule (gpipe, 1f1b, interleaved-1f1b, zero-bubble)")
    parser.add_argument("--no-offload", action="store_true", help="never offload to make a layout fit")
    parser.add_argument("--exhaustive", action="store_true",
                        help="evaluate every layout (counts of all that fit) instead of skipping those a lower "
                             "bound on their step time shows slower than the --top shown (the same top either way)")
    parser.add_argument("--explain", action="store_true",
                        help="itemized memory and time of the best (or given) layout")
    parser.add_argument("--plot", metavar="FILE",
                        help="draw the best (or given) plan to FILE (.png, .svg or .pdf): memory per pipeline stage "
                             "against capacity and a step-time waterfall (needs matplotlib)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--save", help="write the best (or given) plan to this file (for plait train --plan)")
    parser.add_argument("--tokens", metavar="N",
                        help="also print how long training N tokens takes on the top layout, e.g. 2T, 300B, 1e12")
    compile = parser.add_mutually_exclusive_group()
    compile.add_argument("--compile", dest="compile", action="store_const", const=True, default=None,
                         help="price (and check the rules of) plait train --compile: blocks under torch.compile; "
                              "default: as plait train decides (compiled on GPUs where the layout allows)")
    compile.add_argument("--no-compile", dest="compile", action="store_const", const=False,
                         help="price eager blocks, as plait train --no-compile runs them")
    parser.add_argument("--any-runtime", action="store_true",
                        help="rank every layout the planner models, also those plait train does not run yet "
                             "(marked *); --save then writes such a layout too")
    add_config_flags(parser)


@dataclasses.dataclass(frozen=True)
class _Request:
    """What ``plait plan`` was asked, read and checked before any search."""

    model: ModelSpec
    cluster: ClusterSpec  # with the calibration's and the stack's GPU numbers
    job: JobSpec
    params: CostParams
    stack: Stack
    headroom: float  # fraction of GPU memory kept free
    tokens: float | None  # --tokens, or None
    compile: bool | None = None  # --compile / --no-compile / auto: the runtime rules and the pricing (params)


@dataclasses.dataclass
class _Result:
    """The plans to show (best first) and the words around them."""

    plans: list
    title: str
    stats: str = ""  # the search's numbers, dim
    completed: str = ""  # what was completed or assumed


def run(args) -> int:
    request = _request(args)
    if args.complete and args.layout is None:
        raise PlaitError("--complete completes a partial --layout; give one, e.g. --layout \"dp=8\" --complete")
    if args.layout is not None and args.complete:
        result = _completed(args, request)
    elif args.layout is not None:
        result = _given(args, request)
    else:
        result = _ranked(args, request)
    if not request.stack.is_plait:  # plait train's rules say nothing about another stack's layouts
        result.plans = [dataclasses.replace(p, runtime_violations=()) for p in result.plans]
        if args.layout is not None:
            result.title += f", priced for {request.stack.name}"
    best = result.plans[0]
    _save_and_plot(args, request, best)
    _warn_past_positions(request)
    if args.json:
        return _print_json(args, result)
    _print_tables(args, request, result)
    return 0 if best.fits else 1


def _warn_past_positions(request: _Request) -> None:
    """A RoPE model past its config's max_position_embeddings: one line on stderr, never a refusal."""
    from plait.spec.validate import past_positions_warning

    message = past_positions_warning(request.model, request.job.seq_len)
    if message:
        warn(message)


def _request(args) -> _Request:
    """The model, cluster, job, cost parameters and stack of ``args``, the flags checked in the order
    the errors are reported (a wrong --plot suffix first, before anything is computed)."""
    from plait.spec.hardware import get_cluster
    from plait.spec.layout import JobSpec
    from plait.spec.models import get_model

    if args.plot:
        from plait.measure.report.plan_plots import picture_format

        picture_format(args.plot)
    model = get_model(args.model)
    cluster = get_cluster(args.cluster)
    if args.gpus is not None and args.gpus < 1:
        raise PlaitError(f"--gpus {args.gpus}: need at least one GPU")
    cluster = cluster.with_gpus(args.gpus if args.gpus is not None else cluster.gpus_per_node)
    job = JobSpec(global_batch=args.global_batch, seq_len=args.seq_len, doc_len=doc_len_of(args.doc_len))
    calibration = None
    if args.calibration:
        from plait.plan.calibration import read_calibration

        calibration = read_calibration(args.calibration)  # read once: its parameters and its GPU's
        uncovered = calibration.coverage_warning(model, job.seq_len, job.global_batch, args.model)
        if uncovered:
            warn(uncovered)
    params, cluster = cost_params(calibration, cluster)
    stack, params, cluster = _for_stack(args.stack, calibration, params, cluster)
    from plait.plan.compiled import with_compile

    cpu = cluster.gpu.name == "cpu" or (calibration is not None and calibration.cpu_profile)
    params = with_compile(params, stack, args.compile, "cpu" if cpu else "cuda")
    tokens = None
    if args.tokens is not None:
        from plait.spec.units import parse_token_count

        try:
            tokens = parse_token_count(args.tokens)
        except ValueError as exc:
            raise PlaitError(f"--tokens: {exc}") from None
    if not 0 <= args.memory_headroom < 1:
        raise PlaitError(f"--memory-headroom {args.memory_headroom}: give a fraction of GPU memory in [0, 1), "
                         "e.g. 0.05")
    return _Request(model, cluster, job, params, stack, args.memory_headroom, tokens, args.compile)


def _heading(request: _Request) -> str:
    return f"{request.model.name} on {request.cluster.n_gpus} x {request.cluster.gpu.name}"


def _completed(args, request: _Request) -> _Result:
    """``--layout ... --complete``: the keys given kept, the others searched."""
    from plait.plan.complete import complete, given_keys
    from plait.plan.plan import evaluate

    r = request
    completion = complete(r.model, r.cluster, r.job, given_keys(args.layout), r.params, headroom=r.headroom,
                          max_mbs=args.max_mbs, runtime=r.stack.runtime, cp_impls=r.stack.cp_impls)
    return _Result([evaluate(r.model, r.cluster, r.job, completion.layout, r.params, r.stack.runtime, r.compile)],
                   f"{_heading(r)}: given layout, completed",
                   f"searched {completion.evaluated:,} layouts with the given keys",
                   completion.note() or "completed: nothing (every searched knob was given)")


def _given(args, request: _Request) -> _Result:
    """``--layout``: that layout, with the stack's defaults for the keys it leaves out."""
    from plait.plan.plan import evaluate

    r = request
    layout, assumed = _stack_defaults(args.layout, r)
    return _Result([evaluate(r.model, r.cluster, r.job, layout, r.params, r.stack.runtime, r.compile)],
                   f"{_heading(r)}: given layout", completed=assumed)


def _ranked(args, request: _Request) -> _Result:
    """No ``--layout``: search, and rank the layouts that fit."""
    from plait.cli.support import tables
    from plait.plan.search import SearchConstraints, require_plans, search
    from plait.spec.layout import Layout

    r, own = request, request.stack.is_plait
    if args.top < 1:
        raise PlaitError("--top must be at least 1")
    constraints = SearchConstraints(
        fixed=Layout.parse_fixed(args.fix), max_pp=args.max_pp, max_mbs=args.max_mbs,
        schedules=(args.schedule,) if args.schedule else SearchConstraints().schedules,
        allow_offload=not args.no_offload)
    if args.schedule:
        Layout(schedule=args.schedule)  # validates the name
    if own and not args.any_runtime:
        _refuse_unrunnable_model(r.model, r.job)
    found = search(r.model, r.cluster, r.job, constraints, r.params, runnable=own and not args.any_runtime,
                   compile=r.compile, headroom=r.headroom, runtime=r.stack.runtime, cp_impls=r.stack.cp_impls,
                   keep=None if args.exhaustive else args.top)
    plans = require_plans(r.model, r.cluster, r.job, found, constraints)
    which = ("fitting layouts" if args.any_runtime else "fitting layouts that plait train runs") if own else \
        f"fitting layouts, priced for {r.stack.name} ({r.stack.summary})"
    title = (f"{_heading(r)} ({r.cluster.name}), global batch {r.job.global_batch} x {r.job.seq_len}: "
             f"top {min(args.top, len(plans))}{'' if found.skipped else f' of {len(plans)}'} {which}")
    stats = tables.search_stats(found, args.top)
    hidden = 0 if args.any_runtime or not own else found.unrunnable_ahead(1)
    if hidden:
        stats += (f"; {hidden:,} faster fitting layout(s) that plait train does not run yet are not ranked "
                  "(--any-runtime shows them)")
    completed = _searched_note(plans[0].layout, dict(constraints.fixed)) if constraints.fixed else ""
    return _Result(plans, title, stats, completed)


def _save_and_plot(args, request: _Request, best) -> None:
    """``--save`` (refused for a layout plait train would not run) and ``--plot``."""
    if args.save:
        if not request.stack.is_plait:
            raise PlaitError(f"not saving: --stack {request.stack.name} prices the layout for that software, and "
                             "plait train runs plait's own (plan again without --stack, or with --stack plait, to save)")
        if not best.runnable and not args.any_runtime:
            raise PlaitError(f"not saving layout {best.layout}: plait train does not run it yet ("
                             + "; ".join(v.message for v in best.runtime_violations)
                             + "); pass --any-runtime to save it anyway")
        best.save(args.save)
    if args.plot:
        _plot(best, request.params, args.plot)
        if args.json:
            print(f"wrote the plan's picture to {args.plot}", file=sys.stderr)


def _print_json(args, result: _Result) -> int:
    """stdout stays one JSON document; what was completed goes to stderr."""
    print(json.dumps([p.to_dict() for p in result.plans[: args.top]], indent=2))
    if result.completed:
        print(result.completed, file=sys.stderr)
    return 0


def _print_tables(args, request: _Request, result: _Result) -> None:
    """The model line, the plans table and the notes under it."""
    from plait.cli.support import tables

    out, headroom, shown = console(), request.headroom, result.plans[: args.top]
    best = result.plans[0]
    out.print(tables.model_line(request.model, request.job.seq_len))
    out.print(tables.plans_table(shown, result.title, headroom))
    if result.stats:
        out.print(f"[dim]{result.stats}[/dim]")
    out.print(f"[dim]{tables.compile_note(shown)}[/dim]")
    why_first = tables.why_first(shown, headroom) if args.layout is None else ""
    if why_first:
        out.print(f"[dim]{why_first}[/dim]")
    if result.completed:
        out.print(result.completed)
    if request.tokens is not None:
        out.print(tables.training_time_line(best, request.tokens))
    if best.fits and _is_risky(best, headroom):
        out.print(f"[yellow]risky: {best.layout} leaves less than the {100 * headroom:.0f}% memory headroom "
                  "(fragmentation, NCCL buffers, unfused-kernel temporaries are not all in the formula)"
                  + ("; no layout fits with the headroom" if args.layout is None or args.complete else "")
                  + "[/yellow]")
    _print_notes(args, request, out, best, shown)


def _print_notes(args, request: _Request, out, best, shown) -> None:
    """What plait train does not run, the itemized plan, what does not fit, and what was written."""
    from plait.cli.support import tables

    unrunnable = [p for p in shown if not p.runnable]
    if unrunnable:
        out.print("* plait train does not run this layout yet: "
                  + "; ".join(sorted({v.message for p in unrunnable for v in p.runtime_violations})))
    if args.explain or args.layout is not None:
        tables.explain(out, best, request.params, request.stack.runtime)
    if not best.fits:
        over = (best.memory.total - best.memory.capacity) / GIB
        out.print(f"[red]does not fit: {over:.1f} GiB over; try ckpt=full, zero=3, larger tp/pp, "
                  "or offload=cpu:1[/red]")
    tables.confidence_note(out)
    if args.save:
        out.print(f"saved the plan to {args.save}")
    if args.plot:
        out.print(f"wrote the plan's picture to {args.plot}")


def _refuse_unrunnable_model(model, job) -> None:
    """One line at once (not after the whole search) when plait train runs no layout of ``model`` for
    ``job`` at all (``spec.capabilities.model_blockers``)."""
    from plait.spec.capabilities import model_blockers

    blockers = model_blockers(model, job)
    if blockers:
        raise PlaitError(f"plait train runs no layout of {model.name} for this job ("
                         + "; ".join(f"{v.rule}: {v.message}" for v in blockers)
                         + "); plait plan --any-runtime ranks them anyway, or --stack NAME for the software you run")


def _for_stack(name: str, calibration, params, cluster):
    """(the stack, the cost parameters with its numbers, the cluster with its kernel rates); what
    ``calibration`` (read from --calibration, or None) measured (its cost parameters, its GPU's attention
    efficiency) wins over the stack's."""
    from plait.plan.params import measured_fields, params_for_stack
    from plait.spec.stack import get_stack

    stack = get_stack(name)
    params = params_for_stack(stack, params, keep=measured_fields(params))
    measured_gpu = dict(calibration.gpu_overrides) if calibration is not None else ()
    if "attention_efficiency" not in measured_gpu:
        cluster = dataclasses.replace(cluster, gpu=stack.gpu(cluster.gpu))
    return stack, params, cluster


def _stack_defaults(text: str, request: _Request):
    """(the ``--layout`` with the stack's defaults for the keys it leaves out, a note of what was assumed).
    A context-parallel kernel left out is the stack's own (its default, else the fastest of its
    ``cp_impls``) on a GPU, and the exact ring on a CPU (a profile's 4-byte compute dtype)."""
    from plait.plan.complete import given_keys
    from plait.plan.context.choice import fastest_cp_impl
    from plait.spec.layout import Layout
    from plait.spec.stack import left_out_defaults

    r = request
    layout, given = Layout.parse(text), given_keys(text)
    moot = [k for k, matters in (("cp_impl", layout.cp > 1), ("sp", layout.tp > 1),
                                 ("zero", layout.dp * layout.cp > 1)) if not matters]
    defaults = left_out_defaults(r.stack, given, moot)
    if layout.cp > 1 and "cp_impl" not in given:
        if r.cluster.gpu.element_bytes >= 4:
            defaults["cp_impl"] = "ring"
        elif "cp_impl" not in defaults:
            defaults["cp_impl"] = fastest_cp_impl(r.model, r.cluster, r.job, layout, r.params, r.stack.cp_impls)
    assumed = {k: v for k, v in defaults.items() if getattr(layout, k) != v}
    if not assumed:
        return layout, ""
    note = ", ".join(f"{k}={v}" for k, v in assumed.items() if k != "ckpt_layers")
    return dataclasses.replace(layout, **assumed), \
        f"assumed (the {r.stack.name} stack's defaults for keys not given): {note}"


def _plot(plan, params, path: str) -> None:
    """Write ``plait plan --plot``'s picture (matplotlib is imported only here)."""
    from plait.measure.report.plan_plots import plan_plot
    from plait.measure.report.stage_memory import stage_memories

    plan_plot(plan, stage_memories(plan.model, plan.cluster, plan.job, plan.layout, params), path)


def _is_risky(plan, headroom: float) -> bool:
    from plait.plan.memory import is_risky

    return is_risky(plan.memory, headroom)


def _searched_note(layout, fixed: dict) -> str:
    """``completed by search: mbs=2, zero=1, ...`` - the searched knobs of the top layout."""
    from plait.plan.complete import COMPLETABLE

    knobs = [k for k in COMPLETABLE if k not in fixed and not (k == "sp" and layout.tp == 1)
             and not (k in ("vpp", "schedule") and layout.pp == 1)]
    values = [f"{k}={_knob_value(layout, k)}" for k in knobs]
    return "completed by search (#1): " + ", ".join(values) + " — fastest that fits" if values else ""


def _knob_value(layout, key: str):
    """A knob as the note writes it: ``ckpt`` with its layer count (``full:4``), a flag as 0 or 1."""
    if key == "ckpt":
        return layout.ckpt + (f":{layout.ckpt_layers}" if layout.ckpt_layers else "")
    value = getattr(layout, key)
    return int(value) if isinstance(value, bool) else value
