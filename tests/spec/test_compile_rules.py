"""Which layouts compile: the automatic default (on GPU where the compile rules allow it), the
forced --compile / --no-compile, the --async-tp rules, and old run configs' compile values."""

from __future__ import annotations

import pytest

from plait.cli import main
from plait.errors import PlaitError
from plait.run.config import RunConfig, RuntimeConfig, TrainJob
from plait.spec.capabilities import RUNTIME_RULES, async_tp_violations, compile_enabled, runtime_violations
from plait.spec.layout import JobSpec, Layout
from plait.spec.models import get_model

TINY = get_model("tiny")
JOB = JobSpec(global_batch=8, seq_len=64)


@pytest.mark.parametrize("compile,device,layout,expected", [
    (None, "cuda", "dp=2", True),
    (None, "cuda", "tp=2", True),  # compile works with tensor parallelism (tests/run/test_compile.py)
    (None, "cuda", "tp=2,ckpt=full", True),
    (None, "cpu", "dp=2", False),  # compile time dominates CPU runs
    (None, "cuda", "cp=2", False),  # runtime-compile-cp
    (None, "cuda", "tp=2,ckpt=selective", False),  # runtime-compile-tp-ckpt
    (None, "cuda", "pp=2,schedule=zero-bubble", False),
    (True, "cpu", "dp=2", True),
    (False, "cuda", "dp=2", False),
])
def test_compile_default_resolution(compile, device, layout, expected):
    assert compile_enabled(compile, device, Layout.parse(layout)) is expected


@pytest.mark.parametrize("layout", ["tp=2", "cp=2", "tp=2,ckpt=selective", "offload=0.5"])
def test_auto_and_no_compile_refuse_nothing_for_compile(layout):
    lay = Layout.parse(layout)
    assert runtime_violations(TINY, lay, JOB, compile=None) == runtime_violations(TINY, lay, JOB, compile=False)
    assert not any(v.rule.startswith("runtime-compile") for v in runtime_violations(TINY, lay, JOB, compile=None))


def test_forced_compile_with_tp_is_refused_only_with_a_checkpoint_inside_the_block():
    assert runtime_violations(TINY, Layout.parse("tp=2"), JOB, compile=True) == []
    assert runtime_violations(TINY, Layout.parse("tp=2,ckpt=full"), JOB, compile=True) == []
    for policy in ("selective", "balanced", "mlp"):
        found = runtime_violations(TINY, Layout.parse(f"tp=2,ckpt={policy}"), JOB, compile=True)
        assert [v.rule for v in found] == ["runtime-compile-tp-ckpt"]
        assert f"ckpt={policy}" in found[0].message and "ckpt=full or none" in found[0].message
    assert runtime_violations(TINY, Layout.parse("ckpt=mlp"), JOB, compile=True) == []  # tp=1: compiled


@pytest.mark.parametrize("layout,device,compile,backend,rules", [
    ("tp=2", "cuda", None, "inductor", []),
    ("tp=2", "auto", True, "inductor", []),
    ("tp=2", "cpu", None, "inductor", ["runtime-async-tp-device"]),
    ("tp=2", "cuda", False, "inductor", ["runtime-async-tp-compile"]),
    ("tp=2", "cuda", True, "aot_eager", ["runtime-async-tp-compile"]),
    ("tp=2,sp=0", "cuda", True, "inductor", ["runtime-async-tp-sp"]),
    ("dp=2", "cpu", False, "inductor", ["runtime-async-tp-device", "runtime-async-tp-compile", "runtime-async-tp-sp"]),
])
def test_async_tp_rules(layout, device, compile, backend, rules):
    found = async_tp_violations(Layout.parse(layout), device=device, compile=compile, backend=backend)
    assert [v.rule for v in found] == rules
    assert all(v.rule in RUNTIME_RULES for v in found)


def test_run_config_refuses_async_tp_on_cpu_by_its_message():
    config = RunConfig(job=TrainJob(model=TINY, layout=Layout.parse("tp=2"), global_batch=8, seq_len=32),
                       runtime=RuntimeConfig(device="cpu", async_tp=True))
    assert any("--async-tp needs CUDA GPUs with NCCL" in p for p in config.runtime_problems())
    assert RunConfig(job=config.job, runtime=RuntimeConfig(device="cpu")).runtime_problems() == []


@pytest.mark.parametrize("saved,expected", [(False, False), (True, True), ("absent", None)])
def test_old_run_configs_keep_their_compile_value(saved, expected):
    config = RunConfig(job=TrainJob(model=TINY, layout=Layout.parse("dp=1"), global_batch=8, seq_len=32))
    data = config.to_dict()
    if saved == "absent":
        del data["runtime"]["compile"]
        del data["runtime"]["async_tp"]
    else:
        data["runtime"]["compile"] = saved
    loaded = RunConfig.from_dict(data)
    assert loaded.runtime.compile is expected and loaded.runtime.async_tp is False
    assert RunConfig.from_dict(loaded.to_dict()) == loaded


def test_compile_must_be_true_false_or_null():
    with pytest.raises(PlaitError, match="compile='yes' must be true, false or null"):
        RuntimeConfig(compile="yes")


@pytest.mark.parametrize("flags,expected", [([], None), (["--compile"], True), (["--no-compile"], False)])
def test_train_flags_give_the_tri_state(monkeypatch, flags, expected):
    pytest.importorskip("torch")
    seen = {}

    def fake_start(request, job_file=None):  # resolve.start's signature (job_file: the run's TOML record)
        seen["request"] = request
        return 0

    monkeypatch.setattr("plait.run.launcher.resolve.start", fake_start)
    assert main(["train", "--model", "tiny", "--global-batch", "8", "--seq-len", "32", *flags]) == 0
    assert seen["request"].compile is expected and seen["request"].async_tp is False


def test_async_tp_on_cpu_is_one_clear_line(capsys):
    pytest.importorskip("torch")
    code = main(["train", "--model", "tiny", "--global-batch", "8", "--seq-len", "32", "--layout", "tp=2",
                 "--nproc-per-node", "2", "--device", "cpu", "--async-tp", "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and "--async-tp needs CUDA GPUs with NCCL" in err and "Traceback" not in err
