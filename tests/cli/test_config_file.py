"""Job files: ``plait train --config run.toml`` and ``plait plan --config run.toml`` (plait.cli.jobfile).

The keys are derived from the parsers (every flag settable, nothing listed twice); flags on the
command line override the file; bad files are one line naming the key (and the closest valid
one); ``--print-config`` writes a file that reads back as the same request; and one short
1-process CPU run from a job file reproduces the run of the equivalent flags, loss for loss, with
the job file recorded in its checkpoint's manifest.
"""

from __future__ import annotations

import argparse
import json
import math
import tomllib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plait.cli import build_parser, main
from plait.cli import plan as plan_command
from plait.cli import train as train_command
from plait.cli.jobfile.flags import flags_of, table_name
from plait.cli.jobfile.read import parse_args
from plait.cli.jobfile.toml_text import dumps, toml_value
from plait.run.launcher.request import TrainRequest

TRAIN_FLAGS = ["--model", "tiny", "--layout", "dp=1,mbs=2", "--global-batch", "4", "--seq-len", "32", "--steps", "3",
               "--seed", "7", "--lr", "2e-3", "--warmup-steps", "1", "--device", "cpu", "--nproc-per-node", "1",
               "--no-compile", "--fused-qkv", "--on-nan", "skip", "--timeout", "90.5"]


def parser_of(module) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False)
    module.add_arguments(parser)
    return parser


def request_of(argv: list[str]) -> TrainRequest:
    args = parse_args(build_parser(), ["train", *argv])
    return TrainRequest(**{name: getattr(args, name) for name in TrainRequest.__dataclass_fields__})


def write(tmp_path, text: str, name: str = "run.toml") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


# ----------------------------------------------------------------- the keys come from the parser
@pytest.mark.parametrize("module", [train_command, plan_command])
def test_every_flag_is_a_key_of_its_help_group(module):
    parser = parser_of(module)
    flags = flags_of(parser)
    for action in parser._actions:
        for option in action.option_strings:
            name = option[2:]
            if option.startswith("--") and name not in ("config", "print-config") and not name.startswith("no-"):
                assert flags[name].dest == action.dest, option
    assert "config" not in flags and "print-config" not in flags
    groups = [g for g in parser._action_groups if g.title not in (parser._positionals.title, parser._optionals.title)
              and g.title != "job file" and g._group_actions]
    assert {f.table for f in flags.values()} == ({table_name(g.title) for g in groups} if groups else {None})
    if module is train_command:  # tables: the first word of each help group's title
        assert {"what", "optimizer", "where", "checkpoints"} <= {f.table for f in flags.values()}
        assert flags["lr"].table == "optimizer" and flags["nproc"] is flags["nproc-per-node"]
    else:  # plan's flags have no groups: top level only
        assert not groups


def test_a_file_flat_grouped_or_underscored_sets_what_the_flags_set(tmp_path):
    by_flags = request_of(TRAIN_FLAGS)
    flat = write(tmp_path, 'model = "tiny"\nlayout = "dp=1,mbs=2"\nglobal-batch = 4\nseq_len = 32\nsteps = 3\n'
                           'seed = 7\nlr = 2e-3\nwarmup_steps = 1\ndevice = "cpu"\nnproc = 1\ncompile = false\n'
                           'fused-qkv = true\non-nan = "skip"\ntimeout = 90.5\n', "flat.toml")
    grouped = write(tmp_path, '[what]\nmodel = "tiny"\nlayout = "dp=1,mbs=2"\nglobal-batch = 4\nseq-len = 32\n'
                              'steps = 3\nseed = 7\n[optimizer]\nlr = 0.002\nwarmup-steps = 1\n[where]\n'
                              'device = "cpu"\nnproc-per-node = 1\ncompile = false\nfused_qkv = true\ntimeout = 90.5\n'
                              '[checkpoints]\non_nan = "skip"\n', "grouped.toml")
    assert request_of(["--config", flat]) == by_flags
    assert request_of(["--config", grouped]) == by_flags
    assert request_of([f"--config={grouped}"]) == by_flags and request_of(["--conf", grouped]) == by_flags


