"""Fuzzed command lines never end in a traceback: mutated flags and mutated model, cluster,
calibration, plan and sweep files and published-runs CSV rows (tests/support/fuzz_inputs.py) given to
``plan``, ``validate``, ``train --dry-run``, ``report`` and ``calibrate fit`` end with exit status 0, 1
or 2 and print no traceback (a user error is one line). ``plait.cli.main`` runs in-process.

Reproducible: hypothesis draws from a fixed seed, without its example database. The counts keep the
file near a minute on two cores (``report`` draws plots, so it runs fewer); bench/fuzz_cli.py runs
thousands more per command. A case that runs for 10 s of CPU time counts as a hang (a loop over a
huge number).
"""

from __future__ import annotations

import warnings

import pytest
from fuzz_inputs import CASES, ended_well, run_case
from hypothesis import HealthCheck, Phase, given, seed, settings

# ~10-25 ms a case (a report ~110 ms: it draws four plots): about 40 s in all on two cores
EXAMPLES = {"plan": 500, "validate": 500, "train --dry-run": 500, "report": 100, "calibrate fit": 500}


@pytest.mark.parametrize("command", sorted(EXAMPLES))
def test_fuzzed_input_never_ends_in_a_traceback(command, tmp_path):
    seen = []

    @seed(15)
    @settings(max_examples=EXAMPLES[command], deadline=None, database=None,
              phases=[Phase.explicit, Phase.generate, Phase.shrink],
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                     HealthCheck.function_scoped_fixture])
    @given(CASES[command]())
    def check(case):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            code, output = run_case(case, tmp_path)
        seen.append(code)
        assert ended_well(code, output), f"plait {' '.join(case[0])} -> exit {code}:\n{output[-3000:]}"

    check()
    assert len(seen) >= EXAMPLES[command] // 2  # hypothesis really ran them
    assert 0 in seen and 2 in seen  # both good and bad inputs were reached
