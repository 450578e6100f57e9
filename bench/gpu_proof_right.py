"""The GPU proof's "right" step (bench/gpu_proof.py): plait's training steps on the GPU against the CPU.

Three runs of ``plait.run.trainer.run_training``, each on its own one-rank process group (gloo on
the CPU, NCCL on the GPU), same model, seed, data, batch and AdamW:

1. the reference: the CPU, fp32;
2. the GPU in fp32: plait's bf16 autocast switched off (``plait.run.step.compute_context`` patched
   to do nothing) and TF32 off, so that both sides compute in IEEE fp32 and differ only in the
   order of their sums. Weights come from the CPU generator on both sides: plait draws each weight
   from ``torch.Generator(device)`` (``plait.run.model._full_init``), and the CUDA generator
   draws other numbers than the CPU one for the same seed, so the GPU run draws on the CPU and
   copies (the RoPE tables too). Losses must agree within ``fp32_tolerances`` (derived below);
3. the GPU as plait trains by default: bf16 autocast, ``torch.compile`` of every block, and the
   fused (chunked) cross entropy (``loss=fused``); then fp8 (``precision=fp8``) when torchao is
   importable. Their losses are compared with the reference against a sanity bar (5% bf16, 10%
   fp8), not an arithmetic bound: bf16's and fp8's rounding bounds are too loose to test anything.

No hidden host sync: every step of runs 2 and 3 that plait's loop does not read on the host (all
but the first, the logging steps and the last; ``plait.run.pending``) runs with
``torch.cuda.set_sync_debug_mode("error")``, from its ``train_step`` call to the next one, so any
synchronizing CUDA call in the loop (``.item()``, ``.tolist()``, ``.cpu()``, a copy to pageable
memory, ``nonzero``, ``torch.cuda.synchronize``) raises. torch's sync debug mode does not cover
``cudaEventSynchronize``: plait's one-step-late wait for the stop flag's copy is such an event wait,
on purpose. On the CPU (``--dry-run``) the guard counts the steps it would cover and checks nothing.

The fp32 tolerance, from the arithmetic (u = 2^-24, fp32's unit roundoff):
  * a dot product of length K summed in another order differs by about sqrt(K)·u relative (the
    probabilistic rounding bound of Higham and Mary, 2019); through L residual blocks those errors
    add, forward and backward: rho = 2·L·sqrt(K)·u, K = max(hidden, ffn_hidden);
  * forward, same weights (step 1): each side's loss is off by at most rho·|loss| (the logits, and
    the cross entropy of them, carry relative error rho), so |dL| <= 2·rho·|L|;
  * each AdamW step then moves the weights apart. An update is lr·m/(sqrt(v)+eps), nearly
    lr·sign(g) for gradients well above the noise; it differs between the sides only where a
    gradient element is within its own rounding error of zero, |g_i| <= |dg_i|, and there by at
    most 2·lr. To first order that changes the loss by sum_i |g_i|·2·lr <= 2·lr·|dg|_1 <=
    2·lr·rho·|g|_1 <= 2·lr·rho·sqrt(N)·|g|_2 (N parameters, |g|_2 the gradient norm plait logs);
  * so at step k: tol_k = 2·rho·|L_k| + sum over the earlier steps s of 2·lr_s·rho·sqrt(N)·G_s,
    with L, G and lr the reference run's. For llama-125m (rho = 6.5e-5, sqrt(N) = 11,600, L about
    10.4) that is 1.3e-3 at step 1, growing by 2.2e-4·G per step at lr 1.5e-4 (about 1e-3 for a
    gradient norm of 5): below bf16's effect on the loss (about 1e-2), far below a wrong kernel's.
"""

from __future__ import annotations

import contextlib
import gc
import math
import tempfile

import torch
import torch.distributed as dist

FP32_UNIT_ROUNDOFF = 2.0**-24
BF16_BAR, FP8_BAR = 0.05, 0.10  # relative loss difference against the fp32 reference (sanity bars)


def settings(dry_run: bool) -> dict:
    """Model and batch of the step: llama-125m at 8 x 256 tokens; tiny at 8 x 64 in a dry run.
    fp32 runs use 2 micro-batches (gradient accumulation), the default-recipe runs one of 8
    sequences (2 chunks of the fused loss's 1024 tokens on the GPU)."""
    return {"model": "tiny" if dry_run else "llama-125m", "seq_len": 64 if dry_run else 256,
            "global_batch": 8, "steps": 3 if dry_run else 5, "fp32_mbs": 4, "recipe_mbs": 8}


def fp32_tolerances(spec, losses: list[float], grad_norms: list[float], lrs: list[float]) -> list[float]:
    """tol_k of the module docstring for each step of the reference run."""
    rho = 2 * spec.n_layers * math.sqrt(max(spec.hidden, spec.ffn_hidden)) * FP32_UNIT_ROUNDOFF
    sqrt_n = math.sqrt(spec.total_params())
    out, drift = [], 0.0
    for loss, grad_norm, lr in zip(losses, grad_norms, lrs):
        out.append(2 * rho * abs(loss) + drift)
        drift += 2 * lr * rho * sqrt_n * grad_norm
    return out


