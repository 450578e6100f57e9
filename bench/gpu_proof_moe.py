"""The GPU proof's "moe" step (bench/gpu_proof.py): plait's routed experts on one GPU (issue 33).

One GPU has no expert all-to-all (ep=1), so this step proves what runs on one device: the experts'
GEMMs and a mixture-of-experts model training with them. On the GPU plait runs the experts as one
``torch._grouped_mm`` per projection in bf16 (``plait.run.modules.experts.use_grouped_mm``) and, under
``precision=fp8``, torchao's fp8 grouped GEMM (``plait.run.parallel.float8.fp8_grouped_mm``); the CPU
tests can only run them on the CPU (torch's CPU grouped GEMM, no fp8). Token groups are not padded
(torchtitan pads them to 8 or 16 rows): uneven groups, an empty one and groups of 1 and 17 rows are
part of the check, so an alignment rule of the CUDA kernels shows up here as an error or a wrong
result.

1. **Grouped GEMM = per-expert GEMMs (bf16).** The experts (SwiGLU, ``MODEL``'s widths) on random rows,
   forward and backward, through ``torch._grouped_mm`` and through one GEMM per expert, in bf16.
   Both sum in fp32 and round the same operations to bf16 (u = 2^-8), so they differ only where an
   fp32 sum lands on the other side of a bf16 rounding boundary: at most one unit (u relative) in
   those elements of the gate/up products and of the outputs. Through the down projection W2 (f x h)
   such a difference grows at most by ||W2||_2 / (||W2||_F / sqrt(f)) ~ 1 + sqrt(f/h) (the edge of a
   random matrix's spectrum over its root-mean-square singular value), so the relative Frobenius
   difference of the outputs (and, by the same count, of the gradients) is at most
   u·(2 + sqrt(f/h)) + u = u·(3 + sqrt(f/h)): 1.6% at f = h. A wrong group boundary or expert
   gives a difference of order 1.
2. **fp8 grouped GEMM vs bf16 per-expert GEMMs.** The same experts with torchao's fp8 grouped GEMM
   (row-wise scales, e4m3: u8 = 2^-4) against the bf16 loop. Each GEMM quantizes both operands
   (2·u8 relative per product term at most); gate and up each carry that into the gated unit, the
   down projection adds its own: at most 6·u8 = 37.5% relative (Frobenius), typically a few percent;
   a wrong kernel again gives order 1. Skipped, naming the reason, where the fp8 grouped GEMM does
   not run (``plait.run.parallel.float8.experts_fp8_blocker``: no torchao, not Hopper).
3. **Training.** ``MODEL`` for a few steps on the CPU in fp32 (the reference, one GEMM per expert),
   then on the GPU in bf16 (grouped GEMM) and in fp8 (dense linears and experts in fp8), each within
   the "right" step's sanity bars of the reference's losses (5% bf16, 10% fp8; bench/gpu_proof_right.py:
   their rounding bounds are too loose to test more). Eager: the dropless experts' group sizes change
   every step, and compiling them is not what this step proves. No host-sync guard: the dropless
   dispatch reads its per-expert counts on the host, as Megatron-Core's does (the MoE sync the planner
   prices, ``plait.plan.moe.sync``).
4. **Measured vs predicted.** The median step time of the bf16 and fp8 runs (the first steps left out)
   against the planner's (``plait.plan.evaluate`` on the GPU preset, shipped defaults), recorded.

5. **The expert overlap's side stream.** ``moe_overlap`` chunked and shared against the plain
   all-to-all with two ep ranks as two processes on this GPU over gloo (``bench/gpu_proof_overlap.py``:
   what it proves and what needs two GPUs). It runs last, after the training runs (the numbers most
   wanted from this step), with what is left of the step's limit (``record.left_s()``): its wait
   ends before the step's SIGTERM and its two processes are ended whatever happens, so a hang there
   costs neither the training results nor the GPU of the next step.

Part 3's bf16 run takes the grouped GEMM since the experts cast their rows to autocast's dtype
(``plait.run.modules.experts.compute_dtype``); before that, autocast handed them fp32 rows and the
first run (2026-11-27) trained with one GEMM per expert.

A dry run (the CPU, ``tiny-moe``) runs parts 3 and 5 on the CPU and skips the GPU kernels.
"""

from __future__ import annotations

import math
import statistics
import traceback

import torch

import gpu_proof_overlap
from gpu_proof_right import (BF16_BAR, FP8_BAR, _failed, compare, cpu_drawn_weights, torchao_importable, train,
                             train_or_fail)

