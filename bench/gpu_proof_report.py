"""The GPU proof's tables (bench/gpu_proof.py): the sweep's predictions from the fresh profile and from
the shipped defaults, and the summary of every step (``$OUT/summary.md``, ``summary.json``)."""

from __future__ import annotations

import dataclasses
import datetime
import json
import statistics
from pathlib import Path

GIB = 2**30
TIMEOUT_CODES = {124: "TIMEOUT", 137: "KILLED (timeout)"}  # coreutils timeout: TERM -> 124, KILL -> 137


# ----------------------------------------------------------------------------- sweep
def _median_abs(values) -> float | None:
    values = [abs(v) for v in values if v is not None]
    return statistics.median(values) if values else None


def _err(measured, predicted) -> float | None:
    return measured / predicted - 1 if measured is not None and predicted else None


def _f(value, scale: float = 1.0, digits: str = ".3f") -> str:
    return format(value / scale, digits) if value is not None else "-"


def _p(value) -> str:
    return f"{100 * value:+.1f}%" if value is not None else "-"


def default_predictions(row, gpu: str) -> tuple[float | None, float | None]:
    """(step time s, allocated bytes) that the shipped default cost parameters predict for a sweep row
    on one ``gpu`` (the cluster ``plait sweep`` predicts for)."""
    from plait.errors import PlaitError
    from plait.plan.plan import evaluate
    from plait.spec.hardware import cluster_for_gpu
    from plait.spec.layout import JobSpec, Layout
    from plait.spec.models import get_model

    try:
        cluster = dataclasses.replace(cluster_for_gpu(gpu, 1, 1).with_gpus(1), gpus_per_node=1)
        plan = evaluate(get_model(row.model), cluster, JobSpec(global_batch=row.global_batch, seq_len=row.seq_len),
                        Layout.parse(row.layout))
    except PlaitError:
        return None, None
    return plan.step.step_time, plan.memory.allocated


def sweep_numbers(csv_path: Path, gpu: str, dry_run: bool, fresh: bool) -> tuple[dict, str]:
    """(numbers, markdown table) of a sweep CSV: measured against the predictions it recorded (the
    fresh profile's when ``fresh``, else the defaults') and against the shipped defaults'."""
    from plait.measure.sweep.csv_file import read_sweep

    rows = read_sweep(csv_path)
    lines = ["| layout | status | measured step s | fresh profile s | error | defaults s | error | "
             "measured GiB | fresh GiB | error | defaults GiB | error |", "|" + "---|" * 12]
    errors = {"step_fresh": [], "step_defaults": [], "memory_fresh": [], "memory_defaults": []}
    for row in rows:
        if row.status != "ok":
            lines.append(f"| {row.layout} | {row.status}: {row.reason.splitlines()[0] if row.reason else ''} |"
                         + " |" * 10)
            continue
        step_d, memory_d = default_predictions(row, gpu)
        step_f = row.predicted_step_time_s if fresh else None
        memory_f = row.predicted_memory_bytes if fresh else None
        gpu_memory = row.memory_kind == "cuda_allocated" or dry_run
        measured_memory = row.measured_memory_bytes if gpu_memory else None
        pairs = {"step_fresh": _err(row.measured_step_time_s, step_f),
                 "step_defaults": _err(row.measured_step_time_s, step_d),
                 "memory_fresh": _err(measured_memory, memory_f), "memory_defaults": _err(measured_memory, memory_d)}
        for key, value in pairs.items():
            errors[key].append(value)
        lines.append(f"| {row.layout} | ok | {_f(row.measured_step_time_s)} | {_f(step_f)} | {_p(pairs['step_fresh'])} "
                     f"| {_f(step_d)} | {_p(pairs['step_defaults'])} | {_f(measured_memory, GIB, '.2f')} | "
                     f"{_f(memory_f, GIB, '.2f')} | {_p(pairs['memory_fresh'])} | {_f(memory_d, GIB, '.2f')} | "
                     f"{_p(pairs['memory_defaults'])} |")
    numbers = {"layouts": len(rows), "ok": sum(r.status == "ok" for r in rows), "gpu": gpu,
               **{f"median_{key.split('_')[0]}_error_{key.split('_')[1]}": _median_abs(values)
                  for key, values in errors.items()},
               "rows": [{"layout": r.layout, "status": r.status, "reason": r.reason,
                         "measured_step_time_s": r.measured_step_time_s} for r in rows]}
    note = ("Dry run: measured on the CPU; the defaults' column predicts an H100, so its errors mean nothing."
            if dry_run else "Errors are measured / predicted - 1; memory is torch's peak allocated bytes.")
    return numbers, "\n".join([f"Sweep `{csv_path.name}`: predicted against measured. {note}", "", *lines])


# ----------------------------------------------------------------------------- summary
def _step_outcome(out: Path, name: str) -> tuple[dict | None, int | None, float | None]:
    """(the step's JSON, its exit code, its wall seconds) as far as they were written."""
    data = rc = seconds = None
    path = out / "steps" / f"{name}.json"
    if path.is_file():
        try:
            data = json.loads(path.read_text())
        except ValueError:
            data = None
    rc_path = out / "steps" / f"{name}.rc"
    if rc_path.is_file():
        fields = rc_path.read_text().split()
        rc = int(fields[0]) if fields else None
        seconds = float(fields[1]) if len(fields) > 1 else None
    return data, rc, seconds