# ----------------------------------------------------------------------------- patches
@contextlib.contextmanager
def fp32_everywhere():
    """plait's bf16 autocast off (the GPU computes in fp32, as the CPU does) and TF32 off."""
    from plait.run import step as step_module

    original = step_module.compute_context
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    step_module.compute_context = lambda parts, device: contextlib.nullcontext()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        step_module.compute_context = original
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


@contextlib.contextmanager
def cpu_drawn_weights():
    """Every weight drawn by the CPU generator, and the RoPE tables computed on the CPU (the GPU's
    pow, sin and cos may differ in the last bit), then moved to the run's device."""
    from plait.run import model as model_module

    full_init, rope_tables = model_module._full_init, model_module.rope_tables

    def drawn_on_cpu(name, shape, spec, seed, device):
        return full_init(name, shape, spec, seed, torch.device("cpu")).to(device)

    def tables_on_cpu(head_dim, max_seq_len, device, *args, **kwargs):
        if str(device) == "meta":
            return rope_tables(head_dim, max_seq_len, device, *args, **kwargs)
        return tuple(t.to(device) for t in rope_tables(head_dim, max_seq_len, "cpu", *args, **kwargs))

    model_module._full_init, model_module.rope_tables = drawn_on_cpu, tables_on_cpu
    try:
        yield
    finally:
        model_module._full_init, model_module.rope_tables = full_init, rope_tables


@contextlib.contextmanager
def no_host_sync(device: torch.device):
    """Sync debug mode "error" on the loop's non-sync steps (module docstring); yields a dict whose
    "guarded" counts them."""
    from plait.run import trainer

    original = trainer.train_step
    count = {"guarded": 0}
    cuda = device.type == "cuda"

    def guarded(setup, step, ledger, stop=None, sync=True):
        if cuda:
            torch.cuda.set_sync_debug_mode(0 if sync else "error")
        count["guarded"] += 0 if sync else 1
        return original(setup, step, ledger, stop, sync)

    trainer.train_step = guarded
    try:
        yield count
    finally:
        trainer.train_step = original
        if cuda:
            torch.cuda.set_sync_debug_mode(0)


# ----------------------------------------------------------------------------- runs
def train(spec, layout: str, device: torch.device, *, compile_on: bool, backend: str = "inductor",
          dry_run: bool, guard: bool, job: dict | None = None) -> dict:
    """``run_training`` of this step's job (``job``: another step's ``settings``) on ``device`` in a
    fresh one-rank process group."""
    from plait.run.config import LogConfig, OptimConfig, RunConfig, RuntimeConfig, TrainJob
    from plait.run.optim import lr_at
    from plait.run.trainer import run_training
    from plait.spec.layout import Layout

    s = job or settings(dry_run)
    config = RunConfig(job=TrainJob(model=spec, layout=Layout.parse(layout), global_batch=s["global_batch"],
                                    seq_len=s["seq_len"], steps=s["steps"], seed=0),
                       optim=OptimConfig(warmup_steps=2),
                       runtime=RuntimeConfig(device=device.type, compile=compile_on, compile_backend=backend),
                       observe=LogConfig(log_every=1000))  # host reads: the first and the last step only
    problems = config.runtime_problems()
    if problems:
        raise RuntimeError("plait refuses the run: " + "; ".join(problems))
    from train_gpu import init_single_process_group  # bench/ is on the path (gpu_proof.py)

    with tempfile.TemporaryDirectory() as store_dir:
        init_single_process_group(device, store_dir)
        try:
            with no_host_sync(device) if guard else contextlib.nullcontext({"guarded": 0}) as count:
                result = run_training(config, device)
        finally:
            dist.destroy_process_group()
    records = result.records
    out = {"layout": layout, "device": str(device), "compile": bool(compile_on),
           "losses": [r.loss for r in records], "grad_norms": [r.grad_norm for r in records],
           "lrs": [lr_at(r.step, s["steps"], config.optim) for r in records],
           "step_times_s": [r.step_time_s for r in records], "guarded_steps": count["guarded"]}
    del result, records
    if compile_on:
        torch._dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def compare(reference: dict, other: dict, tolerances: list[float]) -> dict:
    diffs = [abs(a - b) for a, b in zip(reference["losses"], other["losses"])]
    finite = all(math.isfinite(x) for x in other["losses"])
    within = finite and len(diffs) == len(tolerances) and all(d <= t for d, t in zip(diffs, tolerances))
    return {"reference_losses": reference["losses"], "losses": other["losses"], "abs_diff": diffs,
            "tolerance": tolerances, "max_abs_diff": max(diffs) if diffs else None, "within": within}


def torchao_importable() -> str | None:
    """None when ``import torchao`` works, else why not (one line)."""
    try:
        import torchao  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure means no fp8 here
        return f"torchao is not importable ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
    return None


