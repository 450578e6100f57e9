"""Activation offload (cpu, disk) and recomputation policies leave training unchanged; offloaded
bytes equal the planner's; a bad offload directory or a full disk stops the run with its reason.

Training cases: the tiny model (4 layers), 2 AdamW steps on 4 × 32 tokens in fp32, one process
(a one-rank gloo group in this process) and one pp=2 case on two DistPool ranks. One process: bit
for bit the plain single-process run with the same attention kernel - offload only copies bytes and
recomputation reruns the same CPU kernels on the same inputs, so nothing rounds differently on any
CPU (eager and SDPA attention do round differently: 3.6e-6 on an AMD EPYC, hence one reference per
kernel). Several ranks sum in another order: the bounds of tests/support/tolerances.py (seen 1.1e-6
with TP). Any real bug (a wrong tensor restored, a stale prefetch, a missed recompute) changes them
by far more.
"""

from __future__ import annotations

import dataclasses
import errno
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import offload_tasks
import tolerances
from activation_count import measure_layer, measure_offloaded_layer
from test_memory_truth import GPT_NO_DROPOUT, LLAMA, MBS, SEQ, comparison

from plait.errors import PlaitError
from plait.plan.activations import (
    offloadable_items,
    offloaded_layer_count,
    stage_layer_bytes,
)
from plait.run.memory import offload_dir as offload_dir_module
from plait.run.memory.offload import ActivationOffloader
from plait.spec.layout import Layout

RUN = {"steps": 2, "global_batch": 4}
RTOL = tolerances.LOSS_RTOL  # several ranks sum in another order (tests/support/tolerances.py)
ATOL = tolerances.param_atol(RUN["steps"])

SINGLE = [
    "ckpt=selective", "ckpt=balanced", "ckpt=full", "ckpt=balanced:2", "attn=eager,ckpt=balanced",
    "offload=cpu:1", "offload=disk:1", "ckpt=selective,offload=cpu:0.5", "ckpt=full:2,offload=disk:0.75",
    "ckpt=balanced,offload=cpu:1", "ckpt=mlp:2", "ckpt=mlp,offload=cpu:1",
]


@pytest.fixture(scope="module")
def reference():
    return offload_tasks.one_process("dp=1", **RUN)


@pytest.fixture(scope="module")
def references(reference):
    """The plain one-process run for each attention kernel (eager and SDPA round differently)."""
    runs = {"flash": reference}

    def get(attn: str) -> dict:
        if attn not in runs:
            runs[attn] = offload_tasks.one_process(f"dp=1,attn={attn}", **RUN)
        return runs[attn]

    return get


def assert_identical(result: dict, ref: dict, layout: str) -> None:
    """Bit for bit: the same kernels run on the same inputs in the same order (recompute reruns them,
    offload copies bytes), so no rounding differs on any CPU."""
    assert result["losses"] == ref["losses"] and result["grad_norms"] == ref["grad_norms"], layout
    differ = [n for n, v in ref["params"].items() if not torch.equal(result["params"][n], v)]
    assert not differ, f"{layout}: parameters {differ} differ"


def assert_same(result: dict, ref: dict, layout: str, rtol: float = RTOL, atol: float = ATOL) -> None:
    for key in ("losses", "grad_norms"):
        for step, (got, want) in enumerate(zip(result[key], ref[key], strict=True)):
            assert abs(got - want) <= rtol * abs(want), f"{layout}: step {step} {key} {got} vs {want}"
    worst = max((float((result["params"][n] - v).abs().max()), n) for n, v in ref["params"].items())
    assert worst[0] <= atol, f"{layout}: parameter {worst[1]} differs by {worst[0]:.3g}"


@pytest.mark.parametrize("layout", SINGLE)
def test_policy_and_offload_leave_training_unchanged(layout, references, tmp_path):
    lay = Layout.parse(layout)
    result = offload_tasks.one_process(layout, offload_dir=str(tmp_path), **RUN)
    assert_identical(result, references(lay.attn), layout)
    expected = [str(i) for i in range(offloaded_layer_count(lay, 4))]
    assert result["offloaded"] == expected
    if lay.offload:
        moved = [step["offload_bytes_out"] for step in result["offload"]]
        assert all(m > 0 for m in moved) and moved[0] == moved[1], moved
        assert [s["offload_bytes_in"] for s in result["offload"]] == moved  # everything came back
        assert result["summary"]["offload_bytes_per_step"] == moved[-1]
    assert list(tmp_path.iterdir()) == []  # disk offload removes its files and directory


def test_pipeline_stages_offload_by_their_share(dist_pool, reference):
    """pp=2 1F1B, α=0.75 of 2 layers per stage: stage 0 offloads 2, stage 1 (one micro-batch fewer
    in flight) 1 - 2·0.25/1 = 0.5 → 1 layer; training matches one process."""
    layout = "pp=2,offload=cpu:0.75"
    out = dist_pool(2).run(offload_tasks.train, layout, timeout=240, **RUN)
    assert [rank["offloaded"] for rank in out] == [["0", "1"], ["2"]]
    assert_same(out[0], reference, layout)


