"""RunConfig's typed sub-configs: their checks, the nested JSON form, the flat form of earlier
plait versions (old checkpoint manifests and run directories must still resume), the digest."""

from __future__ import annotations

import dataclasses
import json

import pytest

from plait.cli import main
from plait.errors import PlaitError
from plait.run.checkpoint import store
from plait.run.config import (
    CheckpointConfig,
    EvalConfig,
    LogConfig,
    OptimConfig,
    Prediction,
    RunConfig,
    RuntimeConfig,
    TrainJob,
)
from plait.spec.layout import Layout
from plait.spec.models import get_model

TINY = get_model("tiny")


def flat_form(**changes) -> dict:
    """A run dict exactly as plait's flat ``RunConfig.to_dict`` wrote it before the sub-configs
    (every key, in its order), with every value off its default so that no mapping hides."""
    flat = {
        "model": dataclasses.asdict(TINY), "layout": "dp=2,tp=1,pp=1,cp=1,mbs=2", "global_batch": 8, "seq_len": 32,
        "steps": 7, "seed": 5, "data": "tokens.bin", "log": "metrics.jsonl",
        "optim": {"lr": 0.001, "min_lr_ratio": 0.2, "warmup_steps": 2, "weight_decay": 0.05, "beta1": 0.8,
                  "beta2": 0.9, "eps": 1e-06, "grad_clip": 0.5},
        "compile": True, "compile_backend": "aot_eager", "device": "cpu", "gpu": "h100-sxm", "timeout_s": 60.0,
        "log_every": 4,
        "prediction": {"step_time_s": 0.25, "memory_bytes": 3.5e9, "mfu": 0.4, "gpu": "h100-sxm",
                       "allocated_bytes": 2.5e9},
        "checkpoint_dir": "/ckpt", "checkpoint_every": 2, "keep_checkpoints": 1, "async_checkpoint": False,
        "resume_from": "/ckpt/step_00000004", "on_nan": "skip", "offload_dir": "/scratch",
    }
    return {**flat, **changes}


def nested_config() -> RunConfig:
    """``flat_form()`` as today's RunConfig."""
    return RunConfig(
        job=TrainJob(model=TINY, layout=Layout.parse("dp=2,mbs=2"), global_batch=8, seq_len=32, steps=7, seed=5,
                     data="tokens.bin"),
        optim=OptimConfig(lr=0.001, min_lr_ratio=0.2, warmup_steps=2, weight_decay=0.05, beta1=0.8, beta2=0.9,
                          eps=1e-6, grad_clip=0.5),
        checkpoint=CheckpointConfig(dir="/ckpt", every=2, keep=1, use_async=False, resume_from="/ckpt/step_00000004"),
        runtime=RuntimeConfig(device="cpu", gpu="h100-sxm", compile=True, compile_backend="aot_eager", timeout_s=60.0,
                              on_nan="skip", offload_dir="/scratch"),
        observe=LogConfig(log="metrics.jsonl", log_every=4),
        prediction=Prediction(step_time_s=0.25, memory_bytes=3.5e9, mfu=0.4, gpu="h100-sxm", allocated_bytes=2.5e9))


def test_the_flat_form_of_earlier_versions_loads_to_the_same_config():
    assert RunConfig.from_dict(flat_form()) == nested_config()
    assert RunConfig.from_dict(json.loads(json.dumps(flat_form()))) == nested_config()
    # the flat form without a prediction (CPU runs) and with the defaults the old launcher wrote
    bare = flat_form(prediction=None, checkpoint_dir=None, checkpoint_every=0, keep_checkpoints=3,
                     async_checkpoint=None, resume_from=None)
    loaded = RunConfig.from_dict(bare)
    assert loaded.prediction is None and loaded.checkpoint == CheckpointConfig()


def test_to_dict_writes_the_nested_form_and_reads_it_back(tmp_path):
    config = nested_config()
    data = config.to_dict()
    assert list(data) == ["job", "optim", "checkpoint", "runtime", "observe", "eval", "prediction", "job_file"]
    assert data["job"]["layout"] == "dp=2,tp=1,pp=1,cp=1,mbs=2" and data["checkpoint"]["dir"] == "/ckpt"
    assert data["prediction"]["allocated_bytes"] == 2.5e9
    assert RunConfig.from_dict(json.loads(json.dumps(data))) == config
    config.save(tmp_path / "config.json")
    assert RunConfig.load(tmp_path / "config.json") == config
    minimal = RunConfig(job=TrainJob(model=TINY, layout=Layout(), global_batch=4, seq_len=16))
    assert RunConfig.from_dict(minimal.to_dict()) == minimal