def _failed(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def _recover(device: torch.device) -> None:
    """After a run that raised: what it may have left (compiled graphs, cached GPU memory)."""
    if dist.is_initialized():
        dist.destroy_process_group()
    torch._dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.set_sync_debug_mode(0)
        torch.cuda.empty_cache()


def train_or_fail(record, check: str, spec, layout: str, device: torch.device, **options) -> dict | None:
    """``train(spec, layout, device, **options)``, or None after recording ``check`` as failed (its
    traceback to the log, the device recovered): a run's failure is its result, the next run still goes."""
    import traceback

    try:
        return train(spec, layout, device, **options)
    except Exception as exc:  # noqa: BLE001
        traceback.print_exc()
        _recover(device)
        record.check(check, "failed", f"{layout}: {_failed(exc)}")
        return None


def run_step(record, dry_run: bool) -> None:
    """The "right" step; ``record.check(name, status, detail, numbers)`` is called as each part ends.
    A run that raises fails its checks (its traceback goes to the log) and the next run still goes."""
    import traceback

    from plait.spec.models import get_model

    s = settings(dry_run)
    spec = get_model(s["model"])
    cuda = not dry_run
    if cuda and not torch.cuda.is_available():  # before the CPU reference's seconds
        raise RuntimeError("torch sees no GPU (use --dry-run on a CPU box)")
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    no_gpu = "no GPU (dry run: the loop ran, nothing was checked)"
    where = f"{spec.name} ({spec.total_params() / 1e6:.0f}M), {s['global_batch']} x {s['seq_len']} tokens, " \
            f"{s['steps']} steps"

    threads = torch.get_num_threads()
    with cpu_drawn_weights():
        reference = train(spec, f"dp=1,mbs={s['fp32_mbs']}", torch.device("cpu"), compile_on=False,
                          dry_run=dry_run, guard=False)  # without it nothing below can be judged: raises
        tolerances = fp32_tolerances(spec, reference["losses"], reference["grad_norms"], reference["lrs"])
        if dry_run:
            torch.set_num_threads(1)  # the "device" side: the CPU again, summing in another order
        try:
            with fp32_everywhere():
                fp32 = train(spec, f"dp=1,mbs={s['fp32_mbs']}", device, compile_on=False, dry_run=dry_run,
                             guard=True)
        except Exception as exc:  # noqa: BLE001 - e.g. a host sync caught by the sync debug mode
            traceback.print_exc()
            _recover(device)
            sync = "synchroniz" in str(exc)
            record.check("right: fp32 GPU vs CPU losses", "failed", f"{where}; the GPU run raised {_failed(exc)}")
            record.check("right: no host sync (fp32)", "failed" if sync or not cuda else "skipped",
                         _failed(exc) if sync else "not known: the run failed before")
            fp32 = None
        finally:
            torch.set_num_threads(threads)
        if fp32 is not None:
            result = compare(reference, fp32, tolerances)
            record.check("right: fp32 GPU vs CPU losses", "ok" if result["within"] else "failed",
                         f"{where}; max |dL| {result['max_abs_diff']:.3g} vs tolerance "
                         f"{min(tolerances):.3g}..{max(tolerances):.3g}" + (" (dry run: CPU vs CPU)" if dry_run
                                                                           else ""),
                         {**result, "steps_without_host_sync": fp32["guarded_steps"]})
            record.check("right: no host sync (fp32)", "ok" if cuda and fp32["guarded_steps"] else
                         ("failed" if cuda else "skipped"),
                         f"{fp32['guarded_steps']} steps under set_sync_debug_mode('error')" if cuda else no_gpu,
                         {"guarded_steps": fp32["guarded_steps"]})

        backend = "eager" if dry_run else "inductor"  # the CPU: dynamo only (no code generation, seconds less)
        recipes = [("bf16 + compile + fused loss", f"dp=1,mbs={s['recipe_mbs']},loss=fused", BF16_BAR),
                   ("fp8 + compile + fused loss", f"dp=1,mbs={s['recipe_mbs']},loss=fused,precision=fp8", FP8_BAR)]
        fp8_missing = torchao_importable()
        for name, layout, bar in recipes:
            if name.startswith("fp8") and fp8_missing:
                record.check(f"right: {name}", "skipped", fp8_missing, {})
                continue
            # dry run: fp8 without compile (dynamo tracing torchao's float8 tensors costs the test ~20 s)
            compiled = not (dry_run and name.startswith("fp8"))
            run = train_or_fail(record, f"right: {name}", spec, layout, device, compile_on=compiled, backend=backend,
                                dry_run=dry_run, guard=True)
            if run is None:
                continue
            result = compare(reference, run, [bar * abs(x) for x in reference["losses"]])
            mode = (f"CPU fp32, compile {'backend eager' if compiled else 'off'} (dry run)" if dry_run
                    else "bf16 autocast, inductor")
            record.check(f"right: {name}", "ok" if result["within"] else "failed",
                         f"{mode}; max |dL| vs fp32 CPU {result['max_abs_diff']:.3g} (bar {bar:.0%} of the loss); "
                         f"{run['guarded_steps']} steps under sync debug 'error'" + ("" if cuda else " (not checked)"),
                         {**result, "layout": layout, "steps_without_host_sync": run["guarded_steps"],
                          "step_times_s": run["step_times_s"]})
