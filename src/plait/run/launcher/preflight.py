"""Checks before any worker starts: the layout is valid, runnable, and predicted to fit.

Runs in the ``plait train`` process. It never imports torch except to ask whether a GPU is
present, how many and what it is called (``plait.run.device``).
"""

from __future__ import annotations

import dataclasses

from plait.errors import PlaitError
from plait.run.config import Prediction, RunConfig
from plait.run.device import gpu_from_device_name, local_accelerator, uses_gpu
from plait.run.launcher.launch import LaunchOptions
from plait.spec.hardware import ClusterSpec, cluster_for_gpu, get_gpu
from plait.spec.units import DEFAULT_GPU, GIB
from plait.spec.validate import errors_of, past_positions_warning, validate


def runs_on_gpu(config: RunConfig, nproc_per_node: int) -> bool:
    """Whether the run uses GPUs (``uses_gpu``), with one GPU of this node for each of its processes."""
    if not uses_gpu(config.runtime.device):
        return False
    import torch

    count = torch.cuda.device_count()
    if nproc_per_node > count:
        raise PlaitError(f"--nproc-per-node {nproc_per_node} but this node has {count} GPU(s): one process "
                         "per GPU; use fewer processes, more nodes, or --device cpu")
    return True


def resolve_gpu(config: RunConfig, on_gpu: bool) -> RunConfig:
    """Fill ``config.runtime.gpu`` from the device name when the user did not give one."""
    named = config.runtime.gpu
    if named:
        get_gpu(named)  # validates the name
        seen = gpu_from_device_name(local_accelerator() or "") if on_gpu else None
        if seen and get_gpu(seen).name != get_gpu(named).name:
            raise PlaitError(f"this machine's GPU is a {seen} but the run names {named} (the plan's "
                             f"cluster or --gpu); pass --gpu {seen} for the right peak and memory")
        return config
    if not on_gpu:
        return config
    name = local_accelerator() or ""
    preset = gpu_from_device_name(name)
    return dataclasses.replace(config, runtime=dataclasses.replace(config.runtime, gpu=preset)) if preset else config


def run_cluster(config: RunConfig, options: LaunchOptions) -> ClusterSpec:
    """The cluster the planner predicts for: the run's GPU, its nodes and processes per node."""
    return cluster_for_gpu(config.runtime.gpu or DEFAULT_GPU, options.world_size, options.nproc_per_node)


def preflight(config: RunConfig, options: LaunchOptions, allow_oom: bool = False,
              dry_run: bool = False) -> tuple[RunConfig, list[str]]:
    """Validate ``config`` for ``options``; return it with GPU and prediction filled, and warnings.

    Raises PlaitError for a wrong process count, a broken layout rule, a layout feature the
    runtime does not run, or (unless ``allow_oom``) a predicted out-of-memory: of the GPU, or on
    the CPU of the host's available memory for all its processes (``plait.run.launcher.host_memory``).
    ``dry_run`` with ``--device cuda`` on a machine without a GPU (a login node) checks the run as
    it will run on the GPU the run names (``--gpu`` or the plan's cluster), without this machine's.
    """
    job = config.job
    layout, model = job.layout, job.model
    if layout.world_size != options.world_size:
        raise PlaitError(
            f"layout {layout} needs dp·tp·pp·cp = {layout.world_size} processes but --nproc-per-node "
            f"{options.nproc_per_node} × --nnodes {options.nnodes} = {options.world_size} were asked for; "
            f"use --nproc-per-node {max(1, layout.world_size // options.nnodes)} or change dp")
    cluster = run_cluster(config, options)
    violations = validate(model, cluster, job.job_spec, layout)
    broken = [v for v in errors_of(violations) if v.rule not in ("whole-nodes",)]
    if broken:
        raise PlaitError(f"layout {layout} cannot run {model.name}: " + "; ".join(v.message for v in broken))
    problems = config.runtime_problems()
    if problems:
        raise PlaitError(f"layout {layout}: " + "; ".join(problems))
    warnings = [v.message for v in violations if v.severity == "warning"]
    warnings += [w for w in [past_positions_warning(model, job.seq_len)] if w]  # RoPE past max_position_embeddings
    elsewhere = dry_run and config.runtime.device == "cuda" and local_accelerator() is None
    if elsewhere:
        warnings.append(_checked_elsewhere(config, options))
    on_gpu = elsewhere or runs_on_gpu(config, options.nproc_per_node)
    config = resolve_gpu(config, on_gpu)
    if not on_gpu:  # the OS kills a CPU worker that runs out of memory: check the host's before launching
        from plait.run.launcher.host_memory import check, host_memory

        try:
            return config, warnings + check(host_memory(config, options.nproc_per_node), allow_oom)
        except PlaitError as exc:
            if dry_run and config.runtime.gpu and config.runtime.device == "auto":
                raise PlaitError(f"{exc}. This machine has no GPU, so --device auto checks a CPU run here; "
                                 f"--device cuda --dry-run checks the run on {config.runtime.gpu} GPUs") from None
            raise
    gpu = config.runtime.gpu
    if not gpu:
        warnings.append(f"GPU {local_accelerator()!r} is not a known spec: pass --gpu (plait clusters) "
                        "for MFU and the memory check")
        return config, warnings
    from plait.plan.compiled import with_compile
    from plait.plan.params import DEFAULT_PARAMS
    from plait.plan.plan import evaluate

    # priced as it runs: compiled blocks under --compile (auto: on CUDA where the layout allows it)
    params = with_compile(DEFAULT_PARAMS, None, config.runtime.compile, "cuda")
    plan = evaluate(model, run_cluster(config, options), job.job_spec, layout, params,
                    compile=config.runtime.compile)
    config = dataclasses.replace(config, prediction=Prediction.of_plan(plan, gpu))
    if not plan.fits:
        over = (plan.memory.total - plan.memory.capacity) / GIB
        message = (f"layout {layout} is predicted to need {plan.memory.total / GIB:.1f} GiB per GPU, "
                   f"{over:.1f} GiB more than the {plan.memory.capacity / GIB:.0f} GiB of a {gpu}; "
                   "try ckpt=full, zero=3, a larger tp or pp, or a smaller mbs (plait plan --explain itemizes it)")
        if not allow_oom:
            raise PlaitError(message + "; --allow-oom runs it anyway")
        warnings.append(message)
    return config, warnings


def _checked_elsewhere(config: RunConfig, options: LaunchOptions) -> str:
    """The warning of a ``--dry-run --device cuda`` on a machine without a GPU (PlaitError when the
    run names no GPU: the memory check needs its size)."""
    if not config.runtime.gpu:
        raise PlaitError("--dry-run --device cuda on a machine without a GPU: name the GPU the run will have "
                         "(--gpu, or a --plan made for a cluster) so that its memory can be checked")
    return (f"this machine has no GPU: checked as a run of {options.world_size} process(es) on "
            f"{config.runtime.gpu} GPUs ({options.nproc_per_node} per node), as the nodes that run it will see it")