def _log_error(out: Path, name: str) -> str:
    """The last line of a step's log that names an error (else its last line)."""
    path = out / "logs" / f"{name}.log"
    if not path.is_file():
        return ""
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    named = [line for line in lines if "Error" in line or "error:" in line]
    return (named or lines or [""])[-1][:300]


def _result(data: dict | None, rc: int | None, out: Path, name: str) -> tuple[str, str]:
    """(result word, what to say) of one step."""
    if rc in TIMEOUT_CODES:
        done = [c["name"] for c in (data or {}).get("checks", [])]
        return TIMEOUT_CODES[rc], "parts done before the limit: " + (", ".join(done) or "none")
    if data is None:
        if rc is None:
            return "not run", ""
        return "FAILED", f"exit {rc}: {_log_error(out, name)}"
    status = data.get("status")
    if status == "failed" or (rc not in (None, 0) and status != "skipped"):
        failed = [f"{c['name']}: {c['detail']}" for c in data["checks"] if c["status"] == "failed"]
        return "FAILED", data.get("error") or "; ".join(failed) or f"exit {rc}: {_log_error(out, name)}"
    if status == "running":
        return "FAILED", f"exit {rc}: {_log_error(out, name)}"
    return status, ""


def _targets(results: dict, dry_run: bool) -> list[tuple[str, str, str]]:
    from gpu_proof import TARGET_MEMORY, TARGET_MFU, TARGET_SPEEDUP, TARGET_SWEEP

    def numbers(step: str, check: str) -> dict:
        data = results.get(step) or {}
        return next((c["numbers"] for c in data.get("checks", []) if c["name"] == check), {})

    fast, sweep = numbers("fast", "fast: plait vs HF loop"), numbers("sweep", "calibrated: plait sweep")
    ratio = fast.get("memory_ratio")
    rows = [(f"plait MFU >= {TARGET_MFU:.0%} (1.1B, seq 4096)", fast.get("mfu"), lambda v: v >= TARGET_MFU,
             lambda v: f"{100 * v:.1f}%"),
            (f"plait tokens/s >= {TARGET_SPEEDUP}x the HF loop", fast.get("speedup"), lambda v: v >= TARGET_SPEEDUP,
             lambda v: f"{v:.2f}x"),
            (f"peak memory within {TARGET_MEMORY:.0%} of the prediction", ratio,
             lambda v: abs(v - 1) <= TARGET_MEMORY, lambda v: f"{100 * (v - 1):+.1f}%"),
            (f"sweep median |step error| <= {TARGET_SWEEP:.0%} (fresh profile)",
             sweep.get("median_step_error_fresh"), lambda v: v <= TARGET_SWEEP, lambda v: f"{100 * v:.1f}%")]
    out = []
    for name, value, met, shown in rows:
        if dry_run:
            out.append((name, shown(value) if value is not None else "-", "n/a (dry run)"))
        elif value is None:
            out.append((name, "-", "n/a (not measured)"))
        else:
            out.append((name, shown(value), "met" if met(value) else "NOT met"))
    return out


def _table(header: tuple, rows: list) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in row) + " |" for row in rows)]


def write_summary(out: Path, steps, dry_run: bool) -> int:
    """Write ``summary.md`` and ``summary.json`` under ``out`` and print the markdown; 1 when a step
    failed or timed out."""
    results, step_rows, check_rows, bad = {}, [], [], False
    for step in steps:
        if step.name == "summary":
            continue
        data, rc, seconds = _step_outcome(out, step.name)
        results[step.name] = data
        word, why = _result(data, rc, out, step.name)
        bad |= word not in ("ok", "skipped", "not run")
        took = f"{seconds:.0f}" if seconds is not None else "-"
        step_rows.append((step.name, step.limit_s, took, word, why or step.what))
        for check in (data or {}).get("checks", []):
            check_rows.append((check["name"], check["status"], check["detail"]))
    env = ((results.get("setup") or {}).get("numbers")) or {}
    budget = sum(step.limit_s for step in steps)
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    machine = (f"{env.get('device', 'CPU')} ({env.get('gpu', 'no GPU spec')}), nvidia-smi: {env.get('nvidia_smi', '-')}"
               f"; torch {env.get('torch', '-')}, CUDA {env.get('cuda', '-')}, transformers "
               f"{env.get('transformers', '-')}, torchao {env.get('torchao', '-')}; {env.get('cpus', '-')} CPUs")
    lines = [f"# GPU proof{' (DRY RUN: CPU, tiny models; nothing here measures a GPU)' if dry_run else ''}", "",
             f"`bash bench/gpu_proof.sh{' --dry-run' if dry_run else ''}`, summary written {when}.", "",
             f"Machine: {machine}.", "",
             f"Step limits add up to {budget} s ({budget / 60:.1f} min) including set-up"
             + (" (dry run: each limit x3 of the GPU run's)." if dry_run else "."), "",
             *_table(("step", "limit s", "took s", "result", "what / first error"), step_rows), "",
             *_table(("check", "result", "numbers"), check_rows), "",
             "Issue 35's targets for the first GPU run (reported, not asserted):", "",
             *_table(("target", "measured", "result"), _targets(results, dry_run)), ""]
    sweep_table = out / "sweep_predictions.md"
    if sweep_table.is_file():
        lines += [sweep_table.read_text().rstrip(), ""]
    text = "\n".join(lines)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.md").write_text(text)
    (out / "summary.json").write_text(json.dumps({"dry_run": dry_run, "date": when, "budget_s": budget,
                                                  "steps": results, "failed": bad}, indent=1, default=str) + "\n")
    print(text)
    return 1 if bad else 0