BF16_UNIT, FP8_UNIT = 2.0**-8, 2.0**-4
KERNEL_COUNTS = (300, 0, 17, 512, 64, 129, 1, 1025)  # rows per expert: uneven, empty, unaligned
MODEL = {"name": "moe-60m", "arch": "llama", "n_layers": 4, "hidden": 512, "ffn_hidden": 1536, "n_heads": 8,
         "n_kv_heads": 8, "vocab": 32000, "max_seq_len": 512, "tied_embeddings": False, "dropout": False,
         "moe": {"n_experts": 8, "top_k": 2, "expert_ffn": 512, "n_shared": 1, "first_dense": 0,
                 "aux_loss_coef": 0.01}}
WARMUP = 2  # steps left out of the measured median (allocator and cuBLAS warm-up)


def settings(dry_run: bool) -> dict:
    """The training job of part 3: ``MODEL`` at 8 x 256 tokens, 5 steps; tiny-moe at 8 x 64, 3 steps
    in a dry run."""
    return {"model": "tiny-moe" if dry_run else MODEL["name"], "seq_len": 64 if dry_run else 256,
            "global_batch": 8, "steps": 3 if dry_run else 5, "mbs": 8}


def model_spec(dry_run: bool):
    import json

    from plait.spec.model import ModelSpec
    from plait.spec.models import get_model

    return get_model("tiny-moe") if dry_run else ModelSpec.from_json(json.dumps(MODEL))


def grouped_bound(hidden: int, ffn: int) -> float:
    """Part 1's bound on the relative difference of grouped and per-expert bf16 GEMMs."""
    return BF16_UNIT * (3.0 + math.sqrt(ffn / hidden))


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b||_F / ||b||_F in fp32."""
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def expert_outputs(hidden: int, ffn: int, device: torch.device, mm=None, grouped: bool = True) -> list[torch.Tensor]:
    """Output, input gradient and the three weight gradients of the experts on ``KERNEL_COUNTS`` rows
    (seeded random bf16 inputs, weights at 1/sqrt(fan-in)), through ``mm``/``grouped`` as
    ``plait.run.modules.experts.expert_forward`` takes them."""
    from plait.run.modules.experts import expert_forward

    generator = torch.Generator().manual_seed(0)
    experts, rows = len(KERNEL_COUNTS), sum(KERNEL_COUNTS)

    def draw(*shape, scale=1.0):
        return (torch.randn(*shape, generator=generator) * scale).to(device, torch.bfloat16).requires_grad_()

    x = draw(rows, hidden)
    w1, w3 = draw(experts, hidden, ffn, scale=hidden**-0.5), draw(experts, hidden, ffn, scale=hidden**-0.5)
    w2 = draw(experts, ffn, hidden, scale=ffn**-0.5)
    out = expert_forward(x, list(KERNEL_COUNTS), w1, w3, w2, grouped=grouped, mm=mm)
    out.backward(torch.randn(out.shape, generator=generator).to(device, torch.bfloat16))
    return [out.detach(), x.grad, w1.grad, w3.grad, w2.grad]


def kernel_checks(record, device: torch.device, hidden: int, ffn: int, dry_run: bool) -> None:
    """Parts 1 and 2 (module docstring)."""
    names = ("output", "input grad", "w1 grad", "w3 grad", "w2 grad")
    if dry_run:
        for name in ("grouped GEMM = per-expert GEMMs (bf16)", "fp8 grouped GEMM vs bf16 per-expert GEMMs"):
            record.check(f"moe: {name}", "skipped", "no GPU (dry run)")
        return
    where = f"{len(KERNEL_COUNTS)} experts, h {hidden}, f {ffn}, rows per expert {list(KERNEL_COUNTS)}"
    reference = None
    try:
        reference = expert_outputs(hidden, ffn, device, grouped=False)
        grouped = expert_outputs(hidden, ffn, device, grouped=True)
        diffs = {name: relative(a, b) for name, a, b in zip(names, grouped, reference)}
        bound = grouped_bound(hidden, ffn)
        worst = max(diffs.values())
        record.check("moe: grouped GEMM = per-expert GEMMs (bf16)", "ok" if worst <= bound else "failed",
                     f"{where}: largest relative difference {worst:.3g} ({max(diffs, key=diffs.get)}) vs bound "
                     f"{bound:.3g}", {"relative_difference": diffs, "bound": bound})
    except Exception as exc:  # noqa: BLE001 - an alignment rule of the kernel is this check's failure
        traceback.print_exc()
        record.check("moe: grouped GEMM = per-expert GEMMs (bf16)", "failed", f"{where}: {_failed(exc)}")
    from plait.run.parallel.float8 import experts_fp8_blocker, fp8_grouped_mm

    why = torchao_importable() or experts_fp8_blocker(device, "fp8", hidden, ffn)
    if why or reference is None:
        record.check("moe: fp8 grouped GEMM vs bf16 per-expert GEMMs", "skipped",
                     why or "the bf16 reference failed")
        return
    try:
        fp8 = expert_outputs(hidden, ffn, device, mm=fp8_grouped_mm)
        diffs = {name: relative(a, b) for name, a, b in zip(names, fp8, reference)}
        worst, bound = max(diffs.values()), 6 * FP8_UNIT
        record.check("moe: fp8 grouped GEMM vs bf16 per-expert GEMMs", "ok" if worst <= bound else "failed",
                     f"{where}: largest relative difference {worst:.3g} ({max(diffs, key=diffs.get)}) vs bound "
                     f"{bound:.3g}", {"relative_difference": diffs, "bound": bound})
    except Exception as exc:  # noqa: BLE001
        traceback.print_exc()
        record.check("moe: fp8 grouped GEMM vs bf16 per-expert GEMMs", "failed", f"{where}: {_failed(exc)}")


def predicted_step(spec, gpu: str, job: dict, layout: str) -> tuple[float | None, str | None]:
    """The planner's step time of this run on one ``gpu`` (seconds), or (None, why not)."""
    from plait.spec.layout import JobSpec, Layout
    from train_gpu import predict  # bench/ is on the path (gpu_proof.py)

    plan, why = predict(spec, gpu, JobSpec(global_batch=job["global_batch"], seq_len=job["seq_len"]),
                        Layout.parse(layout), compile=False)  # the MoE runs train eager (run_step)
    return (plan.step.step_time, None) if plan is not None else (None, why)