def test_flags_on_the_command_line_override_the_file(tmp_path):
    path = write(tmp_path, 'model = "tiny"\nsteps = 3\nlr = 2e-3\ncompile = false\n[where]\ndevice = "cpu"\n')
    request = request_of(["--config", path, "--steps", "9", "--compile", "--device", "auto"])
    assert (request.steps, request.compile, request.device, request.lr, request.model) == (9, True, "auto", 2e-3,
                                                                                           "tiny")
    assert request_of(["--config", path]).steps == 3  # the parser's defaults were not changed for good


def test_plan_takes_its_required_flags_from_the_file(tmp_path, capsys):
    path = write(tmp_path, 'model = "tiny"\ngpus = 2\nglobal_batch = 8\nseq-len = 64\nfix = ["pp=2"]\nno-offload = true\n'
                           'json = true\n')
    assert main(["plan", "--config", path, "--top", "1"]) == 0
    plans = json.loads(capsys.readouterr().out)
    assert len(plans) == 1 and plans[0]["layout"]["pp"] == 2
    assert main(["plan", "--config", path, "--top", "1", "--fix", "mbs=1"]) == 0  # a repeated flag adds to the list
    (plan,) = json.loads(capsys.readouterr().out)
    assert (plan["layout"]["pp"], plan["layout"]["mbs"]) == (2, 1)


@pytest.mark.parametrize("command,text,expected", [
    ("train", "glob_batch = 8", "unknown key 'glob_batch'; did you mean 'global-batch'?"),
    ("train", "[optimiser]\nlr = 1.0", "unknown key 'optimiser'; did you mean 'optimizer'?"),
    ("train", "[optimizer]\nsteps = 3", "[optimizer] has no key 'steps': it belongs in [what] or at the top level"),
    ("train", "[what]\nmax-restarts = 3", "[what] has no key 'max-restarts': it belongs in [checkpoints]"),
    ("train", 'steps = "3"', 'steps = "3": expected an integer'),
    ("train", "steps = 2.5", "steps = 2.5: expected an integer"),
    ("train", 'lr = "fast"', 'lr = "fast": expected a number'),
    ("train", 'device = "tpu"', 'device = "tpu": expected one of auto, cpu, cuda'),
    ("train", 'fresh = "yes"', 'fresh = "yes": give true or false'),
    ("train", "model = [1]", "model = [1]: expected a string"),
    ("train", 'seq-len = 32\nseq_len = 64', "'seq_len' sets --seq-len again (already set by 'seq-len')"),
    ("train", 'config = "other.toml"', "--config is given on the command line, not in a job file"),
    ("train", "steps = ", "is not valid TOML"),
    ("plan", "lr = 1e-3", "unknown key 'lr' (keys are the flags of `plait plan --help`)"),
])
def test_a_bad_job_file_is_one_line_naming_the_key(tmp_path, capsys, command, text, expected):
    path = write(tmp_path, text + "\n")
    assert main([command, "--config", path]) == 2
    err = capsys.readouterr().err
    assert expected in err and path in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_missing_job_file_is_one_line(tmp_path, capsys):
    assert main(["train", "--config", str(tmp_path / "none.toml")]) == 2
    assert capsys.readouterr().err.strip() == f"plait: error: --config {tmp_path / 'none.toml'}: no such file"
    assert main(["plan", "--config", str(tmp_path)]) == 2
    assert "not a file" in capsys.readouterr().err


# ----------------------------------------------------------------- writing, and reading back
scalars = st.one_of(st.booleans(), st.integers(-2**63, 2**63 - 1), st.floats(allow_nan=False),
                    st.text(st.characters(exclude_categories=("Cs",)), max_size=20))


@settings(max_examples=300, deadline=None, database=None)
@given(st.dictionaries(st.from_regex(r"[a-z][a-z0-9_-]{0,10}", fullmatch=True),
                       st.one_of(scalars, st.lists(scalars, max_size=3)), max_size=6))
