"""``plait train``: build the RunConfig from the command line or a plan, check it, launch it."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from plait.errors import PlaitError
from plait.run.checkpoint import store
from plait.run.config import OptimConfig, RunConfig, plan_parts
from plait.run.launcher.launch import LaunchOptions, launch, print_dry_run
from plait.run.launcher.preflight import preflight
from plait.spec.layout import Layout

DEFAULT_STEPS = 20


def parse_nnodes(text) -> tuple[int, int]:
    """(min, max) nodes from ``--nnodes N`` or the elastic ``--nnodes MIN:MAX``."""
    try:
        low, _, high = str(text).partition(":")
        low_n, high_n = int(low), int(high or low)
    except ValueError:
        raise PlaitError(f"--nnodes {text}: expected N or MIN:MAX") from None
    if low_n < 1 or high_n < low_n:
        raise PlaitError(f"--nnodes {text}: need 1 <= MIN <= MAX")
    return low_n, high_n


def launch_options(args, default_world: int | None = None) -> LaunchOptions:
    """torchrun placement; without --nproc-per-node/--gpus, the layout's world size over nnodes."""
    min_nodes, nnodes = parse_nnodes(args.nnodes)
    if min_nodes != nnodes and not args.rdzv_endpoint:
        raise PlaitError(f"--nnodes {args.nnodes} (elastic) needs --rdzv-endpoint host:port")
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
    restarts = getattr(args, "max_restarts", 0) or 0
    if restarts < 0:
        raise PlaitError(f"--max-restarts {restarts}: must be >= 0")
    return LaunchOptions(nproc_per_node=nproc, nnodes=nnodes, min_nnodes=min_nodes, rdzv_endpoint=args.rdzv_endpoint,
                         rdzv_id=args.rdzv_id, node_rank=args.node_rank, master_addr=args.master_addr,
                         master_port=args.master_port, max_restarts=restarts)


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
    steps = args.steps or DEFAULT_STEPS
    warmup = args.warmup_steps if args.warmup_steps is not None else max(1, steps // 10)
    defaults = OptimConfig()
    optim = OptimConfig(lr=_given(args.lr, defaults.lr), warmup_steps=warmup,
                        weight_decay=_given(args.weight_decay, defaults.weight_decay),
                        grad_clip=_given(args.grad_clip, defaults.grad_clip))
    seed = _given(args.seed, 0)
    config = RunConfig(model=model, layout=layout, global_batch=global_batch, seq_len=seq_len, steps=steps,
                       seed=seed, data=args.data, log=args.log, optim=optim, compile=args.compile,
                       compile_backend=args.compile_backend,
                       device=args.device, gpu=gpu, timeout_s=args.timeout, log_every=args.log_every,
                       offload_dir=getattr(args, "offload_dir", None))
    if args.data != "synthetic":
        from plait.run.data.tokens import open_tokens

        open_tokens(args.data, model.vocab, seed, seq_len=seq_len, model_name=model.name)  # fail early
    return config


def _given(value, default):
    return default if value is None else value


def _layout_world(args) -> int | None:
    """The world size the plan or --layout asks for (the default process count)."""
    from plait.plan.plan import load_plan

    if args.plan:
        return plan_parts(load_plan(args.plan), args.plan)[1].world_size
    return Layout.parse(args.layout).world_size if args.layout else None


def checkpoint_options(config: RunConfig, args, saved: RunConfig | None = None) -> RunConfig:
    """``config`` with the checkpoint flags applied (a resumed run inherits the saved ones)."""
    base = saved or config
    keep = args.keep_checkpoints if args.keep_checkpoints is not None else base.keep_checkpoints
    every = args.checkpoint_every if args.checkpoint_every is not None else base.checkpoint_every
    directory = args.checkpoint_dir or (saved.checkpoint_dir if saved else None)
    use_async = {"on": True, "off": False}.get(args.async_checkpoint)
    if directory:
        directory = str(Path(directory).resolve())
    if every and not directory:
        raise PlaitError("--checkpoint-every needs --checkpoint-dir")
    return dataclasses.replace(config, checkpoint_dir=directory, checkpoint_every=every or 0, keep_checkpoints=keep,
                               async_checkpoint=use_async, on_nan=args.on_nan)


def resume_config(args) -> tuple[RunConfig, LaunchOptions, list[str], tuple]:
    """The resumed run: the saved run's trajectory, this command's layout and processes, and notes."""
    from plait.plan.plan import load_plan
    from plait.run.checkpoint.select import check_same_run, nothing_to_train
    from plait.run.replan import replan
    from plait.spec.models import get_model

    # sizes only here: the workers check every CRC-32 in parallel (and fall back) before loading
    checkpoint, refused = store.resolve(args.resume, checksums=False)
    notes = [f"refused {why}" for _, why in refused]
    saved = RunConfig.from_dict(checkpoint.run)
    path = str(checkpoint.path)
    layout = None
    if args.plan:
        if args.layout:
            raise PlaitError("give either --plan or --layout, not both (the plan holds the layout)")
        model, layout, job, _ = plan_parts(load_plan(args.plan), args.plan)
        check_same_run(saved, model, job.global_batch, job.seq_len, path)
    check_same_run(saved, get_model(args.model) if args.model else None, args.global_batch, args.seq_len, path)
    fixed = [flag for flag, value in (("--seed", args.seed), ("--lr", args.lr), ("--warmup-steps", args.warmup_steps),
                                      ("--weight-decay", args.weight_decay), ("--grad-clip", args.grad_clip))
             if value is not None]
    if fixed:
        raise PlaitError(f"a resumed run keeps the checkpoint's seed and optimizer settings; drop {', '.join(fixed)}")
    if args.layout:
        layout = Layout.parse(args.layout)
    options = launch_options(args, layout.world_size if layout else saved.layout.world_size)
    config = dataclasses.replace(
        saved, steps=args.steps or saved.steps, log=args.log, device=args.device, gpu=args.gpu, timeout_s=args.timeout,
        log_every=args.log_every, compile=args.compile, compile_backend=args.compile_backend,
        data=args.data if args.data != "synthetic" else saved.data, resume_from=path, prediction=None)
    if config.data != saved.data:
        notes.append(f"reading data {config.data} instead of the saved run's {saved.data}: the same samples only "
                     "if it holds the same tokens")
    if config.steps != saved.steps:
        notes.append(f"--steps {config.steps} (the saved run planned {saved.steps}): the cosine schedule is "
                     "stretched, so the learning rate changes from the resumed step on")
    if config.data != "synthetic":
        from plait.run.data.tokens import open_tokens

        open_tokens(config.data, config.model.vocab, config.seed, seq_len=config.seq_len,
                    model_name=config.model.name)  # fail early: the saved run's data must still be there
    if layout is not None:
        config = dataclasses.replace(config, layout=layout)
    elif options.world_size != saved.layout.world_size:
        config, why = replan(config, options.world_size, options.nproc_per_node)
        notes.append(why)
    config = checkpoint_options(config, args, saved)
    why = nothing_to_train(checkpoint.path, checkpoint.step, config.steps)
    if why:
        raise PlaitError(f"{why}; pass a larger --steps")
    notes.append(f"resuming from {path} (step {checkpoint.step} of {config.steps}, saved under "
                 f"{checkpoint.manifest.get('layout')} on {checkpoint.manifest.get('world_size')} processes)")
    return config, options, notes, (checkpoint, [p for p, _ in refused])


def fresh_config(args) -> tuple[RunConfig, LaunchOptions]:
    options = launch_options(args, _layout_world(args))
    config = checkpoint_options(run_config(args, options), args)
    if config.checkpoint_dir:
        existing = store.complete_dirs(Path(config.checkpoint_dir))
        if existing and options.min_nnodes not in (None, options.nnodes):
            print(f"plait train: elastic run: the workers resume from the newest valid checkpoint in "
                  f"{config.checkpoint_dir} ({existing[-1].name})", flush=True)
        elif existing:
            raise PlaitError(f"--checkpoint-dir {config.checkpoint_dir} already holds checkpoints (newest "
                             f"{existing[-1].name}): resume with --resume {config.checkpoint_dir}, or use an "
                             "empty directory")
    return config, options


def train_command(args) -> int:
    notes: list[str] = []
    resumed = None
    if args.resume:
        config, options, notes, resumed = resume_config(args)
    else:
        config, options = fresh_config(args)
    config, warnings = preflight(config, options, allow_oom=args.allow_oom)
    for warning in warnings:
        print(f"plait: warning: {warning}", file=sys.stderr)
    for note in notes:
        print(f"plait train: {note}", flush=True)
    if args.dry_run:
        print_dry_run(config, options)
        return 0
    if config.checkpoint_dir:
        store.check_writable(Path(config.checkpoint_dir))
        if resumed is not None:
            from plait.run.checkpoint.select import prepare_checkpoint_root

            for note in prepare_checkpoint_root(resumed[0], Path(config.checkpoint_dir), resumed[1]):
                print(f"plait train: {note}", flush=True)
    print(f"plait train: {config.model.name}, layout {config.layout}, global batch {config.global_batch} × "
          f"{config.seq_len}, {config.steps} steps, {options.world_size} processes", flush=True)
    launch(config, options, run_dir=args.run_dir)  # raises PlaitError when any rank failed
    return 0
