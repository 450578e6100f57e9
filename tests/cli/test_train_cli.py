"""``plait train`` and ``plait data prepare`` end to end, through torchrun, and their bad input.

The launches are real (torchrun, gloo ranks on CPU) and kept few: each costs a few seconds.
Bad input that is caught before launching is checked in-process.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from plait.cli import main
from plait.run.observe.jsonl import HEADER

pytest.importorskip("torch")


def plait(*args: str, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "plait.cli", *args], capture_output=True, text=True,
                          timeout=timeout, check=False, env={**os.environ, **(env or {})})


def run_inline(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("data") / "corpus.tok"
    proc = plait("data", "prepare", "--out", str(path))
    assert proc.returncode == 0, proc.stderr
    assert "tokens" in proc.stdout and path.is_file()
    return str(path)


def read_jsonl(path) -> list[dict]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def test_train_on_the_sample_corpus_loss_falls(corpus, tmp_path, capfd):
    # in-process: the test is about the run, not the command's own process (a fresh interpreter cost a
    # torch import); the workers are processes, whose output capfd reads as the subprocess's pipes did
    log = tmp_path / "run.jsonl"
    code = main(["train", "--model", "tiny", "--layout", "dp=2,zero=3", "--global-batch", "8", "--seq-len", "64",
                 "--nproc-per-node", "2", "--steps", "40", "--seed", "3", "--lr", "3e-3", "--data", corpus,
                 "--log", str(log), "--device", "cpu"])
    out, err = capfd.readouterr()
    assert code == 0, err[-3000:]
    lines = read_jsonl(log)
    assert lines[0] == HEADER
    steps, summary = lines[1:-1], lines[-1]
    assert [line["step"] for line in steps] == list(range(1, 41))  # counted from 1, as the console does
    assert all("loss" in line and line["loss"] > 0 for line in steps)
    first, last = steps[0]["loss"], min(line["loss"] for line in steps[-5:])
    assert first > 5.5, "byte-level start should be near ln(512) = 6.24"
    assert last < first - 2.0, f"loss did not fall: {first:.3f} -> {last:.3f}"
    assert summary["summary"] is True and summary["steps"] == 40
    for key in ("tokens_per_s", "mfu", "peak_memory_bytes", "step_time_s", "peak_host_rss_bytes"):
        assert key in summary
    assert summary["tokens_per_s"] > 0 and summary["mfu"] is None  # CPU: no GPU peak, no guess
    assert "step time" in out and "measured" in out


def test_train_from_a_saved_plan(tmp_path):
    plan = tmp_path / "plan.json"
    code = main(["plan", "--model", "tiny", "--cluster", "dgx-h100", "--gpus", "2", "--global-batch", "8",
                 "--seq-len", "64", "--fix", "pp=2", "--fix", "ckpt=none", "--no-offload", "--save", str(plan)])
    assert code == 0 and plan.is_file()
    log = tmp_path / "run.jsonl"  # in-process, as above
    code = main(["train", "--plan", str(plan), "--nproc-per-node", "2", "--steps", "2", "--device", "cpu",
                 "--log", str(log)])
    assert code == 0
    summary = read_jsonl(log)[-1]
    assert summary["layout"].startswith("dp=1,tp=1,pp=2")


def test_failing_rank_stops_the_others_and_is_named(tmp_path):
    proc = plait("train", "--model", "tiny", "--layout", "dp=2", "--global-batch", "4", "--seq-len", "32",
                 "--nproc-per-node", "2", "--steps", "3", "--device", "cpu", env={"PLAIT_INJECT_FAULT": "rank=1,step=1"}, timeout=120)
    assert proc.returncode == 2
    assert "training failed on rank 1: injected fault" in proc.stderr


def test_nan_loss_stops_at_that_step(tmp_path):
    proc = plait("train", "--model", "tiny", "--global-batch", "4", "--seq-len", "32", "--steps", "6",
                 "--lr", "1e6", "--grad-clip", "0", "--warmup-steps", "1", "--device", "cpu", timeout=120)
    assert proc.returncode == 2
    assert re.search(r"(loss|gradient norm) is (nan|inf) at step \d+", proc.stderr), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr.split("plait: error:")[-1]


# ----------------------------------------------------------------- refused before launching
@pytest.mark.parametrize("args,expected", [
    (["--layout", "dp=4", "--nproc-per-node", "2"], "needs dp·tp·pp·cp = 4 processes"),
    (["--layout", "tp=3", "--nproc-per-node", "3"], "tp=3 does not divide n_heads=4"),
    (["--layout", "cp=2,pp=2", "--nproc-per-node", "4"], "context parallelism with pipeline parallelism"),
    (["--layout", "dp=2,opt_offload=1", "--nproc-per-node", "2"], "optimizer offload (opt_offload=1) is planned but not run yet"),
    (["--layout", "offload=disk:1", "--offload-dir", "{missing}"], "offload directory {missing} does not exist"),
    (["--layout", "dp=3", "--nproc-per-node", "3"], "not a multiple of dp·mbs"),
    (["--data", "{missing}/tokens.bin"], "token file {missing}/tokens.bin not found"),
])
def test_bad_train_input_is_one_clear_line(capsys, tmp_path, args, expected):
    missing = str(tmp_path / "missing")  # a path this test knows does not exist
    args, expected = [a.format(missing=missing) for a in args], expected.format(missing=missing)
    code, _, err = run_inline(capsys, "train", "--model", "tiny", "--global-batch", "8", "--seq-len", "32",
                              "--device", "cpu", "--dry-run", *args)
    assert code == 2, err
    assert expected in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_corrupt_token_file_is_refused(capsys, tmp_path, corpus):
    bad = tmp_path / "bad.tok"
    with open(corpus, "rb") as handle:
        data = bytearray(handle.read())
    data[200] ^= 0xFF  # flip a token byte: the checksum no longer matches
    bad.write_bytes(bytes(data))
    code, _, err = run_inline(capsys, "train", "--model", "tiny", "--global-batch", "8", "--seq-len", "32",
                              "--data", str(bad), "--dry-run")
    assert code == 2 and "checksum" in err.lower() and "Traceback" not in err


def test_plan_of_another_model_is_refused(capsys, tmp_path):
    plan = tmp_path / "plan.json"
    assert main(["plan", "--model", "tiny", "--gpus", "1", "--global-batch", "8", "--seq-len", "64",
                 "--save", str(plan)]) == 0
    capsys.readouterr()
    code, _, err = run_inline(capsys, "train", "--plan", str(plan), "--model", "tiny-gpt", "--dry-run")
    assert code == 2 and "is a plan for model tiny, not tiny-gpt" in err


def test_dry_run_prints_the_torchrun_command(capsys):
    code, out, _ = run_inline(capsys, "train", "--model", "tiny", "--layout", "dp=2,tp=2", "--global-batch", "8",
                              "--seq-len", "32", "--nproc-per-node", "4", "--device", "cpu", "--dry-run")
    assert code == 0
    note, command = out.split("\n", 1)
    # mbs left out: the largest micro-batch that fits in host memory (the per-rank batch 8/2), said so
    assert note.startswith("plait train: completed: mbs=4 — the largest micro-batch dividing the per-rank batch 4")
    assert command.startswith("torchrun --nproc-per-node=4 --max-restarts=0 --standalone --local-addr=127.0.0.1 -m plait.run.worker")
    config = json.loads(out.split("config.json:\n", 1)[1])
    assert config["job"]["layout"] == "dp=2,tp=2,pp=1,cp=1,mbs=4" and config["job"]["global_batch"] == 8


def test_given_mbs_is_kept(capsys):
    code, out, _ = run_inline(capsys, "train", "--model", "tiny", "--layout", "dp=2,tp=2,mbs=1", "--global-batch",
                              "8", "--seq-len", "32", "--nproc-per-node", "4", "--device", "cpu", "--dry-run")
    assert code == 0 and "completed: mbs" not in out
    assert json.loads(out.split("config.json:\n", 1)[1])["job"]["layout"] == "dp=2,tp=2,pp=1,cp=1,mbs=1"


def test_mbs_with_a_gpu_spec_is_the_planners(capsys):
    code, out, _ = run_inline(capsys, "train", "--model", "tiny", "--layout", "dp=2", "--global-batch", "8",
                              "--seq-len", "32", "--nproc-per-node", "2", "--device", "cpu", "--gpu", "h100-sxm",
                              "--dry-run")
    assert code == 0
    assert "completed: mbs=" in out and "the planner's fastest micro-batch that fits on h100-sxm" in out


def test_plan_without_process_count_uses_its_world_size(capsys, tmp_path):
    plan = tmp_path / "plan.json"
    assert main(["plan", "--model", "tiny", "--gpus", "2", "--global-batch", "8", "--seq-len", "64",
                 "--fix", "pp=2", "--no-offload", "--save", str(plan)]) == 0
    capsys.readouterr()
    code, out, err = run_inline(capsys, "train", "--plan", str(plan), "--device", "cpu", "--dry-run")
    assert code == 0, err
    assert out.startswith("torchrun --nproc-per-node=2 ")


def test_pipeline_needs_enough_micro_batches(capsys):
    code, _, err = run_inline(capsys, "train", "--model", "tiny", "--layout", "pp=2,mbs=8", "--global-batch", "8",
                              "--seq-len", "32", "--nproc-per-node", "2", "--device", "cpu", "--dry-run")
    assert code == 2 and "needs at least pp=2 micro-batches per step, got 1" in err


def test_multi_node_flags_become_torchrun_rendezvous(capsys):
    code, out, _ = run_inline(capsys, "train", "--model", "tiny", "--layout", "dp=4", "--global-batch", "8",
                              "--seq-len", "32", "--nproc-per-node", "2", "--nnodes", "2", "--rdzv-endpoint",
                              "node0:29400", "--rdzv-id", "job7", "--device", "cpu", "--dry-run")
    assert code == 0
    assert "--nnodes=2 --rdzv-backend=c10d --rdzv-endpoint=node0:29400 --rdzv-id=job7" in out


def test_data_prepare_bad_input(capsys, tmp_path):
    code, _, err = run_inline(capsys, "data", "prepare", str(tmp_path / "missing.txt"), "--out",
                              str(tmp_path / "out.tok"))
    assert code == 2 and "missing.txt" in err and not (tmp_path / "out.tok").exists()


def test_gpu_benchmark_script_runs_in_smoke_mode():
    """bench/train_gpu.py is only measured on a GPU; its code paths must still run here."""
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench", "train_gpu.py")
    proc = subprocess.run([sys.executable, script, "--smoke"], capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "no results written" in proc.stdout and "tokens/s" in proc.stdout
