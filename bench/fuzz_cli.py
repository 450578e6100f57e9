"""Fuzz the command line at a larger count than the committed test (tests/cli/test_fuzz_cli.py).

    PYTHONPATH=src python bench/fuzz_cli.py [--examples 10000] [--seed 0] [--only plan] [--draw-every 1]

Draws mutated flags and input files (tests/support/fuzz_inputs.py, tests/support/fuzz_more.py) for plan,
validate, train --dry-run, report, calibrate fit, data prepare, train --config (TOML job files), export
and train --init-from, runs ``plait.cli.main`` in-process, and prints one table row per command:
examples run, exit statuses seen, bad endings (an exception escaping, a traceback printed, another exit
status) and the distinct places they came from. The first bad case of each place is printed below the
table. Record a run in bench/results/fuzz_cli.md with the machine and the date.

``--draw-every N`` (N > 1) rasterizes the figures of one case in N only: in the other cases every
plotting call still runs (figures, bars, axis limits, titles, legends: where the NaN-limit and
type errors were found) but ``Figure.savefig`` writes nothing, so the PNG files are empty. Agg's
drawing and PNG encoding are two thirds of a report case; the drawn sample still exercises them
(text layout, mathtext, tight bounding boxes). The table's ``drawn`` column counts the cases drawn.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import sys
import tempfile
import time
import warnings
from pathlib import Path

import hypothesis

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))

from fuzz_inputs import CASES as BASE_CASES, ended_well, run_case  # noqa: E402
from fuzz_more import MORE_CASES  # noqa: E402

CASES = {**BASE_CASES, **MORE_CASES}
PROGRESS_EVERY = 250  # cases between progress lines on stderr


def where(output: str) -> str:
    """The innermost ``File ..., line N`` of a traceback plus its last line: one distinct failure."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    frames = [line for line in lines if line.startswith("File ")]
    return f"{frames[-1] if frames else '?'} | {lines[-1] if lines else '?'}"


@contextlib.contextmanager
def figures_drawn(draw: bool):
    """Within: ``Figure.savefig`` as usual (``draw``), or a no-op that leaves the output empty."""
    if draw:
        yield
        return
    from matplotlib.figure import Figure

    original = Figure.savefig
    Figure.savefig = lambda self, *args, **kwargs: None
    try:
        yield
    finally:
        Figure.savefig = original


def fuzz(name: str, examples: int, seed: int, directory: Path, draw_every: int = 1) -> dict:
    """Run ``examples`` cases of one command (hypothesis draws them, seeded; nothing is shrunk);
    figures are rasterized in one case of ``draw_every`` (``figures_drawn``)."""
    codes: collections.Counter = collections.Counter()
    failures: dict[str, tuple[list[str], str]] = {}
    bad = [0]
    drawn = [0]
    start = time.perf_counter()

    @hypothesis.seed(seed)
    @hypothesis.settings(max_examples=examples, deadline=None, database=None, phases=[hypothesis.Phase.generate],
                         suppress_health_check=list(hypothesis.HealthCheck))
    @hypothesis.given(CASES[name]())
    def one(case):
        draw = sum(codes.values()) % draw_every == 0
        drawn[0] += draw
        with figures_drawn(draw):
            code, output = run_case(case, directory)
        codes[code] += 1
        if not ended_well(code, output):
            bad[0] += 1
            failures.setdefault(where(output), (case[0], output))
        n = sum(codes.values())
        if n % PROGRESS_EVERY == 0:  # a run stopped early still leaves what it ran
            print(f"... {name} seed {seed}: {n} cases, exit 0/1/2 {codes[0]}/{codes[1]}/{codes[2]}, {bad[0]} bad "
                  f"({'; '.join(failures) or 'none'}), {drawn[0]} drawn, {time.perf_counter() - start:.0f} s",
                  file=sys.stderr, flush=True)

    one()
    return {"name": name, "examples": sum(codes.values()), "codes": dict(codes), "bad": bad[0], "drawn": drawn[0],
            "failures": failures, "seconds": time.perf_counter() - start}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=10_000, help="examples per command")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", choices=sorted(CASES), action="append", help="fuzz only this command")
    parser.add_argument("--draw-every", type=int, default=1, metavar="N",
                        help="rasterize the figures (Figure.savefig) of one case in N; the others build them only")
    args = parser.parse_args()
    if args.draw_every < 1:
        parser.error("--draw-every must be 1 or more")
    warnings.simplefilter("ignore")
    results = []
    with tempfile.TemporaryDirectory(prefix="plait-fuzz-") as tmp:
        for name in args.only or list(CASES):
            results.append(fuzz(name, args.examples, args.seed, Path(tmp), args.draw_every))
            print(f"... {name}: {results[-1]['examples']} in {results[-1]['seconds']:.0f} s", file=sys.stderr)
    print("| command | examples | drawn | exit 0 / 1 / 2 | bad endings | distinct | seconds |")
    print("|---|---:|---:|---|---:|---:|---:|")
    for r in results:
        codes = " / ".join(str(r["codes"].get(c, 0)) for c in (0, 1, 2))
        print(f"| {r['name']} | {r['examples']} | {r['drawn']} | {codes} | {r['bad']} | {len(r['failures'])} "
              f"| {r['seconds']:.0f} |")
    for r in results:
        for place, (argv, output) in r["failures"].items():
            print(f"\n## {r['name']}: {place}\nargv: {argv}\n{output[-1500:]}")
    return 1 if any(r["bad"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
