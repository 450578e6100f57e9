"""The training loop of one rank (the process group must already be initialized).

``run_training`` sets up (model parts, optimizer, the checkpoint to resume, the Checkpointer,
the log), runs ``train`` and writes the summary. ``train`` is the loop: per step,
``plait.run.step.train_step`` (seed, batch, forward and backward, global loss, clipping, the
--on-nan policy, the optimizer step); on sync steps (``plait.run.pending``: logging steps,
checkpoint steps, the last step) the metrics of the steps since the last sync step, then the
Checkpointer's schedule (``Checkpointer.after_step``), which also saves when a SIGTERM asks
the run to stop. With ``--eval-data``, the held-out loss after every ``--eval-every`` steps and
the last one (``plait.run.observe.evaluate``); the JSONL log and the metrics sinks
(``plait.run.observe.sinks``) get one line each.
"""

from __future__ import annotations

import resource
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from plait.errors import PlaitError
from plait.run.checkpoint.select import check_same_run, nothing_to_train
from plait.run.checkpoint.store import read_manifest
from plait.run.config import RunConfig
from plait.run.data.prefetch import prefetching
from plait.run.data.mixture import open_data
from plait.run.env import RankEnv
from plait.run.faults import FaultPlan
from plait.run.device import rank_device
from plait.run.metrics import (
    Display,
    RunSummary,
    StepRecord,
    median_step_time,
    mfu,
    steady_state,
)
from plait.run.memory.counted import TensorMemoryCounter
from plait.run.memory.host_gc import ScheduledGC
from plait.run.observe.evaluate import Evaluator
from plait.run.observe.jsonl import JsonlLog
from plait.run.observe.sinks import MetricsLog, open_sinks
from plait.run.optim import build_optimizer, place_step_counters
from plait.run.parallel.mesh import ParallelDims, build_parallel_dims
from plait.run.parallel.parallelize import ModelParts, build_model_parts
from plait.run.pending import StepLedger
from plait.run.step import StepSetup, train_step
from plait.spec.hardware import get_gpu

if TYPE_CHECKING:  # torch.distributed.checkpoint is imported only by runs that save or resume
    from plait.run.checkpoint.dcp import Checkpointer


def peak_flops(config: RunConfig, device: torch.device) -> float | None:
    """Dense bf16 peak of the named GPU spec (never guessed from the device name)."""
    if device.type != "cuda" or not config.runtime.gpu:
        return None
    return get_gpu(config.runtime.gpu).peak_flops("bf16")


@dataclass
class TrainResult:
    """What a rank returns: every step's record and the summary (the same on every rank)."""

    records: list[StepRecord]
    summary: RunSummary
    parts: ModelParts = field(repr=False)
    pdims: ParallelDims = field(repr=False)
    optimizer: torch.optim.Optimizer | None = field(default=None, repr=False)


def peak_memory_reader(device: torch.device):
    """``() -> bytes``: the peak memory the console shows, torch's peak allocated bytes on a GPU (no
    sync), the process's peak resident memory on CPU."""
    if device.type == "cuda":
        return lambda: torch.cuda.max_memory_allocated(device)
    return lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The tensors of the optimizer's state (Adam's step, m and v; empty before the first step)."""
    return [value for state in optimizer.state.values() for value in state.values() if isinstance(value, torch.Tensor)]


def open_log(config: RunConfig, is_rank0: bool, append: bool, start_step: int = 0,
             sink_ids: dict[str, str] | None = None) -> MetricsLog:
    """Rank 0's JSONL log and metrics sinks (``--tensorboard``, ``--wandb-project``, ``--mlflow-uri``);
    on other ranks a log that writes nothing. ``append`` (a resumed or restarted run, from
    ``start_step`` steps done): the lines and TensorBoard events of later steps, about to be re-run,
    are set aside (JSONL: into a "replayed" line) and purged (TensorBoard), so no step appears twice;
    W&B and MLflow go on in the runs whose ids the checkpoint's manifest holds (``sinks``)."""
    if not is_rank0:
        return MetricsLog(JsonlLog(None))
    jsonl = JsonlLog(config.observe.log, append=append, resume_step=start_step if append else None)
    try:
        return MetricsLog(jsonl, open_sinks(config.observe, config.to_dict(),
                                            purge_step=start_step + 1 if append else None,
                                            resume_ids=sink_ids or {}))
    except BaseException:
        jsonl.close()
        raise


