"""From a ``TrainRequest`` to a checked run: the RunConfig (fresh, from a plan, or resumed), the
torchrun placement, the notes to print; then ``start`` launches it (no torch at import).

What to train is read once (``TrainTarget``: the plan file, the layout text); each section is built
from the request's flags by its declarations (``plait.run.settings.section_of``), with only the
values that need a rule (the plan's GPU, a resumed run's saved ones) given here.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path

from plait.errors import PlaitError
from plait.run.checkpoint import store
from plait.run.checkpoint.hf.tokenizer import hf_token_ids
from plait.run.checkpoint.select import data_of
from plait.run.config import (
    EVAL_SEED,
    CheckpointConfig,
    EvalConfig,
    LogConfig,
    OptimConfig,
    RunConfig,
    RuntimeConfig,
    TrainJob,
)
from plait.run.launcher.checkpoint_dir import take_checkpoint_dir
from plait.run.launcher.launch import LaunchOptions, job_rdzv_id, launch, print_dry_run, record_refusal
from plait.run.launcher.micro_batch import complete_run_mbs, keep_saved_mbs
from plait.run.launcher.preflight import preflight
from plait.run.launcher.request import TrainRequest
from plait.run.launcher.target import TrainTarget
from plait.run.observe.sinks import check_sinks
from plait.run.settings import section_of, setting_values, settings_of


@dataclass(frozen=True)
class Resumed:
    """The checkpoint a resumed run starts from, and the newer ones refused (set aside before launching)."""

    checkpoint: store.Checkpoint
    refused: tuple[Path, ...]


@dataclass(frozen=True)
class Resolved:
    """A run as the request describes it, before the preflight check."""

    config: RunConfig
    options: LaunchOptions
    notes: tuple[str, ...] = ()  # printed as "plait train: NOTE"
    resumed: Resumed | None = None
    finished: int | None = None  # a requeue of a run whose last step is saved: that step (nothing to launch)


def parse_nnodes(text: str) -> tuple[int, int]:
    """(min, max) nodes from ``--nnodes N`` or the elastic ``--nnodes MIN:MAX``."""
    try:
        low, _, high = str(text).partition(":")
        low_n, high_n = int(low), int(high or low)
    except ValueError:
        raise PlaitError(f"--nnodes {text}: expected N or MIN:MAX") from None
    if low_n < 1 or high_n < low_n:
        raise PlaitError(f"--nnodes {text}: need 1 <= MIN <= MAX")
    return low_n, high_n


def launch_options(request: TrainRequest, default_world: int | None = None) -> LaunchOptions:
    """torchrun placement; without nproc_per_node/gpus, the layout's world size over nnodes."""
    min_nodes, nnodes = parse_nnodes(request.nnodes)
    if min_nodes != nnodes and not request.rdzv_endpoint:
        raise PlaitError(f"--nnodes {request.nnodes} (elastic) needs --rdzv-endpoint host:port")
    nproc, gpus = request.nproc_per_node, request.gpus
    if gpus is not None:
        if gpus < 1 or gpus % nnodes:
            raise PlaitError(f"--gpus {gpus} is not a positive multiple of --nnodes {nnodes}")
        if nproc is not None and nproc * nnodes != gpus:
            raise PlaitError(f"--gpus {gpus} disagrees with --nproc-per-node {nproc} × --nnodes {nnodes}")
        nproc = gpus // nnodes
    if nproc is None:
        nproc = max(1, (default_world or 1) // nnodes)
    if nproc < 1:
        raise PlaitError(f"--nproc-per-node {nproc}: need at least one process")
    restarts = request.max_restarts or 0
    if restarts < 0:
        raise PlaitError(f"--max-restarts {restarts}: must be >= 0")
    return section_of(request, LaunchOptions, nproc_per_node=nproc, nnodes=nnodes, min_nnodes=min_nodes,
                      rdzv_id=request.rdzv_id or job_rdzv_id(dataclasses.asdict(request)), max_restarts=restarts)


def run_config(request: TrainRequest, options: LaunchOptions, target: TrainTarget | None = None) -> RunConfig:
    """The RunConfig of a fresh run (from the plan, if any; the request's sizes override the plan's job)."""
    from plait.spec.models import get_model

    target = target or TrainTarget.read(request)
    init_from = None
    if request.init_from:  # the weights' shapes are checked by the workers, against the model they build
        from plait.run.checkpoint.hf.files import check_model_dir
        from plait.run.checkpoint.hf.numerics import check_init_from

        init_from = str(check_model_dir(request.init_from))
        check_init_from(init_from, target.model)  # its family's table, and its config computes --model
    model = target.model
    if target.plan is None:
        if not (model or init_from):
            raise PlaitError("plait train needs --plan FILE, or --model with --global-batch and --seq-len")
        model = model or get_model(init_from)
        if target.global_batch is None or target.seq_len is None:
            raise PlaitError("plait train --model needs --global-batch and --seq-len")
    job = setting_values(request, TrainJob)  # steps, seed, data and init_from, then checked below
    warmup = request.warmup_steps if request.warmup_steps is not None else max(1, job["steps"] // 10)
    optim = section_of(request, OptimConfig, warmup_steps=warmup)
    check_decay_fraction(request, optim)
    data, data_id = data_of(job["data"], model, job["seed"], target.seq_len, job["data_tokenizer"],
                            job["data_text_key"])  # fail early
    config = RunConfig(
        job=TrainJob(model=model, layout=target.layout_for(model, options.world_size),
                     global_batch=target.global_batch, seq_len=target.seq_len,
                     **{**job, "data": data, "init_from": init_from}, data_id=data_id,
                     **documents_of(data, job["doc_mask"], job["data_tokenizer"], job["data_text_key"]),
                     token_ids=hf_token_ids(init_from) if init_from else hf_token_ids(request.model)),
        optim=optim, runtime=section_of(request, RuntimeConfig, gpu=request.gpu or target.gpu),
        observe=section_of(request, LogConfig))
    return dataclasses.replace(config, eval=eval_config(request, config.job))


def documents_of(data: str, doc_mask: bool, tokenizer: str = "bytes", text_key: str = "text") -> dict:
    """--doc-mask's ``eos_id`` and ``doc_len`` (mean document length, tokens) of the token file
    ``data``, read from its header and its first tokens; {} without --doc-mask or a token file
    (``TrainJob`` then refuses synthetic data in one line)."""
    if not doc_mask or data == "synthetic":
        return {}
    from plait.run.data.mixture_spec import is_mixture
    from plait.run.data.tokens import TokenFile

    if is_mixture(data):  # the sources share one tokenizer and end-of-text id (MixtureSource checks it)
        from plait.run.data.mixture import MixtureSource

        tokens = MixtureSource(data, tokenizer=tokenizer, text_key=text_key)
        try:
            return {"eos_id": tokens.eos_id, "doc_len": tokens.mean_document_length()}
        finally:
            tokens.close()
    tokens = TokenFile(data)
    return {"eos_id": tokens.eos_id, "doc_len": tokens.mean_document_length()}


def check_decay_fraction(request: TrainRequest, optim: OptimConfig) -> None:
    """``--decay-fraction`` shapes the wsd schedule only: refuse it with another schedule."""
    if request.decay_fraction is not None and optim.schedule != "wsd":
        raise PlaitError(f"--decay-fraction applies to --lr-schedule wsd only (this run's schedule is "
                         f"{optim.schedule}); drop it or pass --lr-schedule wsd")


def eval_config(request: TrainRequest, job: TrainJob) -> EvalConfig:
    """The request's held-out loss settings; the eval token file is checked against the model now."""
    config = section_of(request, EvalConfig)
    if config.data is not None:
        from plait.run.data.tokens import open_tokens

        open_tokens(config.data, job.model.vocab, EVAL_SEED, seq_len=job.seq_len, model_name=job.model.name)
    return config


def checkpoint_options(config: RunConfig, request: TrainRequest, saved: RunConfig | None = None,
                       where: Path | None = None) -> RunConfig:
    """``config`` with the request's checkpoint settings applied (a resumed run inherits the saved ones).

    A resumed run writes into ``--checkpoint-dir`` when given, else into ``where`` (the directory
    that holds the resumed checkpoint), never into the one its manifest records."""
    base = (saved or config).checkpoint
    keep = request.keep_checkpoints if request.keep_checkpoints is not None else base.keep
    every = request.checkpoint_every if request.checkpoint_every is not None else base.every
    directory = request.checkpoint_dir or where
    use_async = setting_values(request, CheckpointConfig)["use_async"]  # --async-checkpoint auto|on|off
    if directory:
        directory = str(Path(directory).resolve())
    if every and not directory:
        raise PlaitError("--checkpoint-every needs --checkpoint-dir")
    return dataclasses.replace(config, checkpoint=dataclasses.replace(
        config.checkpoint, dir=directory, every=every or 0, keep=keep, use_async=use_async))


def _same_run_flags(request: TrainRequest, saved: RunConfig, implicit: bool) -> dict[str, tuple]:
    """(given value, saved value) of each flag a resumed run must keep (its setting says ``same_run``);
    ``--data`` only for an implicit resume (an explicit ``--resume`` may read the same tokens from another path)."""
    sections = {section: getattr(saved, name) for name, section in (("job", TrainJob), ("optim", OptimConfig))}
    out = {d.spec.flag: (getattr(request, d.dest), getattr(sections[d.section], d.name))
           for d in settings_of(*sections) if d.spec.same_run}
    data = request.data if implicit and request.data != "synthetic" else None
    if data is not None and saved.job.data != "synthetic" and _same_data(data, saved.job.data):
        data = saved.job.data
    out["--data"] = (data, saved.job.data)
    return out


def _same_data(given: str, saved: str) -> bool:
    """Whether ``--data given`` names the saved run's data (the same file, or the same mixture spec)."""
    from plait.run.data.mixture_spec import canonical

    try:
        return Path(given).resolve() == Path(saved).resolve() or canonical(given) == saved
    except PlaitError:
        return False


def resume_config(request: TrainRequest, implicit: bool = False, target: TrainTarget | None = None) -> Resolved:
    """The resumed run: the saved run's trajectory, this request's layout and processes, and notes.

    ``implicit``: resuming the newest checkpoint of ``--checkpoint-dir`` without ``--resume`` (a
    requeue); the request's flags that define the run must then equal the saved values. ``target``:
    the request's ``TrainTarget`` (read here, after the checkpoint, when not given)."""
    from plait.run.checkpoint.select import check_given, check_same_data, check_same_run, nothing_to_train, saved_run
    from plait.run.replan import replan

    # sizes only here: the workers check every CRC-32 in parallel (and fall back) before loading
    checkpoint, refused = store.resolve(request.resume or request.checkpoint_dir, checksums=False,
                                        check=lambda where, manifest: saved_run(manifest, where))
    notes = [f"refused {why}" for _, why in refused]
    saved = RunConfig.from_dict(checkpoint.run)
    path = str(checkpoint.path)
    if not store.has_checksum(checkpoint.manifest):
        notes.append(f"{checkpoint.path.name}'s manifest has no checksum (written by an earlier plait): "
                     "its contents are trusted as they are")
    target = target or TrainTarget.read(request)
    if target.plan_job is not None:
        check_same_run(saved, target.model, target.plan_job.global_batch, target.plan_job.seq_len, path)
    check_same_run(saved, target.model if request.model else None, request.global_batch, request.seq_len, path)
    check_given(saved, _same_run_flags(request, saved, implicit), path)
    layout = target.layout_for(saved.job.model, 1) if target.layout is not None else None
    if layout is not None and not target.mbs_given:
        layout = keep_saved_mbs(layout, saved.job.layout, saved.job.global_batch)
    was = saved.job
    options = launch_options(request, layout.world_size if layout else was.layout.world_size)
    job = dataclasses.replace(was, steps=request.steps or was.steps,
                              data=request.data if request.data != "synthetic" else was.data)
    config = dataclasses.replace(
        saved, job=job, checkpoint=dataclasses.replace(saved.checkpoint, resume_from=path),
        runtime=section_of(request, RuntimeConfig, offload_dir=request.offload_dir or saved.runtime.offload_dir),
        observe=section_of(request, LogConfig), eval=eval_config(request, job), prediction=None)
    check_decay_fraction(request, config.optim)
    if job.data != was.data:
        notes.append(f"reading data {job.data} instead of the saved run's {was.data}: the same samples only "
                     "if it holds the same tokens")
    if job.steps != was.steps:
        notes.append(f"--steps {job.steps} (the saved run planned {was.steps}): the cosine schedule is "
                     "stretched, so the learning rate changes from the resumed step on")
    finished = checkpoint.step == job.steps  # the same command after the run ended (a requeue): nothing to do
    if not finished:  # the saved run's data must still be there, the same tokens
        data, data_id = data_of(job.data, job.model, job.seed, job.seq_len, job.data_tokenizer, job.data_text_key)
        notes += [note] if (note := check_same_data(was.data_id, data, data_id, request.allow_data_change,
                                                    path)) else []
        job = dataclasses.replace(job, data=data, data_id=data_id)
        config = dataclasses.replace(config, job=job)
    if layout is not None:
        config = dataclasses.replace(config, job=dataclasses.replace(job, layout=layout))
    elif options.world_size != was.layout.world_size:
        config, why = replan(config, options.world_size, options.nproc_per_node)
        notes.append(why)
    config = checkpoint_options(config, request, saved, where=checkpoint.path.parent)
    why = nothing_to_train(checkpoint.path, checkpoint.step, config.job.steps)
    if why and not finished:
        raise PlaitError(f"{why}; pass a larger --steps")
    if finished:
        return Resolved(config, options, tuple(notes), finished=checkpoint.step)
    notes.append(f"resuming from {path} (step {checkpoint.step} of {config.job.steps}, saved under "
                 f"{checkpoint.manifest.get('layout')} on {checkpoint.manifest.get('world_size')} processes)")
    if config.checkpoint.dir:
        notes.append(f"checkpoints go to {config.checkpoint.dir}")
    return Resolved(config, options, tuple(notes), Resumed(checkpoint, tuple(p for p, _ in refused)))


def fresh_config(request: TrainRequest, target: TrainTarget | None = None) -> Resolved:
    """A run from the start; refuses a checkpoint directory that already holds checkpoints (unless elastic:
    the workers resume from them). ``target``: the request's ``TrainTarget`` (read here when not given)."""
    target = target or TrainTarget.read(request)
    options = launch_options(request, target.world_size)
    config = checkpoint_options(run_config(request, options, target), request)
    notes = ()
    if not target.mbs_given:  # pick the micro-batch, and say which
        config, note = complete_run_mbs(config, options.nproc_per_node)
        notes = (note,)
    directory = config.checkpoint.dir
    if directory:
        existing = store.complete_dirs(Path(directory))
        if existing and options.min_nnodes not in (None, options.nnodes):
            print(f"plait train: elastic run: the workers resume from the newest valid checkpoint in "
                  f"{directory} ({existing[-1].name})", flush=True)
        elif existing:
            raise PlaitError(f"--fresh: --checkpoint-dir {directory} already holds checkpoints (newest "
                             f"{existing[-1].name}): drop --fresh to resume from them, or use an empty directory")
    return Resolved(config, options, notes)


def resolve(request: TrainRequest) -> Resolved:
    """The run the request describes: one command line serves the first run and every requeue.

    ``--resume DIR`` resumes (or, when DIR holds no checkpoint yet and the request says what to
    train, starts fresh writing there); ``--fresh`` starts from step 0 and refuses a checkpoint
    directory that holds checkpoints; otherwise a ``--checkpoint-dir`` that holds checkpoints is
    resumed from (the same run's flags must match the saved values) and an empty one starts fresh.
    """
    if request.fresh and request.resume:
        raise PlaitError("give either --fresh or --resume, not both")
    if request.resume:
        if _holds_no_checkpoint(Path(request.resume)) and (request.plan or request.model or request.init_from):
            fresh = dataclasses.replace(request, resume=None, checkpoint_dir=request.checkpoint_dir or request.resume)
            resolved = fresh_config(fresh)
            return dataclasses.replace(resolved, notes=(
                f"{request.resume} holds no checkpoint yet: starting from step 0, checkpoints go to "
                f"{resolved.config.checkpoint.dir}", *resolved.notes))
        return resume_config(request)
    if request.fresh or not request.checkpoint_dir or not store.complete_dirs(Path(request.checkpoint_dir)):
        return fresh_config(request)
    min_nodes, max_nodes = parse_nnodes(request.nnodes)
    if min_nodes != max_nodes:
        return fresh_config(request)  # elastic: the workers resume from the newest valid checkpoint
    return resume_config(request, implicit=True)


def _holds_no_checkpoint(path: Path) -> bool:
    """Whether ``path`` is missing, or a directory with neither a manifest nor step_NNNNNNNN checkpoints."""
    return not path.exists() or (path.is_dir() and not (path / store.MANIFEST).exists()
                                 and not store.complete_dirs(path))


def start(request: TrainRequest, job_file: str | None = None) -> int:
    """``plait train``: resolve, check (preflight), print the notes, then launch (or print the
    torchrun command for a dry run). Returns the exit status; a failed rank raises PlaitError.

    ``job_file``: the request as a TOML job file (``plait.cli.jobfile``), recorded in the run's
    config and so in its checkpoints' manifests. A run refused before launch leaves
    ``RUN_DIR/outcome.json`` (status refused) when ``request.run_dir`` is given; a launched run's
    outcome is written by ``launch``.
    """
    try:
        return _start(request, job_file)
    except PlaitError as exc:
        record_refusal(request.run_dir, exc)
        raise


def _start(request: TrainRequest, job_file: str | None = None) -> int:
    resolved = resolve(request)
    if resolved.finished is not None:
        print(f"plait train: already finished at step {resolved.finished} ({resolved.config.checkpoint.resume_from}); "
              "nothing to train (pass a larger --steps to train on)", flush=True)
        return 0
    config, options = dataclasses.replace(resolved.config, job_file=job_file), resolved.options
    check_sinks(config.observe)  # before the launch: a missing package is named with its pip command
    config, warnings = preflight(config, options, allow_oom=request.allow_oom, dry_run=request.dry_run)
    for warning in warnings:
        print(f"plait: warning: {warning}", file=sys.stderr)
    for note in resolved.notes:
        print(f"plait train: {note}", flush=True)
    if request.dry_run:
        print_dry_run(config, options)
        return 0
    directory = config.checkpoint.dir
    held = None
    if directory:
        held = take_checkpoint_dir(Path(directory), resolved.resumed, options)
    try:
        job = config.job
        print(f"plait train: {job.model.name}, layout {job.layout}, global batch {job.global_batch} × "
              f"{job.seq_len}, {job.steps} steps, {options.world_size} processes", flush=True)
        from plait.run.launcher.host_memory import of_cpu_run

        launch(config, options, run_dir=request.run_dir,  # raises PlaitError when any rank failed
               host_memory=of_cpu_run(config, options.nproc_per_node))
    finally:
        if held is not None:
            held.release()
    return 0