def test_the_toml_writer_reads_back_as_the_same_values(values):
    text = dumps(values, {"T": values}, header="a header\nof two lines")
    assert tomllib.loads(text) == ({**values, "T": values} if values else {})


def test_floats_that_toml_spells_its_own_way():
    assert [toml_value(v) for v in (3e-4, 1e20, -0.0, math.inf, -math.inf)] == ["0.0003", "1e+20", "-0.0", "inf",
                                                                               "-inf"]
    assert math.isnan(tomllib.loads(f"x = {toml_value(math.nan)}")["x"])
    assert tomllib.loads(f"x = {toml_value(chr(0x7F) + chr(1))}")["x"] == "\x7f\x01"


def test_print_config_writes_the_job_file_that_reads_back_as_the_same_request(tmp_path, capsys):
    argv = [*TRAIN_FLAGS, "--checkpoint-dir", str(tmp_path / "ckpt"), "--keep-checkpoints", "2", "--log",
            str(tmp_path / 'a "quoted"\\path.jsonl'), "--dry-run"]
    assert main(["train", *argv, "--print-config"]) == 0
    out, err = capsys.readouterr()
    assert "torchrun --nproc-per-node=1" in err  # the dry run's report goes to stderr, stdout is the file alone
    written = tomllib.loads(out)
    assert (written["optimizer"]["lr"], written["optimizer"]["warmup-steps"]) == (2e-3, 1)
    assert written["where"]["compile"] is False and "dry-run" not in written["where"]
    path = write(tmp_path, out)
    assert request_of(["--config", path]) == request_of(argv[:-1])  # all but --dry-run, which is not written
    assert request_of(["--config", path, "--dry-run"]) == request_of(argv)


# ----------------------------------------------------------------- the same run, from flags or from a file
def plait(*args: str) -> int:
    """``plait`` in this process (the test is about the runs, not the command's process: a fresh interpreter
    cost its own torch import); the workers it launches are processes, with OMP_NUM_THREADS=1 (the caller's
    monkeypatch)."""
    return main(list(args))


def losses(path) -> list[float]:
    with open(path, encoding="utf-8") as handle:
        lines = [json.loads(line) for line in handle]
    steps = [line for line in lines if "loss" in line and "summary" not in line]
    assert [line["step"] for line in steps] == [1, 2, 3]  # counted from 1, as the console does
    return [line["loss"] for line in steps]


def test_a_job_file_reproduces_the_run_of_the_same_flags(tmp_path, capsys, monkeypatch):
    pytest.importorskip("torch")
    from plait.run.checkpoint import store

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert plait("train", *TRAIN_FLAGS, "--log", str(tmp_path / "flags.jsonl")) == 0, capsys.readouterr().err[-3000:]
    job = write(tmp_path, '[what]\nmodel = "tiny"\nlayout = "dp=1,mbs=2"\nglobal-batch = 4\nseq-len = 32\n'
                          'steps = 3\nseed = 7\n[optimizer]\nlr = 2e-3\nwarmup-steps = 1\n[where]\ndevice = "cpu"\n'
                          'nproc-per-node = 1\ncompile = false\nfused-qkv = true\ntimeout = 90.5\n'
                          '[checkpoints]\non-nan = "skip"\n')
    extra = ["--log", str(tmp_path / "file.jsonl"), "--checkpoint-dir", str(tmp_path / "ckpt")]
    capsys.readouterr()
    assert main(["train", "--config", job, *extra, "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert plait("train", "--config", job, *extra) == 0, capsys.readouterr().err[-3000:]
    assert losses(tmp_path / "file.jsonl") == losses(tmp_path / "flags.jsonl")  # bit for bit: the same run
    # the checkpoint records the resolved job file: the one --print-config wrote for this command line
    (checkpoint,) = store.complete_dirs(tmp_path / "ckpt")
    assert store.job_file(store.read_manifest(checkpoint)) == printed
    assert store.job_file({"run": {"job": {}}}) is None  # a manifest of an earlier plait has none