def saved_sink_ids(manifest: dict) -> dict[str, str]:
    """The W&B / MLflow run ids a checkpoint's manifest holds ({} for none)."""
    saved = manifest.get("sinks")
    return {str(k): str(v) for k, v in saved.items()} if isinstance(saved, dict) else {}


@dataclass(frozen=True)
class Resumed:
    """Where ``resume`` left the run: the step to start at, the JSONL events to log, and the W&B /
    MLflow run ids of the checkpoint's manifest (read once, with the step)."""

    step: int = 0
    events: tuple[dict, ...] = ()
    sink_ids: dict[str, str] = field(default_factory=dict)


def offload_directory(config: RunConfig, rank: int) -> str | None:
    """This rank's fresh directory for ``offload=disk:α`` (under ``--offload-dir`` or the temp dir)."""
    layout = config.job.layout
    if layout.offload <= 0 or layout.offload_target != "disk":
        return None
    return tempfile.mkdtemp(prefix=f"plait-offload-rank{rank}-", dir=config.runtime.offload_dir)


def offload_summary(records: list[StepRecord], device: torch.device) -> dict:
    """Steady-state activation offload per step, max over ranks: bytes moved out, seconds of
    transfer hidden behind compute and exposed (``plait.run.memory.offload.OffloadStats``)."""
    steady = [r for r in (steady_state(records) or records) if r.offload]
    keys = ("offload_bytes_out", "offload_hidden_s", "offload_exposed_s")
    medians = [statistics.median(r.offload[k] for r in steady) if steady else 0.0 for k in keys]
    values = torch.tensor(medians, dtype=torch.float64, device=device)
    dist.all_reduce(values, op=dist.ReduceOp.MAX)
    return {"offload_bytes_per_step": int(values[0]), "offload_hidden_s": float(values[1]),
            "offload_exposed_s": float(values[2])}


def build_setup(config: RunConfig, device: torch.device, faults: FaultPlan) -> StepSetup:
    """This rank's parallel dimensions, token source, model parts and optimizer for ``config``."""
    job, runtime = config.job, config.runtime
    pdims = build_parallel_dims(job.layout, device.type)
    n_micro = job.layout.micro_batches(job.global_batch)
    parts = build_model_parts(job.model, pdims, device, job.seed, n_micro, compile_blocks=runtime.compile,
                              compile_backend=runtime.compile_backend, async_tp=runtime.async_tp,
                              offload_dir=offload_directory(config, dist.get_rank()),
                              fused_qkv=runtime.qkv == "fused")
    if dist.get_rank() == 0:
        for note in parts.notes:
            print(f"plait train: {note}", flush=True)
    return StepSetup(config=config, pdims=pdims, parts=parts, optimizer=build_optimizer(parts.named_parameters(), config.optim),
                     source=prefetching(open_data(job.data, job.model.vocab, job.seed, tokenizer=job.data_tokenizer,
                                                  text_key=job.data_text_key), device),
                     device=device,
                     n_micro=n_micro, peak_flops=peak_flops(config, device), faults=faults)


