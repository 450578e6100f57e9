"""Each ``plait train`` setting is declared once (``setting`` on a field of its section): the flag, its
job-file key, the request, the section built from it and the docs row all follow (plait.run.settings)."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import pytest

from plait.cli import build_parser
from plait.cli import train as train_command
from plait.cli.jobfile.flags import flags_of, primary
from plait.cli.jobfile.read import settings as job_file_settings
from plait.cli.jobfile.write import job_file
from plait.cli.support.setting_flags import add_setting_flags
from plait.errors import PlaitError
from plait.run.config import CheckpointConfig, OptimConfig, RuntimeConfig, TrainJob
from plait.run.launcher.request import TRAIN_SECTIONS, TrainRequest, train_flags_markdown
from plait.run.settings import GROUPS, Setting, flags_markdown, section_of, setting, settings_of

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "training.md"
NOT_SETTINGS = ("help", "config", "print_config")  # the job file's own flags


def train_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False)
    train_command.add_arguments(parser)
    return parser


def test_the_docs_flag_table_is_generated_from_the_declarations():
    text = DOC.read_text()
    start = text.index("-->\n", text.index("<!-- train-flags:")) + len("-->\n")
    assert text[start:text.index("<!-- /train-flags -->")] == train_flags_markdown(), (
        "docs/training.md's flag table is stale: paste plait.run.launcher.request.train_flags_markdown() "
        "between its markers")


def test_every_setting_has_a_flag_a_job_file_key_and_a_docs_row():
    parser = train_parser()
    actions = {option: action for action in parser._actions for option in action.option_strings}
    keys = flags_of(parser)
    table = train_flags_markdown()
    declared = settings_of(*TRAIN_SECTIONS)
    assert len(declared) == len({d.dest for d in declared}) > 50  # one dest per setting
    for d in declared:
        flag = d.spec.flag
        action = actions[flag]
        assert action.dest == d.dest and action.default == d.flag_default, flag
        assert all(actions[alias] is action for alias in d.spec.aliases), flag
        assert "{" not in action.help and action.help == d.help_text(), flag  # the defaults are filled in
        key = keys[flag[2:]]
        assert key.action is action and key.table == d.spec.group, flag  # [group] key in a job file
        assert f"| `{flag}`" in table and f"`[{d.spec.group}] {flag[2:]}`" in table, flag
    # nothing but the declarations (and the job file's own flags) makes a flag
    assert {a.dest for a in parser._actions} - {d.dest for d in declared} == {"config", "print_config"}


def test_the_parser_is_one_loop_not_a_list_of_flags():
    source = (ROOT / "src" / "plait" / "cli" / "train.py").read_text()
    assert source.count("add_argument") <= 5
    assert not re.search(r'"--[a-z]', source)  # no flag name written in cli/train.py


def test_the_request_is_generated_from_the_declarations():
    fields = {f.name: f.default for f in dataclasses.fields(TrainRequest)}
    assert fields == {d.dest: d.flag_default for d in settings_of(*TRAIN_SECTIONS)}
    args = build_parser().parse_args(["train"])
    assert {name: getattr(args, name) for name in fields} == fields  # the parser's defaults are the request's


def test_help_defaults_are_the_fields_defaults():
    helps = {a.option_strings[0]: a.help for a in train_parser()._actions if a.option_strings}
    assert f"(default {TrainJob.steps};" in helps["--steps"]
    assert "(default 3e-4)" in helps["--lr"] and OptimConfig.lr == 3e-4
    assert f"(default {OptimConfig.min_lr_ratio:g} × --lr)" in helps["--min-lr"]
    assert f"(default {RuntimeConfig.timeout_s:g})" in helps["--timeout"]
    assert f"(default {CheckpointConfig.keep}; 0: all)" in helps["--keep-checkpoints"]


def test_sections_are_built_from_the_flags():
    args = build_parser().parse_args(["train", "--fused-qkv", "--gc-every", "7", "--timeout", "30",
                                      "--async-checkpoint", "off", "--lr", "1e-3"])
    runtime = section_of(args, RuntimeConfig)
    assert (runtime.qkv, runtime.gc_every, runtime.timeout_s, runtime.compile) == ("fused", 7, 30.0, None)
    assert section_of(args, CheckpointConfig).use_async is False
    optim = section_of(args, OptimConfig)  # flags not given ("unset"): the section's defaults
    assert (optim.lr, optim.weight_decay, optim.schedule) == (1e-3, OptimConfig.weight_decay, OptimConfig.schedule)
    defaults = section_of(build_parser().parse_args(["train"]), RuntimeConfig)
    assert defaults == RuntimeConfig() and section_of(build_parser().parse_args(["train"]),
                                                       CheckpointConfig).use_async is None


def test_a_bad_declaration_is_refused_when_declared():
    with pytest.raises(ValueError, match="group"):
        Setting("--x", "help", "nowhere")

    @dataclasses.dataclass(frozen=True)
    class Odd:
        value: list = setting((), "--value", "a list", "where")

    with pytest.raises(ValueError, match="kind="):
        settings_of(Odd)


def test_adding_a_setting_is_one_field():
    """What adding a setting takes: one ``setting`` field; the flag, job-file key, section and docs row follow."""

    @dataclasses.dataclass(frozen=True)
    class Extra:
        """A section of two new settings."""

        warmup_ratio: float = setting(0.05, "--warmup-ratio", "warm-up as a fraction of steps (default {default})",
                                      "optimizer", unset=True)
        pin_memory: bool = setting(False, "--pin-memory", "pin host batches", "where")

    parser = argparse.ArgumentParser(add_help=False)
    add_setting_flags(parser, Extra)
    args = parser.parse_args(["--warmup-ratio", "0.1", "--pin-memory"])
    assert section_of(args, Extra) == Extra(0.1, True)
    assert section_of(parser.parse_args([]), Extra) == Extra()  # not given: the field's default
    flags = flags_of(parser)
    assert [(f.key, f.table) for f in primary(flags)] == [("warmup-ratio", "optimizer"), ("pin-memory", "where")]
    assert job_file_settings({"optimizer": {"warmup-ratio": 0.2}, "pin_memory": True}, flags, "", "x") == {
        "warmup_ratio": 0.2, "pin_memory": True}
    with pytest.raises(PlaitError, match="expected a number"):
        job_file_settings({"warmup-ratio": "a lot"}, flags, "", "x")
    assert "[optimizer]\nwarmup-ratio = 0.1" in job_file(parser, vars(args))
    table = flags_markdown(Extra)
    assert "| `--warmup-ratio` `WARMUP_RATIO` | `[optimizer] warmup-ratio` |  | warm-up as a fraction of steps " \
           "(default 0.05) |" in table and "`[where] pin-memory`" in table
    assert set(GROUPS) >= {"optimizer", "where"}


def test_a_resumed_run_keeps_the_settings_that_define_the_run():
    from plait.run.config import RunConfig
    from plait.run.launcher.resolve import _same_run_flags
    from plait.spec.layout import Layout
    from plait.spec.models import get_model

    saved = RunConfig(job=TrainJob(model=get_model("tiny"), layout=Layout(), global_batch=4, seq_len=16, seed=3))
    flags = _same_run_flags(TrainRequest(seed=5, lr=1e-3), saved, implicit=False)
    assert set(flags) == {d.spec.flag for d in settings_of(TrainJob, OptimConfig) if d.spec.same_run} == {
        "--seed", "--data", "--data-tokenizer", "--data-text-key", "--doc-mask", "--lr", "--warmup-steps", "--weight-decay", "--grad-clip", "--lr-schedule", "--min-lr",
        "--decay-fraction"}
    assert flags["--seed"] == (5, 3) and flags["--lr"] == (1e-3, OptimConfig.lr) and flags["--data"] == (None, "synthetic")
