"""The run's own prediction (``preflight``: the step time and memory ``plait train`` prints and logs
against what it measures) prices the blocks as the run compiles them.

The first GPU proof compiled every block while the prediction beside it priced them eager: 0.62 s
predicted for 0.48 s measured, an error of the comparison, not of the model.
"""

from __future__ import annotations

import dataclasses

import pytest
from runtime_tasks import make_config

from plait.plan.compiled import with_compile
from plait.plan.params import DEFAULT_PARAMS
from plait.plan.plan import evaluate
from plait.run.launcher.launch import LaunchOptions
from plait.run.launcher.preflight import preflight, run_cluster


def gpu_config(compile_setting):
    config = make_config("dp=1,mbs=2", model="llama-125m", seq_len=1024, global_batch=8, compile=compile_setting)
    return dataclasses.replace(config, runtime=dataclasses.replace(config.runtime, device="cuda", gpu="h100-sxm"))


@pytest.mark.parametrize("compile_setting,compiled", [(True, 1.0), (False, 0.0), (None, 1.0)])
def test_the_prediction_prices_the_compile_setting_of_the_run(compile_setting, compiled):
    config = gpu_config(compile_setting)
    options = LaunchOptions(nproc_per_node=1)
    checked, _ = preflight(config, options, dry_run=True)  # no GPU here: checked as the GPU run it will be
    job = config.job
    params = dataclasses.replace(DEFAULT_PARAMS, compiled_blocks=compiled, compile_rules=1.0)
    want = evaluate(job.model, run_cluster(checked, options), job.job_spec, job.layout, params)
    assert checked.prediction.step_time_s == want.step.step_time
    assert with_compile(DEFAULT_PARAMS, None, compile_setting, "cuda").compiled_blocks == compiled


def test_compiled_blocks_are_predicted_faster_than_eager_ones():
    options = LaunchOptions(nproc_per_node=1)
    compiled, _ = preflight(gpu_config(True), options, dry_run=True)
    eager, _ = preflight(gpu_config(False), options, dry_run=True)
    assert compiled.prediction.step_time_s < eager.prediction.step_time_s