def resume(setup: StepSetup, env: RankEnv) -> Resumed:
    """Load ``config.checkpoint.resume_from`` into the parts and optimizer (``Resumed``)."""
    job, path = setup.config.job, setup.config.checkpoint.resume_from
    if not path:
        return Resumed()
    load_start = time.perf_counter()
    manifest = read_manifest(Path(path))
    start_step = int(manifest["step"])
    check_same_run(RunConfig.from_dict(manifest["run"]), model=job.model, path=path)
    why = nothing_to_train(path, start_step, job.steps)
    if why:
        raise PlaitError(f"{why}; pass a larger --steps")
    from plait.run.checkpoint.dcp import load_checkpoint

    load_checkpoint(path, setup.parts, setup.optimizer)
    place_step_counters(setup.optimizer)
    if hasattr(setup.source, "restore"):  # a mixture: where its streams were (they start reading there)
        setup.source.restore(manifest.get("data"))
    return Resumed(start_step, ({"event": "resume", "step": start_step, "checkpoint": path,
                                 "layout": str(job.layout), "world_size": job.layout.world_size,
                                 "restart": env.restart_count, "load_s": time.perf_counter() - load_start,
                                 "time": time.time()},), saved_sink_ids(manifest))


def make_checkpointer(setup: StepSetup) -> Checkpointer | None:
    """The run's Checkpointer (None without ``config.checkpoint.dir``); async by default on GPU."""
    config, device = setup.config, setup.device
    saving = config.checkpoint
    if not saving.dir:
        return None
    use_async = saving.use_async if saving.use_async is not None else device.type == "cuda"
    from plait.run.checkpoint.dcp import Checkpointer

    return Checkpointer(saving.dir, saving.every, saving.keep, run=config.to_dict(),
                        layout=str(config.job.layout), use_async=use_async, device=device, parts=setup.parts,
                        optimizer=setup.optimizer, faults=setup.faults, data_state=data_state(setup))


def data_state(setup: StepSetup):
    """``steps_done -> dict`` of a mixture's state for the checkpoint manifest (per-source tokens, stream
    bookmarks: ``MixtureSource.state``); None for synthetic data or a lone token file."""
    source, job = setup.source, setup.config.job
    if not hasattr(source, "state"):
        return None
    return lambda steps_done: source.state(steps_done, job.global_batch, job.seq_len)


def data_tokens(setup: StepSetup, steps_done: int) -> dict[str, int] | None:
    """Input tokens each mixture source gave to the first ``steps_done`` steps (None: not a mixture)."""
    consumed, job = getattr(setup.source, "tokens_consumed", None), setup.config.job
    return consumed(steps_done, job.global_batch, job.seq_len) if consumed is not None else None


