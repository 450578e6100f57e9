"""TrainRequest: what ``plait train`` was asked, generated from the settings' declarations (no torch).

Every ``plait train`` setting is a field of its section, declared once with ``setting``
(``plait.run.settings``): ``TargetSettings`` (what to train), the RunConfig sections ``TrainJob``,
``OptimConfig``, ``EvalConfig``, ``LogConfig``, ``CheckpointConfig``, ``RuntimeConfig``, torchrun's
``LaunchOptions`` and ``TrainControl`` (how ``plait train`` itself proceeds). ``TRAIN_SECTIONS``
lists them; the parser, the job-file keys, the flag table of docs/training.md and ``TrainRequest``
(one field per flag, its default the flag's) follow. ``None`` means "not given": a fresh run then
takes the section's default, a resumed run the checkpoint's saved value.
``plait.run.launcher.resolve`` turns a request into the run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from plait.run.config import CheckpointConfig, EvalConfig, LogConfig, OptimConfig, RuntimeConfig, TrainJob
from plait.run.launcher.launch import LaunchOptions
from plait.run.launcher.target import TargetSettings
from plait.run.settings import flags_markdown, setting, settings_of


@dataclass(frozen=True)
class TrainControl:
    """How ``plait train`` itself proceeds: processes in all, resume or not, checks, the run directory."""

    gpus: int | None = setting(None, "--gpus", "processes in all (alternative to --nproc-per-node)", "where")
    allow_oom: bool = setting(False, "--allow-oom", "run even if the planner predicts out-of-memory", "where")
    run_dir: str | None = setting(None, "--run-dir", "keep the run's config and error files here (default: a "
                                  "temporary dir)", "where")
    dry_run: bool = setting(False, "--dry-run", "check everything, print the torchrun command, do not run", "where")
    resume: str | None = setting(
        None, "--resume", "resume from a checkpoint directory, or the newest valid one in a --checkpoint-dir; with "
        "another --layout or process count (re-planned when the world size changed). New checkpoints go to "
        "--checkpoint-dir, else beside the resumed one; a DIR without checkpoints starts the run there",
        "checkpoints", metavar="DIR")
    fresh: bool = setting(False, "--fresh", "start from step 0 and refuse a --checkpoint-dir that already holds "
                          "checkpoints", "checkpoints")
    allow_data_change: bool = setting(
        False, "--allow-data-change", "resume although the token file at the saved data path is not the one the "
        "checkpoint was trained on (its CRC-32, token count or size differ)", "checkpoints")


# every section holding plait train settings; within a help group, flags follow this order
TRAIN_SECTIONS = (TargetSettings, TrainJob, OptimConfig, EvalConfig, LogConfig, CheckpointConfig, TrainControl,
                  LaunchOptions, RuntimeConfig)

TrainRequest = dataclasses.make_dataclass(
    "TrainRequest", [(d.dest, Any, dataclasses.field(default=d.flag_default)) for d in settings_of(*TRAIN_SECTIONS)],
    frozen=True)
TrainRequest.__module__ = __name__
TrainRequest.__doc__ = ("One ``plait train`` invocation: a field per setting (its flag's dest), its default the "
                        "flag's. Sizes in sequences and tokens; times in seconds.")


def train_flags_markdown() -> str:
    """The flag table of docs/training.md, generated from the declarations."""
    return flags_markdown(*TRAIN_SECTIONS)
