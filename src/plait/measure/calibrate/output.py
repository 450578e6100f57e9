"""What ``plait calibrate fit`` writes and prints: the calibration JSON and two rich tables.

The JSON is a calibration file (``plait.plan.calibration``: format tag, reader, writer) that
``plait plan/validate --calibration`` reads (``gpu``, ``params``) plus the fit's record: which parameters were fitted, within which bounds, the
in-sample and held-out errors (fractions; leave-one-source-out, or by layout when the runs have
one source: ``holdout`` names the scheme), the rows used and skipped, and when.
"""

from __future__ import annotations

import math
import platform
from datetime import datetime, timezone

from plait import __version__
from plait.measure.calibrate.families import FAMILY_HOLDOUT
from plait.measure.calibrate.fit import SOURCE_HOLDOUT, FitResult
from plait.plan.calibration import FORMAT


def _number(value: float) -> float | None:
    return None if value is None or math.isnan(value) else value


def fit_to_dict(result: FitResult, runs_path: str, gpu: str | None = None, calibration=None) -> dict:
    """The calibration file's content for a fit (JSON-ready; NaN written as null).

    With a starting ``calibration`` (a profile), its GPU and link overrides are carried over, so the
    written file replaces it: measured hardware plus fitted overheads.
    """
    return {
        "format": FORMAT,
        "kind": "fit",
        "gpu": gpu,
        "device": calibration.device if calibration is not None else "",
        "params": result.params.to_dict(),
        "gpu_overrides": dict(calibration.gpu_overrides) if calibration is not None else {},
        "cluster_overrides": dict(calibration.cluster_overrides) if calibration is not None else {},
        "fit": {
            "runs": str(runs_path),
            "runs_kind": result.kind,
            "start": calibration.path if calibration is not None else "defaults",
            "fitted": result.fitted(),
            "metric": result.metric,
            "objective": f"{result.objective} of |predicted / measured {result.metric.replace('_', ' ')} - 1|",
            "holdout": result.holdout,
            "errors": {
                "default": _number(result.default_error),
                "in_sample": _number(result.in_sample_error),
                "held_out": _number(result.leave_out_error),
            },
            "per_source": [
                {"source": s.source, "rows": s.rows, "default": _number(s.default), "in_sample": _number(s.in_sample),
                 "held_out": _number(s.leave_out), "leave_out_params": s.leave_out_params}
                for s in result.per_source
            ],
            "folds": [{**fold, "error": _number(fold["error"])} for fold in result.folds],
            "family_holdout": FAMILY_HOLDOUT if result.families else "none",
            "families": [f.to_dict(_number) for f in result.families],
            "warnings": list(result.warnings),
            "rows_used": result.rows_used,
            "rows_skipped": result.rows_skipped,
            "evaluations": result.evaluations,
        },
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "versions": {"plait": __version__, "python": platform.python_version()},
    }


def _percent(value: float) -> str:
    return "-" if value is None or math.isnan(value) else f"{100 * value:.1f}%"


def fit_tables(result: FitResult):
    """(parameter table, error table) as rich Tables."""
    from rich.table import Table

    params = Table(title="Fitted cost parameters", title_justify="left")
    for column in ("parameter", "start", "fitted", "bounds"):
        params.add_column(column, justify="left" if column == "parameter" else "right")
    for name, item in result.fitted().items():
        params.add_row(name, f"{item['default']:.4g}", f"{item['value']:.4g}", f"{item['low']:.3g} .. {item['high']:.3g}")

    what = f"{result.objective} |predicted / measured {result.metric.replace('_', ' ')} - 1|"
    how = {SOURCE_HOLDOUT: "refit without the source, predict it", "none": "not computed"}.get(
        result.holdout, "refit without each group of layouts, predict it (one source only)")
    errors = Table(title=f"Error by source ({what}); {result.holdout} = {how}", title_justify="left")
    for column in ("source", "rows", "start", "in-sample", result.holdout):
        errors.add_column(column, justify="left" if column == "source" else "right")
    for s in result.per_source:
        errors.add_row(s.source[:60], str(s.rows), _percent(s.default), _percent(s.in_sample), _percent(s.leave_out))
    errors.add_row("[b]all[/b]", str(result.rows_used), _percent(result.default_error),
                   _percent(result.in_sample_error), _percent(result.leave_out_error))
    return params, errors


def family_table(result: FitResult):
    """Leave-one-family-out as a rich Table (None when it was not computed: fewer than two families)."""
    from rich.table import Table

    if not result.families:
        return None
    what = f"{result.objective} |predicted / measured {result.metric.replace('_', ' ')} - 1|"
    unit = "source" if result.kind == "published" else "layout family"
    table = Table(title=f"Error by {unit} ({what}); held out = refit without the family, predict it",
                  title_justify="left")
    for column in ("family", "rows", "start", "in-sample", "held out"):
        table.add_column(column, justify="left" if column == "family" else "right")
    for f in result.families:
        table.add_row(f.family[:60], str(f.rows), _percent(f.start), _percent(f.in_sample), _percent(f.held_out))
    return table