def run_training(config: RunConfig, device: torch.device | None = None, stop=None, env: RankEnv | None = None,
                 faults: FaultPlan | None = None) -> TrainResult:
    """Train from ``config.checkpoint.resume_from`` (or step 0) to ``config.job.steps``; every rank
    returns the same records.

    ``stop`` (the worker's SIGTERM request, polled once per step) ends the run after the current
    step (after the next one when the current one is not a sync step: ``train``), with a checkpoint when ``config.checkpoint.dir`` is set. ``env`` and ``faults`` are the
    worker's; a direct caller (tests, benchmarks) may leave them out, and they are then read from
    this process's environment. ``device`` defaults to ``rank_device``'s choice for ``config.runtime.device``.
    """
    env = env or RankEnv.from_environ()
    faults = faults if faults is not None else FaultPlan.from_environ(env)
    device = device or rank_device(config.runtime.device, env.local_rank)
    setup = build_setup(config, device, faults)
    parts = setup.parts
    resumed = resume(setup, env)
    start_step, events = resumed.step, list(resumed.events)
    if start_step == 0 and config.job.init_from:  # a resumed run starts from its checkpoint instead
        from plait.run.checkpoint.hf.load import init_from_hf

        events.append(init_from_hf(config.job, parts, device))
    checkpointer = make_checkpointer(setup)
    counter = TensorMemoryCounter(device.type == "cpu", start_step, config.job.steps)  # counted tensor bytes
    is_rank0 = dist.get_rank() == 0
    log = open_log(config, is_rank0, append=start_step > 0 or env.restart_count > 0, start_step=start_step,
                   sink_ids=resumed.sink_ids)
    if checkpointer is not None:
        checkpointer.sink_ids = log.sink_ids()
    stop = StopOrLogFailure(stop, log)
    for event in events:
        log.write(event)
    evaluator = Evaluator(setup) if config.eval.data else None
    display = Display(config.job.steps, is_rank0, config.observe.log_every_on(device.type), start_step,
                      memory=peak_memory_reader(device))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    finished = False  # the W&B / MLflow runs of a run that ends on an error are marked failed
    try:
        counter.start([*parts.parameters(), *(b for chunk in parts.chunks for b in chunk.buffers()),
                       *optimizer_state_tensors(setup.optimizer)])
        parts.train()
        with ScheduledGC(config.runtime.gc_every) as collector:  # automatic GC off, a collection every N steps
            records, stopped_at = train(setup, start_step, checkpointer, log, display, stop, collector, evaluator,
                                        counter)
        counter.close()
        display.close()
        summary = _summarize(config, records, setup.pdims, device, setup.peak_flops, counter.peak_bytes)
        # a collective: every rank takes part, also pipeline ranks that hold no offloaded layer
        summary.offload = offload_summary(records, device) if config.job.layout.offload > 0 else None
        summary.start_step = start_step
        summary.stopped_early = stopped_at is not None
        summary.eval_loss = evaluator.last if evaluator is not None else None
        summary.data_tokens = data_tokens(setup, start_step + len(records))
        if checkpointer is not None:
            summary.checkpoints = checkpointer.saved
            summary.checkpoint_stall_s = max(checkpointer.stall_s, default=None)
        log.write(summary.to_dict())
        display.message(summary.comparison_line())
        if summary.data_tokens:
            total = max(1, sum(summary.data_tokens.values()))
            display.message("tokens per data source: " + ", ".join(
                f"{name} {n:,} ({100 * n / total:.1f}%)" for name, n in summary.data_tokens.items()))
        finished = True
    finally:
        counter.close()
        display.close()
        log.close(failed=not finished)
        setup.source.close()
        if parts.offloader is not None:
            parts.offloader.close()
    if log.failure is not None:  # rank 0; the run stopped at the next step and saved first
        at = config.job.steps if stopped_at is None else stopped_at
        saved = f"; checkpoint step_{at:08d} saved in {config.checkpoint.dir} (rerun the same command to resume " \
                "once the log can be written)" if checkpointer is not None else " (no --checkpoint-dir: nothing saved)"
        raise PlaitError(f"{log.failure}; training stopped after step {at}{saved}")
    return TrainResult(records=records, summary=summary, parts=parts, pdims=setup.pdims, optimizer=setup.optimizer)


class StopOrLogFailure:
    """The stop request the loop polls: the worker's (SIGTERM, SIGINT, SIGHUP), or a failed metrics log
    write on rank 0 (``MetricsLog.failure``); it rides in the loss all-reduce, so every rank stops."""

    def __init__(self, stop, log: MetricsLog):
        self.stop, self.log = stop, log

    def is_set(self) -> bool:
        requested = self.stop is not None and self.stop.is_set()  # polled every step: the worker's heartbeat
        return requested or self.log.failure is not None

    @property
    def name(self) -> str | None:
        """What asked to stop: the signal's name, else the failed log write."""
        return getattr(self.stop, "name", None) or ("a failed metrics log write" if self.log.failure else None)


