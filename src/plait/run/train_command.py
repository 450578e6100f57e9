"""``plait train``: build the RunConfig from the command line or a plan, check it, launch it."""

from __future__ import annotations

import sys

from plait.errors import PlaitError
from plait.run.config import OptimConfig, RunConfig, plan_parts
from plait.run.launch import LaunchOptions, launch, print_dry_run
from plait.run.preflight import preflight
from plait.spec.layout import Layout


def launch_options(args, default_world: int | None = None) -> LaunchOptions:
    """torchrun placement; without --nproc-per-node/--gpus, the layout's world size over nnodes."""
    nnodes = args.nnodes
    if nnodes < 1:
        raise PlaitError(f"--nnodes {nnodes}: need at least one node")
    nproc = args.nproc_per_node
    if args.gpus is not None:
        if args.gpus < 1 or args.gpus % nnodes:
            raise PlaitError(f"--gpus {args.gpus} is not a positive multiple of --nnodes {nnodes}")
        if nproc is not None and nproc * nnodes != args.gpus:
            raise PlaitError(f"--gpus {args.gpus} disagrees with --nproc-per-node {nproc} × --nnodes {nnodes}")
        nproc = args.gpus // nnodes
    if nproc is None:
        nproc = max(1, (default_world or 1) // nnodes)
    if nproc < 1:
        raise PlaitError(f"--nproc-per-node {nproc}: need at least one process")
    return LaunchOptions(nproc_per_node=nproc, nnodes=nnodes, rdzv_endpoint=args.rdzv_endpoint,
                         rdzv_id=args.rdzv_id, node_rank=args.node_rank, master_addr=args.master_addr,
                         master_port=args.master_port)


def run_config(args, options: LaunchOptions) -> RunConfig:
    """The RunConfig that the flags (and ``--plan``) describe; flags override the plan's job."""
    from plait.plan.plan import load_plan
    from plait.spec.models import get_model

    gpu = args.gpu
    if args.plan:
        model, layout, job, plan_gpu = plan_parts(load_plan(args.plan), args.plan)
        if args.model and get_model(args.model) != model:
            raise PlaitError(f"{args.plan} is a plan for model {model.name}, not {args.model}")
        if args.layout:
            raise PlaitError("give either --plan or --layout, not both (the plan holds the layout)")
        global_batch = args.global_batch or job.global_batch
        seq_len = args.seq_len or job.seq_len
        gpu = gpu or plan_gpu
    else:
        if not args.model:
            raise PlaitError("plait train needs --plan FILE, or --model with --global-batch and --seq-len")
        model = get_model(args.model)
        layout = Layout.parse(args.layout) if args.layout else Layout(dp=options.world_size)
        if args.global_batch is None or args.seq_len is None:
            raise PlaitError("plait train --model needs --global-batch and --seq-len")
        global_batch, seq_len = args.global_batch, args.seq_len
    warmup = args.warmup_steps if args.warmup_steps is not None else max(1, args.steps // 10)
    optim = OptimConfig(lr=args.lr, warmup_steps=warmup, weight_decay=args.weight_decay, grad_clip=args.grad_clip)
    config = RunConfig(model=model, layout=layout, global_batch=global_batch, seq_len=seq_len, steps=args.steps,
                       seed=args.seed, data=args.data, log=args.log, optim=optim, compile=args.compile,
                       compile_backend=args.compile_backend,
                       device=args.device, gpu=gpu, timeout_s=args.timeout, log_every=args.log_every)
    if args.data != "synthetic":
        from plait.run.data import open_tokens

        open_tokens(args.data, model.vocab, args.seed, seq_len=seq_len, model_name=model.name)  # fail early
    return config


def _layout_world(args) -> int | None:
    """The world size the plan or --layout asks for (the default process count)."""
    from plait.plan.plan import load_plan

    if args.plan:
        return plan_parts(load_plan(args.plan), args.plan)[1].world_size
    return Layout.parse(args.layout).world_size if args.layout else None


def train_command(args) -> int:
    options = launch_options(args, _layout_world(args))
    config = run_config(args, options)
    config, warnings = preflight(config, options, allow_oom=args.allow_oom)
    for warning in warnings:
        print(f"plait: warning: {warning}", file=sys.stderr)
    if args.dry_run:
        print_dry_run(config, options)
        return 0
    print(f"plait train: {config.model.name}, layout {config.layout}, global batch {config.global_batch} × "
          f"{config.seq_len}, {config.steps} steps, {options.world_size} processes", flush=True)
    launch(config, options, run_dir=args.run_dir)  # raises PlaitError when any rank failed
    return 0
