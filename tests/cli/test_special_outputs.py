"""Every writer of plait writes *through* a device node or a FIFO and refuses a directory - it never
renames a temporary file over what is not a regular file (``plait.atomic``; issue 15: ``plait data
prepare --out /dev/null`` run as root replaced the machine's /dev/null with a regular file).

For each writer: a character device made with ``os.mknod`` (a copy of /dev/null: major 1, minor 3;
skipped where mknod is not permitted) stays a character device; a FIFO stays a FIFO and its reader
gets the bytes; a directory is refused with a one-line error and left as it was.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from fuzz_inputs import RUN_HEADER, RUN_ROWS

from plait.atomic import atomic_write_text
from plait.cli import main
from plait.errors import PlaitError
from plait.measure.sweep.csv_file import SweepRow, SweepWriter
from plait.plan.calibration import write_calibration
from plait.run.checkpoint.store import write_manifest
from plait.run.data.tokens import prepare, sample_corpus_path
from plait.run.launcher.outcome import Outcome, write_outcome

PLAN = ["plan", "--model", "tiny", "--cluster", "dgx-h100", "--gpus", "2", "--global-batch", "8", "--seq-len", "64",
        "--layout", "dp=2"]


def _cli(*argv: str) -> None:
    """Run plait in-process; a non-zero exit becomes a PlaitError (as the API writers raise)."""
    if main(list(argv)) != 0:
        raise PlaitError(f"plait {' '.join(argv)} failed")


def _report(target: Path) -> None:
    sweep = target.parent.parent / "sweep.csv"
    writer = SweepWriter(sweep)
    writer.write(SweepRow("dp=1,tp=1,pp=1,cp=1,mbs=1", "ok", model="tiny", global_batch=8, seq_len=64,
                          nproc_per_node=1, predicted_step_time_s=0.1, measured_step_time_s=0.1, device="cpu"))
    writer.close()
    _cli("report", "--sweep", str(sweep), "--out", str(target.parent))


def _predictions(target: Path) -> None:
    runs = target.parent.parent / "runs.csv"
    runs.write_text("\n".join(",".join(row) for row in [RUN_HEADER, *RUN_ROWS]) + "\n")
    _cli("validate", "--runs", str(runs), "--out", str(target))


def _sweep_csv(target: Path) -> None:
    writer = SweepWriter(target)
    writer.write(SweepRow("dp=1", "ok"))
    writer.close()


# writer name -> (file name inside the output directory, or None for any name; write to ``target``)
WRITERS = {
    "plan --save": (None, lambda target: _cli(*PLAN, "--save", str(target))),
    "plan --plot": ("plan.png", lambda target: _cli(*PLAN, "--plot", str(target))),
    "calibration file": (None, lambda target: write_calibration(target, {"params": {"dp_overlap": 0.5}})),
    "data prepare (API)": (None, lambda target: prepare([sample_corpus_path()], target)),
    "data prepare (CLI)": (None, lambda target: _cli("data", "prepare", "--out", str(target))),
    "validate --out": (None, _predictions),
    "sweep CSV": (None, _sweep_csv),
    "report": ("report.html", _report),
    "outcome": ("outcome.json", lambda target: write_outcome(target.parent, Outcome("ok", "done"))),
    "manifest": ("manifest.json", lambda target: write_manifest(target.parent, 3, {}, {"seed": 0}, {})),
    "atomic_write_text": (None, lambda target: atomic_write_text(target, "text\n")),
}


def _target(tmp_path: Path, writer: str) -> Path:
    name = WRITERS[writer][0] or "output.bin"
    (tmp_path / "out").mkdir()
    return tmp_path / "out" / name


def _write(writer: str, target: Path) -> None:
    WRITERS[writer][1](target)


@pytest.fixture(autouse=True)
def dev_null_stays_a_device():
    yield
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode), "/dev/null was replaced"


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_device_node_is_written_through(writer, tmp_path, capsys):
    target = _target(tmp_path, writer)
    try:
        os.mknod(target, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # what /dev/null is
    except (PermissionError, OSError) as exc:
        pytest.skip(f"cannot make a device node here: {exc}")
    _write(writer, target)
    assert stat.S_ISCHR(os.stat(target).st_mode)
    assert not [p.name for p in target.parent.iterdir() if p.name.endswith(".tmp")]  # no temporary left


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_fifo_is_written_through_to_its_reader(writer, tmp_path, capsys):
    target = _target(tmp_path, writer)
    os.mkfifo(target)
    received = bytearray()

    def read() -> None:
        with open(target, "rb") as fifo:  # blocks until the writer opens it
            while chunk := fifo.read(65536):
                received.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        _write(writer, target)
    finally:
        reader.join(timeout=30)
        if reader.is_alive():  # the writer never opened the FIFO: release the reader
            os.close(os.open(target, os.O_WRONLY | os.O_NONBLOCK))
            reader.join(timeout=10)
    assert stat.S_ISFIFO(os.stat(target).st_mode)
    assert len(received) > 0


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_directory_is_refused_and_left_untouched(writer, tmp_path, capsys):
    target = _target(tmp_path, writer)
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    with pytest.raises(PlaitError):
        _write(writer, target)
    assert [p.name for p in target.iterdir()] == ["keep.txt"] and (target / "keep.txt").read_text() == "mine"
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 1


@pytest.mark.skipif(not stat.S_ISCHR(os.stat("/dev/null").st_mode), reason="/dev/null is not a device here")
@pytest.mark.parametrize("argv", [[*PLAN, "--save", "/dev/null"], ["data", "prepare", "--out", "/dev/null"]])
def test_dev_null_itself_stays_a_device(argv, capsys):
    assert main(argv) == 0
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


@pytest.mark.parametrize("to_file", [False, True])
def test_dev_stdout_is_written_through(tmp_path, to_file):
    """``plait plan --save /dev/stdout`` into a pipe, and into a file (``> plan.txt``): the plan
    follows the table, and /dev/stdout stays a link."""
    if not os.path.islink("/dev/stdout"):
        pytest.skip("no /dev/stdout link here")
    out = tmp_path / "stdout.txt"
    with open(out, "wb") as handle:
        proc = subprocess.run([sys.executable, "-m", "plait.cli", *PLAN, "--save", "/dev/stdout"], timeout=120,
                              stdout=handle if to_file else subprocess.PIPE, stderr=subprocess.PIPE)
    text = out.read_text() if to_file else proc.stdout.decode()
    assert proc.returncode == 0, proc.stderr
    assert '"format"' in text and "dp=2" in text and "saved the plan to /dev/stdout" in text
    assert os.path.islink("/dev/stdout")
