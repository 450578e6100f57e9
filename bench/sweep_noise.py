"""Benchmark (issue 12): how far apart ``plait sweep`` reports identical code on this CPU, by protocol.

One layout of the tiny model (``dp=2,mbs=4,zero=2``, two processes, the one the ``--top 3`` check
runs) is run ``--runs`` times under each timing protocol through ``plait sweep --repeats N
--keep-runs DIR``; each run's step time is the median of its post-warm-up steps, as the sweep
computes it (``plait.measure.sweep.timing.run_timing``). From those runs the script resamples
(without replacement, fixed seed) what a sweep with R repeats per layout would report, the median
of R runs, and prints for each R:

- how often two such reports of identical code land more than 25% apart (the issue's bar), and
  how far apart they are at the 95th percentile;
- the same for the worst pair of three reports (a ``--top 3`` sweep whose three layouts ran
  the same code).

The protocols: ``--steps 3 --min-time 0`` (one warm-up step and two timed ones: the sweep's
default before), and ``--steps 3 --min-time 1`` (at least one second timed per run: the default
for CPU runs now, ``timing.CPU_MIN_TIME_S``). Results (machine, date) are appended to
``bench/results/sweep_noise.md``.

    python bench/sweep_noise.py              # 24 runs per protocol, about 6 minutes on 2 cores
    python bench/sweep_noise.py --runs 8 --no-record
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from results_file import append_result  # noqa: E402
from plait.measure.sweep.csv_file import read_sweep  # noqa: E402
from plait.measure.sweep.timing import run_timing  # noqa: E402

LAYOUT = "dp=2,mbs=4,zero=2"
PROTOCOLS = {"--steps 3 --min-time 0": ("3", "0"), "--steps 3 --min-time 1": ("3", "1")}
BAR = 0.25
REPEATS = (1, 2, 3, 5)
DRAWS = 20000


def run_protocol(steps: str, min_time: str, runs: int, work: Path) -> list[float]:
    """Each counted run's step time (seconds) of ``runs`` runs of ``LAYOUT`` under one protocol."""
    keep = work / "runs"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    argv = [sys.executable, "-m", "plait.cli", "sweep", "--model", "tiny", "--nproc-per-node", "2", "--global-batch",
            "8", "--seq-len", "128", "--device", "cpu", "--layout", LAYOUT, "--steps", steps, "--min-time", min_time,
            "--repeats", str(runs), "--keep-runs", str(keep), "--out", str(work / "sweep.csv")]
    with (work / "sweep.log").open("w") as log:
        done = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"plait sweep failed (exit {done.returncode}); see {work / 'sweep.log'}")
    (row,) = read_sweep(work / "sweep.csv")
    timings = [run_timing(path / "train.jsonl", row.warmup_steps) for path in sorted(keep.iterdir())]
    # the runs the sweep counted: a --min-time probe it did not count timed fewer steps than the row's
    return [t.median for t in timings if t is not None and len(t.step_times) == row.measured_steps]


def apart(values: list[float]) -> float:
    return max(values) / min(values) - 1


def resample(medians: list[float], repeats: int, reports: int, rng: random.Random) -> list[float] | None:
    """``DRAWS`` draws of how far apart ``reports`` reports of ``repeats`` runs each land; None when
    there are too few runs."""
    if repeats * reports > len(medians):
        return None
    out = []
    for _ in range(DRAWS):
        drawn = rng.sample(medians, repeats * reports)
        out.append(apart([statistics.median(drawn[i * repeats:(i + 1) * repeats]) for i in range(reports)]))
    return sorted(out)


def rows_of(name: str, medians: list[float]) -> list[str]:
    rng = random.Random(0)
    lines = []
    for repeats in REPEATS:
        pairs, triples = resample(medians, repeats, 2, rng), resample(medians, repeats, 3, rng)
        if pairs is None:
            continue
        over = sum(a > BAR for a in pairs) / len(pairs)
        over3 = "" if triples is None else f"{sum(a > BAR for a in triples) / len(triples):.1%}"
        lines.append(f"| `{name}` | {repeats} | {over:.1%} | {pairs[int(0.95 * len(pairs))]:.1%} | {over3} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=24, help="runs per protocol (default 24)")
    parser.add_argument("--work", help="keep the sweeps and their runs here (default: a temp dir)")
    parser.add_argument("--no-record", action="store_true", help="do not append to bench/results/sweep_noise.md")
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="plait-sweep-noise-"))
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    measured = {}
    for index, (name, (steps, min_time)) in enumerate(PROTOCOLS.items()):
        folder = work / f"protocol-{index}"
        folder.mkdir(parents=True, exist_ok=True)
        measured[name] = run_protocol(steps, min_time, args.runs, folder)
    lines = [f"## {now} - {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
             f"python {platform.python_version()}", "",
             f"`python bench/sweep_noise.py --runs {args.runs}`: `{LAYOUT}` of the tiny model, 2 processes, "
             "global batch 8 × 128", "",
             "| protocol | runs | fastest run s | median run s | slowest run s | fastest to slowest |",
             "|---|---|---|---|---|---|"]
    lines += [f"| `{name}` | {len(m)} | {min(m):.4f} | {statistics.median(m):.4f} | {max(m):.4f} | {apart(m):.1%} |"
              for name, m in measured.items()]
    lines += ["", f"Reports of identical code, each the median of R runs drawn from those ({DRAWS} draws):", "",
              "| protocol | R | two reports > 25% apart | 95th percentile apart | worst of three > 25% apart |",
              "|---|---|---|---|---|"]
    for name, medians in measured.items():
        lines += rows_of(name, medians)
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_record:
        append_result("sweep_noise.md", "Sweep noise: how far apart identical runs land on this machine (issue 12)",
                      "sweep_noise.py", text)
    print(f"work files: {work}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
