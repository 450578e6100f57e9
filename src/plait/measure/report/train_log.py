"""A ``plait train --log`` JSONL file as a loss curve (and eval loss, and learning rate). No torch.

The log (read by ``plait.run.observe.jsonl.read_log``, which describes its records) holds step
records (``step``, ``loss``, ``lr``, ...), records with an ``eval_loss``, events (``event``: resume,
checkpoint) and a closing ``summary``. A resumed run
appends to the same file and may repeat steps after the checkpoint it went back to: the last
value logged for a step is the one kept, and the resumes are marked. Steps are drawn as logged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from plait.errors import PlaitError
from plait.run.observe.jsonl import is_summary, read_log, step_of


@dataclass
class TrainCurves:
    """Per-step series of one log, sorted by step."""

    loss: list[tuple[int, float]] = field(default_factory=list)
    eval_loss: list[tuple[int, float]] = field(default_factory=list)
    lr: list[tuple[int, float]] = field(default_factory=list)
    resumes: list[int] = field(default_factory=list)  # steps a resumed run started from
    summary: dict | None = None


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def read_train_log(path: str | Path) -> TrainCurves:
    """The curves of a train JSONL; one-line PlaitError when the file is missing or has no step."""
    path = Path(path)
    try:
        records = read_log(path)
    except FileNotFoundError:
        raise PlaitError(f"--train-log {path}: file not found (write it with plait train --log {path})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PlaitError(f"--train-log {path}: cannot read it as text ({exc})") from None
    series: dict[str, dict[int, float]] = {"loss": {}, "eval_loss": {}, "lr": {}}
    curves = TrainCurves()
    for record in records:
        if is_summary(record):
            curves.summary = record
            continue
        step = step_of(record)
        if step is None:
            continue
        if record.get("event") == "resume":
            curves.resumes.append(step)
            continue
        for key, values in series.items():
            value = _number(record.get(key))
            if value is not None:
                values[step] = value
    if not series["loss"] and not series["eval_loss"]:
        raise PlaitError(f"--train-log {path}: no step with a loss in it; give the JSONL file of plait train --log")
    curves.loss, curves.eval_loss, curves.lr = (sorted(series[k].items()) for k in ("loss", "eval_loss", "lr"))
    return curves


def loss_plot(curves: TrainCurves, path: Path, title: str) -> Path:
    """Loss (and eval loss) per step above the learning rate per step; resumes as dotted lines."""
    from plait.measure.report.plan_plots import require_matplotlib, save_figure

    plt = require_matplotlib("plait report --train-log")
    rows = 2 if curves.lr else 1
    fig, axes = plt.subplots(rows, 1, sharex=True, squeeze=False, figsize=(8.0, 5.2 if rows == 2 else 4.0),
                             gridspec_kw={"height_ratios": [3, 1][:rows]})
    loss_ax = axes[0][0]
    if curves.loss:
        steps, values = zip(*curves.loss)
        loss_ax.plot(steps, values, color="#4C72B0", linewidth=1, marker="." if len(steps) <= 60 else None,
                     label="train loss")
    if curves.eval_loss:
        steps, values = zip(*curves.eval_loss)
        loss_ax.plot(steps, values, color="#DD8452", linewidth=1.5, marker="o", markersize=4, label="eval loss")
    for ax in (a[0] for a in axes):
        for step in curves.resumes:
            ax.axvline(step, color="gray", linestyle=":", linewidth=1)
        ax.grid(alpha=0.3)
    loss_ax.set_ylabel("loss (nats per token)")
    loss_ax.set_title(title + (" (dotted: resumed from a checkpoint)" if curves.resumes else ""), fontsize=9)
    loss_ax.legend(fontsize=8)
    if curves.lr:
        steps, values = zip(*curves.lr)
        axes[1][0].plot(steps, values, color="#55A868", linewidth=1)
        axes[1][0].set_ylabel("learning rate", fontsize=8)
        axes[1][0].ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
    axes[-1][0].set_xlabel("step (as logged)")
    fig.tight_layout()
    return save_figure(fig, path)


def loss_summary(curves: TrainCurves) -> str:
    """One sentence of what the curve shows: steps, first and last loss, last eval loss."""
    parts = []
    if curves.loss:
        (first_step, first), (last_step, last) = curves.loss[0], curves.loss[-1]
        parts.append(f"{len(curves.loss)} steps logged ({first_step} to {last_step}); train loss {first:.4f} "
                     f"at step {first_step}, {last:.4f} at step {last_step}")
    if curves.eval_loss:
        step, value = curves.eval_loss[-1]
        parts.append(f"{len(curves.eval_loss)} evals, the last {value:.4f} at step {step}")
    if curves.resumes:
        parts.append("resumed at step " + ", ".join(str(s) for s in curves.resumes))
    return "; ".join(parts) + "."