def test_unknown_fields_are_plait_errors():
    with pytest.raises(PlaitError, match=r"unknown run fields \['colour'\]"):
        RunConfig.from_dict(flat_form(colour="blue"))
    nested = nested_config().to_dict()
    nested["runtime"]["colour"] = "blue"
    with pytest.raises(PlaitError, match="unknown runtime fields"):
        RunConfig.from_dict(nested)


@pytest.mark.parametrize("build,message", [
    (lambda: TrainJob(model=TINY, layout=Layout(), global_batch=0, seq_len=32),
     "global_batch=0 must be a positive integer"),
    (lambda: TrainJob(model=TINY, layout=Layout(), global_batch=8, seq_len=-1),
     "seq_len=-1 must be a positive integer"),
    (lambda: TrainJob(model=TINY, layout=Layout(), global_batch=8, seq_len=32, steps=True),
     "steps=True must be a positive integer"),
    (lambda: CheckpointConfig(every=-1), "checkpoint_every=-1 must be a non-negative integer"),
    (lambda: CheckpointConfig(keep=-2), "keep_checkpoints=-2 must be a non-negative integer"),
    (lambda: RuntimeConfig(device="tpu"), "device='tpu' must be auto, cpu or cuda"),
    (lambda: RuntimeConfig(timeout_s=0), "timeout_s=0 must be positive"),
    (lambda: RuntimeConfig(on_nan="ignore"), "on_nan='ignore' must be stop or skip"),
    (lambda: LogConfig(log_every=0), "log_every=0 must be a positive integer"),
])
def test_each_sub_config_checks_its_own_fields(build, message):
    with pytest.raises(PlaitError, match="^invalid run: ") as caught:
        build()
    assert message in str(caught.value)


def test_derived_job_values():
    job = nested_config().job
    assert (job.job_spec.global_batch, job.job_spec.seq_len) == (8, 32)
    assert job.tokens_per_step == 8 * 32


def test_the_digest_covers_the_sub_configs_that_define_the_run():
    pytest.importorskip("torch")
    from plait.run.worker import config_digest

    config = nested_config()
    digest = config_digest(config)
    same = [dataclasses.replace(config, observe=LogConfig()), dataclasses.replace(config, prediction=None)]
    assert all(config_digest(other) == digest for other in same)
    different = [dataclasses.replace(config, job=dataclasses.replace(config.job, seed=6)),
                 dataclasses.replace(config, optim=OptimConfig()),
                 dataclasses.replace(config, checkpoint=CheckpointConfig()),
                 dataclasses.replace(config, runtime=dataclasses.replace(config.runtime, timeout_s=61.0)),
                 dataclasses.replace(config, eval=EvalConfig(data="held_out.tok"))]  # a collective: ranks agree
    assert all(config_digest(other) != digest for other in different)


def test_resume_reads_a_checkpoint_whose_manifest_has_the_flat_form(capsys, tmp_path):
    """``plait train --resume`` of a checkpoint written before the sub-configs (checked up to the
    dry run: the launcher's reading of the manifest, the resumed config it writes for the workers)."""
    pytest.importorskip("torch")
    checkpoint = tmp_path / "ckpt" / store.final_name(2)
    checkpoint.mkdir(parents=True)
    flat = flat_form(layout="dp=2,tp=1,pp=1,cp=1,mbs=1", data="synthetic", steps=4, gpu=None, prediction=None,
                     compile=False, compile_backend="inductor", device="auto", resume_from=None,
                     checkpoint_dir=str(tmp_path / "ckpt"), async_checkpoint=None, offload_dir=None)
    store.write_manifest(checkpoint, 2, {}, flat, {"layout": "dp=2", "world_size": 2})
    code = main(["train", "--resume", str(checkpoint), "--steps", "6", "--device", "cpu", "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"resuming from {checkpoint} (step 2 of 6" in out
    written = RunConfig.from_dict(json.loads(out.split("config.json:\n", 1)[1]))
    saved = RunConfig.from_dict(flat)
    assert written.job == dataclasses.replace(saved.job, steps=6)
    assert written.optim == saved.optim
    assert written.checkpoint == dataclasses.replace(saved.checkpoint, resume_from=str(checkpoint))
    assert written.runtime.device == "cpu" and written.runtime.on_nan == "stop"


def test_the_prediction_of_a_plan():
    from plait.plan.plan import evaluate
    from plait.spec.hardware import cluster_for_gpu

    layout = Layout.parse("dp=2")
    plan = evaluate(TINY, cluster_for_gpu("h100-sxm", 2, 2), nested_config().job.job_spec, layout)
    prediction = Prediction.of_plan(plan, "h100-sxm")
    assert prediction == Prediction(step_time_s=plan.step.step_time, memory_bytes=plan.memory.total,
                                    mfu=plan.step.mfu, gpu="h100-sxm", allocated_bytes=plan.memory.allocated)
    assert prediction.allocated_bytes < prediction.memory_bytes