@pytest.mark.parametrize("layout", ["tp=2,offload=cpu:1,ckpt=selective:2", "dp=2,zero=3,offload=disk:0.5,ckpt=balanced"])
def test_two_ranks_with_offload_match_one_process(dist_pool, reference, layout, tmp_path):
    """DTensor activations (TP + SP) restored with their placements; FSDP2's unsharded parameters
    are never offloaded; disk offload and balanced recomputation under ZeRO-3."""
    out = dist_pool(2).run(offload_tasks.train, layout, offload_dir=str(tmp_path), timeout=240, **RUN)
    assert_same(out[0], reference, layout)
    assert all(rank["offload"][0]["offload_bytes_out"] > 0 for rank in out)


# ------------------------------------------------------------------ bytes against the planner
BYTES_CASES = [(spec, Layout(mbs=MBS, ckpt=policy, attn=attn))
               for spec in (LLAMA, GPT_NO_DROPOUT) for policy in ("none", "selective", "balanced", "mlp", "full")
               for attn in ("flash", "eager")]


@pytest.mark.parametrize("case", BYTES_CASES, ids=[f"{c[0].name}-{c[1].ckpt}-{c[1].attn}" for c in BYTES_CASES])
def test_offloaded_bytes_equal_planner(case):
    """One bf16 layer: what the offloader moves out (and back) equals the planner's offloadable
    items of that layer, after the CPU kernels' documented differences (tests/run/test_memory_truth.py)."""
    spec, layout = case
    expected, _, table = comparison(spec, layout, measure_layer(spec, layout, SEQ, MBS))
    want = sum(offloadable_items(expected, layout.ckpt).values())
    moved = measure_offloaded_layer(spec, layout, SEQ, MBS)
    assert moved["bytes_out"] == want, f"moved {moved} vs planner {want}\n{table}"
    assert moved["bytes_in"] == moved["bytes_out"]


def test_planner_offloads_whole_layers_stage_aware():
    lay = Layout(pp=4, offload=0.5)
    assert [offloaded_layer_count(lay, 8, s) for s in range(4)] == [4, 3, 0, 0]  # α_s = 1 - 4·0.5/(4-s)
    gpipe = dataclasses.replace(lay, schedule="gpipe")
    assert [offloaded_layer_count(gpipe, 8, s) for s in range(4)] == [4, 4, 4, 4]
    kept, moved = stage_layer_bytes(LLAMA, Layout(offload=0.5, ckpt="full", ckpt_layers=1), SEQ, 4)
    assert moved[0] == kept[0] < kept[1] == moved[1] and moved[2:] == (0.0, 0.0)


# ------------------------------------------------------------------ bad input
def disk_config(directory: str | None):
    return offload_tasks.make_config("offload=disk:1", offload_dir=directory, **RUN)


def test_offload_directory_missing(tmp_path):
    problems = disk_config(str(tmp_path / "nope")).runtime_problems()
    assert any("does not exist" in p and "--offload-dir" in p for p in problems), problems


def test_offload_directory_not_writable(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(offload_dir_module, "open", refuse, raising=False)
    problems = disk_config(str(tmp_path)).runtime_problems()
    assert any("is not writable (Permission denied)" in p for p in problems), problems


def test_offload_directory_full(tmp_path, monkeypatch):
    monkeypatch.setattr(offload_dir_module, "disk_free_bytes", lambda path: 1000)
    problems = disk_config(str(tmp_path)).runtime_problems()
    assert any("GiB free but the run offloads up to" in p for p in problems), problems
    assert disk_config(str(tmp_path)).runtime_problems() != [] and offload_tasks.make_config(
        "offload=cpu:1", **RUN).runtime_problems() == []  # host offload needs no directory


def test_disk_full_mid_run_stops_with_the_reason(tmp_path, monkeypatch):
    writes = []

    def write_file(self, path: Path, data) -> None:
        writes.append(path)
        if len(writes) > 3:  # the first files fit, then the disk is full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        Path(path).write_bytes(memoryview(data.numpy()))

    monkeypatch.setattr(ActivationOffloader, "write_file", write_file)
    with pytest.raises(PlaitError, match="activation offload to disk failed: No space left on device") as err:
        offload_tasks.one_process("offload=disk:1", offload_dir=str(tmp_path), **RUN)
    assert "offload=cpu" in str(err.value)
    assert list(tmp_path.iterdir()) == []  # the files written before are removed
    # the saved-tensor hooks were popped: autograd in this process saves tensors normally again
    x = torch.ones(3, requires_grad=True)
    (x * x).sum().backward()
    assert torch.equal(x.grad, 2 * torch.ones(3))


def test_gpu_bench_smoke_mode(capsys):
    """bench/offload_gpu.py --smoke runs its code paths on the CPU (tiny model, seq 64)."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "bench" / "offload_gpu.py"
    spec = importlib.util.spec_from_file_location("offload_gpu", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--smoke", "--policies", "ckpt=none;ckpt=none,offload=cpu:1"]) == 0
    out = capsys.readouterr().out
    assert "| 64 | ckpt=none,offload=cpu:1 |" in out and "| 64 | ckpt=none |" in out
