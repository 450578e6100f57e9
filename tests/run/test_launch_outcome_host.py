"""Host memory on the CPU: a worker the OS kills (SIGKILL, the OOM killer) is reported as killed by
the OS with the planner's bytes per process and what the host had available, not as "a worker
died"; and ``plait train`` refuses a CPU run predicted not to fit in ``MemAvailable`` (unless
``--allow-oom``). Fake failure records and a faked ``MemAvailable``: nothing is launched here.
"""

from __future__ import annotations

import dataclasses

import pytest

from plait.cli import main
from plait.errors import PlaitError
from plait.run.config import RunConfig, TrainJob
from plait.run.launcher import host_memory as host
from plait.run.launcher import micro_batch
from plait.run.launcher.host_memory import HostMemory
from plait.run.launcher.outcome import Outcome, failed_run, read_outcome
from plait.spec.hardware import GIB
from plait.spec.layout import Layout
from plait.spec.models import get_model

KILLED = HostMemory(per_process=3.25 * GIB, processes=4, available=9.0 * GIB)


def test_the_numbers_say_per_process_all_processes_and_available():
    assert KILLED.need == 13.0 * GIB and not KILLED.fits
    assert KILLED.describe() == ("the planner predicted 3.2 GiB per process (× 4 = 13.0 GiB), this host has 9.0 GiB "
                                 "available")
    assert HostMemory(2 * GIB, 1, None).fits  # nothing to compare with: not refused
    assert "unknown" in HostMemory(2 * GIB, 1, None).describe()
    small = HostMemory(per_process=12.5 * 2**20, processes=2, available=20 * GIB)
    assert small.kill_note() == ("the planner predicted 12.5 MiB per process (× 2 = 25.0 MiB), this host has 20.0 GiB "
                                 "available (that fits: other processes' memory, or the scheduler, may be the cause)")
    assert KILLED.kill_note() == KILLED.describe()


def test_a_worker_killed_by_the_os_names_the_memory_not_torchruns_banner(tmp_path):
    outcome, message = failed_run(tmp_path, "training", died="=" * 60, dead_rank=2, signal="SIGKILL",
                                  exits={0: 1, 1: 1, 2: -9, 3: 1}, memory_note=KILLED.describe())
    assert message.splitlines()[0] == (
        "training failed: rank 2 was killed by the OS (SIGKILL, exit -9; out of memory?) — the planner predicted "
        "3.2 GiB per process (× 4 = 13.0 GiB), this host has 9.0 GiB available")
    assert "=====" not in message
    assert outcome == Outcome("failed", message.splitlines()[0], failed_rank=2, exit_code=2, signal="SIGKILL")
    # another signal is not the OOM killer's: said as before
    _, message = failed_run(tmp_path, "training", exits={0: -11}, memory_note=KILLED.describe())
    assert message == "training failed: rank 0 was killed by SIGSEGV (exit -11): a crash in native code (segmentation fault)"


def test_launch_passes_the_host_memory_to_the_failure(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    import torch.distributed.run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from plait.run.launcher.launch import LaunchOptions, RunFailed, launch

    def killed(_args):
        raise ChildFailedError("plait.run.worker", {0: ProcessFailure(0, 4242, -9, str(tmp_path / "none.json"))})

    monkeypatch.setattr(torchrun, "run", killed)
    config = RunConfig(job=TrainJob(model=get_model("tiny"), layout=Layout(), global_batch=4, seq_len=32))
    with pytest.raises(RunFailed, match="killed by the OS .* this host has 9.0 GiB available"):
        launch(config, LaunchOptions(nproc_per_node=1), str(tmp_path), host_memory=KILLED)
    assert read_outcome(tmp_path).reason.startswith("training failed: rank 0 was killed by the OS")


def config_of(model: str, layout: str = "dp=1,mbs=1") -> RunConfig:
    return RunConfig(job=TrainJob(model=get_model(model), layout=Layout.parse(layout), global_batch=8, seq_len=64))


def test_the_prediction_is_the_planners_cpu_bytes_times_the_processes(monkeypatch):
    monkeypatch.setattr(micro_batch, "host_available_bytes", lambda: 5.0 * GIB)
    memory = host.host_memory(config_of("tiny", "dp=2,mbs=1"), 2)
    from plait.plan.memory import estimate_memory
    from plait.spec.hardware import cluster_for_gpu

    job = config_of("tiny", "dp=2,mbs=1").job
    expected = micro_batch.cpu_process_bytes(estimate_memory(job.model, cluster_for_gpu("h100-sxm", 2), job.job_spec,
                                                             job.layout))
    assert (memory.per_process, memory.processes, memory.available) == (expected, 2, 5.0 * GIB)
    # fp32 on the CPU: at least 16 bytes per parameter of model states
    assert memory.per_process >= 16 * job.model.total_params()


def test_check_refuses_with_the_numbers_or_warns_with_allow_oom():
    with pytest.raises(PlaitError, match=r"predicted not to fit in host memory: the planner predicted 3\.2 GiB .* "
                                         r"--allow-oom runs it anyway"):
        host.check(KILLED, allow_oom=False)
    (warning,) = host.check(KILLED, allow_oom=True)
    assert "9.0 GiB available" in warning
    assert host.check(dataclasses.replace(KILLED, available=20 * GIB), allow_oom=False) == []


def test_plait_train_on_the_cpu_refuses_a_run_the_host_cannot_hold(monkeypatch, capsys):
    monkeypatch.setattr(micro_batch, "host_available_bytes", lambda: 8.0 * GIB)
    args = ["train", "--model", "llama3-8b", "--layout", "dp=1,mbs=1", "--global-batch", "1", "--seq-len", "128",
            "--device", "cpu", "--dry-run"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "predicted not to fit in host memory" in err and "this host has 8.0 GiB available" in err
    assert len(err.strip().splitlines()) == 1
    assert main([*args, "--allow-oom"]) == 0
    assert "plait: warning: this CPU run is predicted not to fit" in capsys.readouterr().err
    tiny = ["train", "--model", "tiny", "--layout", "dp=1,mbs=1", "--global-batch", "1", "--seq-len", "64",
            "--device", "cpu", "--dry-run"]
    assert main(tiny) == 0 and "host memory" not in capsys.readouterr().err
