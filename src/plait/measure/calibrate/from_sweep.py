"""Fit cases from a ``plait sweep`` CSV (``plait.measure.sweep.csv_file``): measured step time per layout.

A row is usable when its status is ok and it has a measured step time. Its cluster is the one the
sweep predicted for: the GPU preset of the ``gpu`` column with ``nproc_per_node`` GPUs on one node
(or, for a CPU sweep without a GPU spec, a CPU profile given with ``--calibration``), with the
calibration's GPU and link overrides applied. The measured MFU follows from the measured step
time (MFU · step time is the same for any prediction of one job), so the fit compares it with
``estimate_step``'s MFU like a published run. Each model (compiled or not) is one source; a compiled
row is priced compiled (its case's ``software``: ``compiled_blocks``, ``plait.plan.compiled``).
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
from pathlib import Path

from plait.errors import PlaitError
from plait.plan.cost import estimate_step
from plait.plan.params import DEFAULT_PARAMS


def is_sweep_csv(path: str | Path) -> bool:
    """Whether the file's header is a sweep's (it has layout and measured_step_time_s)."""
    try:
        with Path(path).open(newline="", encoding="utf-8") as handle:
            header = next(csv.reader(handle), [])
    except (OSError, UnicodeDecodeError, csv.Error):
        return False
    return "layout" in header and "measured_step_time_s" in header


def recorded_calibration(path: str | Path) -> tuple[str | None, list[str]]:
    """(the calibration file the sweep's predictions used, warning lines) from the CSV's
    ``calibration`` / ``calibration_sha256`` columns; None when it recorded none or the file is gone.

    A file changed since the sweep (other sha256) is still used, with a warning.
    """
    from plait.measure.sweep.csv_file import read_sweep

    recorded = {(getattr(row, "calibration", "") or "", getattr(row, "calibration_sha256", "") or "")
                for row in read_sweep(path)}
    files = sorted({file for file, _ in recorded})
    if files == [""]:
        return None, []
    if len(files) > 1:
        shown = ", ".join(file or "(none: defaults)" for file in files)
        raise PlaitError(f"{path}: the rows' predictions used different calibrations ({shown}); "
                         "give --calibration to choose the hardware numbers the fit starts from")
    file, digest = min(recorded)
    if not Path(file).is_file():
        return None, [(f"the sweep's calibration {file} is missing: fitting from the defaults; "
                      "give --calibration to use another file")]
    actual = hashlib.sha256(Path(file).read_bytes()).hexdigest()
    if digest and not actual.startswith(digest.lower()):
        return file, [(f"the sweep's calibration {file} changed since the sweep (sha256 {digest} then, "
                      f"{actual[:len(digest)]} now): the fit uses it as it is now")]
    return file, []


def sweep_cases(path: str | Path, calibration=None):
    """(FitCase list, count of skipped rows by reason, warning lines) of a sweep CSV.

    A warning names both GPUs when ``calibration`` was measured on another GPU than a row's (or
    is a CPU profile applied to GPU rows).
    """
    from plait.measure.calibrate.cases import FitCase
    from plait.measure.calibrate.families import layout_family
    from plait.measure.sweep.csv_file import read_sweep
    from plait.spec.hardware import cluster_for_gpu, get_cluster
    from plait.spec.layout import JobSpec, Layout
    from plait.spec.models import get_model

    cases, skipped, warnings = [], {}, []

    def skip(reason: str) -> None:
        skipped[reason] = skipped.get(reason, 0) + 1

    for row in read_sweep(path):
        if row.status != "ok" or not row.measured_step_time_s:
            skip(f"status {row.status}" if row.status != "ok" else "no measured step time")
            continue
        n = row.nproc_per_node or 1
        if row.gpu:
            cluster = cluster_for_gpu(row.gpu, n, n)
        elif calibration is not None and calibration.cpu_profile:
            cluster = get_cluster("dgx-h100", n)
        else:
            skip("no GPU spec (give a CPU profile with --calibration for a CPU sweep)")
            continue
        cluster = dataclasses.replace(cluster, gpus_per_node=n)
        if calibration is not None:
            cluster, mismatch = calibration.apply(cluster)
            if row.gpu:  # (a CPU row on a CPU profile is what the profile is for: no warning)
                for warning in (w.replace("the cluster has", "the sweep rows ran on") for w in mismatch):
                    if warning not in warnings:
                        warnings.append(warning)
        try:
            model = get_model(row.model)
            uncovered = calibration.coverage_warning(model, row.seq_len, row.global_batch, row.model) \
                if calibration is not None and row.seq_len else ""
            if uncovered and uncovered not in warnings:  # once per model, not per row
                warnings.append(uncovered)
            specs = (model, cluster, JobSpec(global_batch=row.global_batch, seq_len=row.seq_len), Layout.parse(row.layout))
            step = estimate_step(*specs, DEFAULT_PARAMS)
        except (PlaitError, TypeError, ValueError) as exc:
            skip(f"not predictable ({str(exc)[:60]})")
            continue
        measured_mfu = step.mfu * step.step_time / row.measured_step_time_s
        source = f"{row.model}{' compiled' if row.compile else ''}"
        compiled = (("compiled_blocks", 1.0 if row.compile else 0.0), ("compile_rules", 1.0))  # as it ran
        cases.append(FitCase(f"{row.layout}{' compile' if row.compile else ''}", source, specs, measured_mfu,
                             software=compiled, family=layout_family(specs[3])))
    if not cases:
        reasons = ", ".join(f"{n} {why}" for why, n in sorted(skipped.items()))
        raise PlaitError(f"{path}: no usable rows ({reasons}); a sweep row needs status ok, a measured step "
                         "time and a GPU spec")
    return cases, skipped, warnings