def train(setup: StepSetup, start_step: int, checkpointer: Checkpointer | None, log: MetricsLog, display: Display,
          stop=None, collector: ScheduledGC | None = None,
          evaluator: Evaluator | None = None,
          counter: TensorMemoryCounter | None = None) -> tuple[list[StepRecord], int | None]:
    """Steps ``start_step`` .. ``config.job.steps - 1``; (their records, the step count at which a
    stop request ended the run, or None when it ran to the end).

    Only sync steps (``StepLedger.syncs_at``: logging steps, the step before a checkpoint save,
    the last step) read the loss, gradient norm and stop flag on the host and run the
    Checkpointer's schedule; other steps queue their numbers and read the previous step's stop
    flag from a host buffer (``plait.run.pending``), so a stop request seen in a non-sync step
    ends the run one step later, on every rank alike. ``evaluator``: the held-out loss after the
    steps ``EvalConfig.due_after`` names (sync steps; not when stopping: SIGTERM's grace is short).
    ``counter``: counts tensor bytes in its window step (``plait.run.memory.counted``).
    """
    steps = setup.config.job.steps
    ledger = StepLedger(setup, log, display)
    for step in range(start_step, steps):
        steps_done = step + 1
        save_due = checkpointer is not None and checkpointer.every > 0 and steps_done % checkpointer.every == 0
        eval_due = evaluator is not None and setup.config.eval.due_after(steps_done, steps)
        sync = ledger.syncs_at(step, save_due or eval_due)
        if counter is not None:
            counter.before_step(step)
        pending = train_step(setup, step, ledger, stop, sync)
        if counter is not None:
            pending.profiled = counter.profiling
            counter.after_step(step)
        ledger.add(pending)
        if collector is not None:
            collector.after_step(steps_done)
        stopping = pending.stop_requested if sync else ledger.flags.requested(step - 1)
        if not (sync or stopping):
            continue
        ledger.materialize(step)  # --on-nan checks every step read here: before any checkpoint save
        if eval_due and not stopping:
            line = evaluator.record(steps_done)
            log.write(line)
            display.message(f"eval after step {steps_done}: loss {line['eval_loss']:.4f} "
                            f"({line['eval_tokens']:,} tokens, {line['eval_s']:.1f} s)")
        if checkpointer is not None:
            event = checkpointer.after_step(steps_done, last_step=steps_done == steps, stop=stopping)
            if event:
                log.write(event)
        if stopping:
            display.message(f"stopped by {getattr(stop, 'name', None) or 'a stop request'} after step {steps_done}" + (
                f"; checkpoint {setup.config.checkpoint.dir}/step_{steps_done:08d} saved" if checkpointer
                else " (no --checkpoint-dir: nothing saved)"))
            return ledger.records, steps_done
    return ledger.records, None


def _summarize(config: RunConfig, records: list[StepRecord], pdims: ParallelDims, device: torch.device,
               peak: float | None, tensor_bytes: int | None = None) -> RunSummary:
    job = config.job
    step_time = median_step_time(records)
    tokens_per_s = job.tokens_per_step / step_time
    rss = torch.tensor(float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024), device=device)
    dist.all_reduce(rss, op=dist.ReduceOp.MAX)
    peak_memory = None
    if device.type == "cuda":
        gpu_peak = torch.tensor(float(torch.cuda.max_memory_allocated(device)), device=device)
        dist.all_reduce(gpu_peak, op=dist.ReduceOp.MAX)
        peak_memory = int(gpu_peak)
    counted = torch.tensor(float(-1 if tensor_bytes is None else tensor_bytes), dtype=torch.float64, device=device)
    dist.all_reduce(counted, op=dist.ReduceOp.MAX)  # -1: no rank counted (GPU run, or ended before the window)
    prediction = config.prediction if device.type == "cuda" else None
    return RunSummary(
        steps=len(records), final_loss=records[-1].loss, step_time_s=step_time, tokens_per_s=tokens_per_s,
        mfu=mfu(job.model, job.seq_len, tokens_per_s, job.layout.world_size, peak),
        peak_memory_bytes=peak_memory, peak_host_rss_bytes=int(rss), device=device.type,
        peak_tensor_bytes=int(counted) if counted >= 0 else None,
        world_size=job.layout.world_size, layout=str(job.layout),
        predicted_step_time_s=prediction.step_time_s if prediction else None,
        predicted_memory_bytes=prediction.allocated_bytes if prediction else None,
    )