def run_step(record, dry_run: bool, gpu: str) -> None:
    """The "moe" step; ``record.check(name, status, detail, numbers)`` as each part ends. Parts 1-4
    first, then part 5 in the time left (``record.left_s()``: None without a limit); an error of
    parts 3-4 (the CPU reference's) is raised after part 5 ran."""
    spec = model_spec(dry_run)
    cuda = not dry_run
    if cuda and not torch.cuda.is_available():
        raise RuntimeError("torch sees no GPU (use --dry-run on a CPU box)")
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    error = None
    try:
        kernel_checks(record, device, spec.hidden, spec.moe.expert_ffn, dry_run)
        train_checks(record, spec, device, dry_run, gpu)
    except Exception as exc:  # noqa: BLE001 - the side-stream check does not need them; raised below
        error = exc
    if cuda:
        torch.cuda.empty_cache()  # the two ranks' CUDA contexts and tensors share this GPU
    gpu_proof_overlap.check(record, cuda, record.left_s())  # part 5: 2 ranks on this GPU, in the time left
    if error is not None:
        raise error


def train_checks(record, spec, device: torch.device, dry_run: bool, gpu: str) -> None:
    """Parts 3 and 4 (module docstring); raises when the CPU fp32 reference does not train."""
    moe = spec.moe
    job = settings(dry_run)
    where = (f"{spec.name} ({spec.total_params() / 1e6:.0f}M, {moe.n_experts} experts top-{moe.top_k}), "
             f"{job['global_batch']} x {job['seq_len']} tokens, {job['steps']} steps, eager")
    with cpu_drawn_weights():
        reference = train(spec, f"dp=1,mbs={job['mbs']}", torch.device("cpu"), compile_on=False, dry_run=dry_run,
                          guard=False, job=job)  # without it nothing below can be judged: raises
        for name, layout, bar in (("bf16", f"dp=1,mbs={job['mbs']}", BF16_BAR),
                                  ("fp8", f"dp=1,mbs={job['mbs']},precision=fp8", FP8_BAR)):
            missing = torchao_importable() if name == "fp8" else None
            if missing:
                record.check(f"moe: train {name}", "skipped", missing)
                continue
            run = train_or_fail(record, f"moe: train {name}", spec, layout, device, compile_on=False,
                                dry_run=dry_run, guard=False, job=job)
            if run is None:
                continue
            result = compare(reference, run, [bar * abs(x) for x in reference["losses"]])
            measured = statistics.median(run["step_times_s"][WARMUP:] or run["step_times_s"])
            predicted, why = (None, "dry run: the CPU has no GPU preset") if dry_run else \
                predicted_step(spec, gpu, job, layout)
            timing = (f"; step {measured * 1e3:.1f} ms measured, {predicted * 1e3:.1f} ms predicted "
                      f"({100 * (predicted / measured - 1):+.0f}%)" if predicted else f"; step {measured * 1e3:.1f} ms "
                      f"measured, no prediction ({why})")
            mode = "CPU fp32 (dry run)" if dry_run else f"GPU {name}"
            record.check(f"moe: train {name}", "ok" if result["within"] else "failed",
                         f"{where}, {mode}: max |dL| vs fp32 CPU {result['max_abs_diff']:.3g} (bar {bar:.0%} of the "
                         f"loss){timing}",
                         {**result, "layout": layout, "step_times_s": run["step_times_s"],
                          "measured_step_s": measured, "predicted_step_s": predicted})
