"""Run one swept layout through ``plait train`` in a subprocess and turn how it ended into a row.

The subprocess is ``python -m plait.cli train ... --log FILE.jsonl --run-dir DIR`` in its own
session. A layout that runs past the sweep's per-layout timeout gets SIGTERM (plait train asks
its workers to stop and gives them 30 s), then, after ``SweepSpec.kill_grace_s``, SIGKILL; torch's
elastic launcher starts the workers in sessions of their own, so the workers
(``plait.run.worker DIR``, found by their command line) are killed as well.

How a run ended comes from ``DIR/outcome.json``, which plait train writes (format
``plait-outcome/1``, ``plait.run.launcher.outcome``), never from its stderr: ok with a summary line
in the log -> ok; oom, failed, refused -> the same status and the outcome's reason; stopped (by a
signal the sweep did not send) -> failed; past the timeout -> timeout; no outcome file (plait
train died before writing it) -> failed, with its exit status.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import plait
from plait.errors import PlaitError
from plait.measure.sweep.cases import SweepCase, SweepSpec
from plait.measure.sweep.csv_file import SweepRow
from plait.measure.sweep.timing import LayoutTiming, RunTiming, run_timing
from plait.run.launcher.outcome import FILE_NAME as OUTCOME_FILE
from plait.run.launcher.outcome import Outcome, outcome_path, read_outcome
from plait.run.observe.jsonl import last_summary, read_log

WORKER_MODULE = "plait.run.worker"
REASON_CHARS = 300  # a CSV reason is one line of at most this many characters


def train_argv(spec: SweepSpec, case: SweepCase, log_path: Path, run_dir: Path | None = None) -> list[str]:
    """The ``plait train`` command line of one layout."""
    argv = [sys.executable, "-m", "plait.cli", "train", "--model", spec.model_arg, "--layout", str(case.layout),
            "--global-batch", str(spec.global_batch), "--seq-len", str(spec.seq_len),
            "--nproc-per-node", str(spec.nproc_per_node), "--steps", str(spec.steps), "--seed", str(spec.seed),
            "--data", spec.data, "--device", spec.device, "--log", str(log_path)]
    if run_dir is not None:
        argv += ["--run-dir", str(run_dir)]
    if spec.prediction_gpu:
        argv += ["--gpu", spec.prediction_gpu]
    argv.append("--compile" if case.compile else "--no-compile")  # the eager twin stays eager on GPU
    if spec.allow_oom:
        argv.append("--allow-oom")
    return argv


def child_env(extra: tuple[tuple[str, str], ...] = (), threads: int | None = None) -> dict[str, str]:
    """This process's environment, with the running plait first on PYTHONPATH (the child runs the
    same code), ``OMP_NUM_THREADS`` = ``threads`` when given, and the case's extra variables."""
    env = dict(os.environ)
    source_root = str(Path(plait.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([source_root, *filter(None, [env.get("PYTHONPATH")])])
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    env.update(dict(extra))
    return env


def classify(outcome: Outcome | None, returncode: int, stderr_tail: str = "") -> tuple[str, str]:
    """(CSV status, one-line reason) of a finished ``plait train`` that did not end ok with a summary.

    ``outcome`` is what it wrote in its run directory (None: nothing); ``stderr_tail`` (the last
    line of its stderr) only goes into the reason of a run that wrote no outcome.
    """
    if outcome is None:
        reason = f"exit status {returncode}, no {OUTCOME_FILE} written"
        return "failed", (reason + (f": {stderr_tail}" if stderr_tail else ""))[:REASON_CHARS]
    reason = outcome.reason or f"exit status {returncode}, no message"
    if outcome.status in ("oom", "failed", "refused"):
        return outcome.status, reason[:REASON_CHARS]
    if outcome.status == "ok":
        return "failed", f"exit status {returncode} after the workers finished"[:REASON_CHARS]
    return "failed", reason[:REASON_CHARS]  # stopped by a signal the sweep did not send


def last_line(path: Path) -> str:
    """The last non-empty line of a text file ("" when there is none)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def finished_status(run_dir: Path, returncode: int, err_path: Path) -> tuple[str, str]:
    """(CSV status, reason) of a run that ended by itself, from ``run_dir/outcome.json``.

    "ok" means the launcher says the workers finished; the row also needs the log's summary line.
    """
    try:
        outcome = read_outcome(run_dir)
    except PlaitError as exc:
        return "failed", f"exit status {returncode}: {exc}"[:REASON_CHARS]
    if outcome is not None and outcome.status == "ok" and returncode == 0:
        return "ok", ""
    return classify(outcome, returncode, last_line(err_path) if outcome is None else "")


def read_summary(log_path: Path) -> dict | None:
    """The summary line of a ``plait train --log`` file, or None."""
    if not log_path.is_file():
        return None
    return last_summary(read_log(log_path))


def predicted_fields(spec: SweepSpec, case: SweepCase) -> dict:
    """The planner's step time, allocator peak and MFU for this layout, when they are recorded."""
    if case.plan is None or not spec.records_predictions:
        return {}
    memory, step = case.plan.memory, case.plan.step
    allocated = memory.allocated
    return {"predicted_step_time_s": step.step_time, "predicted_memory_bytes": allocated,
            "predicted_mfu": step.mfu, "gpu": spec.prediction_gpu or ""}


def model_reference(spec: SweepSpec) -> str:
    """What the CSV's model column holds: the preset name, or the model file's absolute path (so
    that plait report and plait calibrate fit can rebuild the model)."""
    from plait.spec.models import MODELS

    if spec.model_arg in MODELS or not Path(spec.model_arg).exists():
        return spec.model.name
    return str(Path(spec.model_arg).resolve())


def base_row(spec: SweepSpec, case: SweepCase) -> SweepRow:
    return SweepRow(layout=case.label, status="invalid", reason=case.invalid_reason, compile=case.compile,
                    planner_rank=case.planner_rank, predicted_fits=case.predicted_fits,
                    calibration=spec.calibration, calibration_sha256=spec.calibration_sha256,
                    model=model_reference(spec), global_batch=spec.global_batch,
                    seq_len=spec.seq_len, nproc_per_node=spec.nproc_per_node, steps=spec.steps,
                    device=spec.device, warmup_steps=spec.warmup, threads_per_process=spec.threads_per_process,
                    **predicted_fields(spec, case))


def run_case(spec: SweepSpec, case: SweepCase, workdir: Path) -> SweepRow:
    """Run one layout once (or record why it is invalid) and return its row, errors filled."""
    return run_once(spec, case, workdir)[0]


def run_once(spec: SweepSpec, case: SweepCase, workdir: Path) -> tuple[SweepRow, RunTiming | None]:
    """Run one layout once: (its row, the timing of its post-warm-up steps; None unless ok).

    The row's measured step time is the median of the steps after ``spec.warmup`` warm-up steps,
    read from the run's JSONL log (tokens/s and MFU follow from it); a run that left no step after
    the warm-up is failed.
    """
    row = base_row(spec, case)
    if case.invalid_reason:
        return row, None
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    log_path, run_dir = workdir / "train.jsonl", workdir / "run"
    out_path, err_path = workdir / "stdout.txt", workdir / "stderr.txt"
    outcome_path(run_dir).unlink(missing_ok=True)  # a reused --keep-runs directory: not the last sweep's
    start = time.perf_counter()
    with out_path.open("w") as out, err_path.open("w") as err:
        proc = start_train(spec, case, log_path, run_dir, out, err)
        try:
            returncode = proc.wait(timeout=spec.timeout_s)
        except subprocess.TimeoutExpired:
            stop_train(proc, run_dir, spec.kill_grace_s)
            return replace(row, status="timeout", reason=f"still running after {spec.timeout_s:g} s (--timeout)",
                           elapsed_s=time.perf_counter() - start), None
        except BaseException:
            stop_train(proc, run_dir, spec.kill_grace_s)
            raise
        kill_workers(run_dir)  # torchrun stops its workers; make sure none outlives the run
    elapsed = time.perf_counter() - start
    status, reason = finished_status(run_dir, returncode, err_path)
    summary = read_summary(log_path) if status == "ok" else None
    if status == "ok" and summary is None:
        status, reason = "failed", "no summary line in the log"
    timing = run_timing(log_path, spec.warmup) if status == "ok" else None
    if status == "ok" and timing is None:
        status, reason = "failed", f"no step logged after the {spec.warmup} warm-up step(s)"
    if status != "ok":
        return replace(row, status=status, reason=reason, elapsed_s=elapsed), None
    on_gpu = summary.get("device") == "cuda"
    measured_memory, kind = measured_memory_of(summary)
    row = replace(row, status="ok", reason="", elapsed_s=elapsed, device=summary.get("device", spec.device),
                  measured_mfu=summary.get("mfu") if on_gpu else None,
                  measured_memory_bytes=float(measured_memory) if measured_memory is not None else None,
                  memory_kind=kind)
    return with_timing(row, LayoutTiming.of([timing]), summary.get("step_time_s")), timing


def measured_memory_of(summary: dict) -> tuple[float | None, str]:
    """(bytes, memory_kind) a train summary measured: the GPU allocator's peak; on CPU the counted
    tensor bytes (``peak_tensor_bytes``), or the peak RSS of a run that counted none."""
    if summary.get("device") == "cuda":
        return summary.get("peak_memory_bytes"), "cuda_allocated"
    if summary.get("peak_tensor_bytes") is not None:
        return summary["peak_tensor_bytes"], "host_tensors"
    return summary.get("peak_host_rss_bytes"), "host_rss"


def with_timing(row: SweepRow, timing: LayoutTiming, mfu_step_time_s: float | None) -> SweepRow:
    """``row`` with the measured step time and spread of ``timing``, tokens/s from it (global batch ×
    sequence length per step) and the measured MFU rescaled from the one measured at
    ``mfu_step_time_s`` seconds per step; errors filled."""
    tokens = (row.global_batch or 0) * (row.seq_len or 0)
    mfu = row.measured_mfu * mfu_step_time_s / timing.step_time if row.measured_mfu and mfu_step_time_s else None
    return replace(row, measured_step_time_s=timing.step_time, tokens_per_s=tokens / timing.step_time if tokens else None,
                   measured_mfu=mfu, measured_steps=timing.measured_steps, repeats=timing.repeats,
                   step_time_min_s=timing.step_min, step_time_max_s=timing.step_max, step_time_iqr_s=timing.step_iqr,
                   repeat_min_s=timing.repeat_min, repeat_max_s=timing.repeat_max,
                   spread_s=timing.spread).with_errors()


def start_train(spec: SweepSpec, case: SweepCase, log_path: Path, run_dir: Path, out, err) -> subprocess.Popen:
    """Start ``plait train`` for one layout in a session of its own (stdout/stderr to files)."""
    return subprocess.Popen(train_argv(spec, case, log_path, run_dir), stdout=out, stderr=err,
                            stdin=subprocess.DEVNULL, env=child_env(case.env, spec.threads_per_process),
                            start_new_session=True)


def worker_pids(run_dir: Path) -> list[int]:
    """Processes whose command line is ``... plait.run.worker RUN_DIR`` (Linux /proc; [] elsewhere)."""
    wanted = str(run_dir)
    pids = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        words = [a.decode(errors="replace") for a in args if a]
        for index, word in enumerate(words[:-1]):
            if word == WORKER_MODULE and words[index + 1] == wanted:
                pids.append(int(entry.name))
                break
    return pids


def kill_workers(run_dir: Path, wait_s: float = 5.0) -> list[int]:
    """SIGKILL every remaining worker of ``run_dir`` and wait until they are gone; returns their pids."""
    pids = [pid for pid in worker_pids(run_dir) if pid != os.getpid()]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
    deadline = time.monotonic() + wait_s
    while pids and time.monotonic() < deadline and worker_pids(run_dir):
        time.sleep(0.05)
    return pids


def stop_train(proc: subprocess.Popen, run_dir: Path, grace_s: float) -> None:
    """Stop a ``plait train`` run and every process it started.

    SIGTERM to its process group (plait train and torchrun's agent, which forwards it to the
    workers and gives them 30 s to finish the step); after ``grace_s`` seconds SIGKILL to the
    group; then SIGKILL to any worker still running (they live in sessions of their own).
    """
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    kill_workers(run_dir)
