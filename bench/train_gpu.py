"""Benchmark (issue 3): train a ~1B Llama on one GPU with plait and with plain Hugging Face.

One process, one GPU, bf16, FlashAttention through SDPA, ``torch.compile`` on every block.
The same model, batch and number of steps are trained twice in the same run:

  * plait: ``plait.run.trainer.run_training`` with layout ``dp=1,mbs=M`` on a one-rank process
    group that this script initializes itself (NCCL, file store);
  * baseline: ``transformers.LlamaForCausalLM`` built from the same shapes, bf16 weights,
    ``attn_implementation="sdpa"``, ``torch.optim.AdamW`` (fused when available), gradient
    accumulation over the same micro-batches and no compile: what a user would write.

Both are measured the same way: wall time of every optimizer step (``torch.cuda.synchronize``
at its end), the median over the steps after ``--warmup-steps``, tokens/s = global batch x
sequence / median step time, MFU with plait's one definition (``plait.run.metrics.mfu``:
``ModelSpec.model_flops_per_token`` x tokens/s / dense bf16 peak of the ``--gpu`` spec), peak
memory from ``torch.cuda.max_memory_allocated``. They are compared with the planner's
prediction (``plait.plan.plan.evaluate`` on a one-GPU cluster of the same GPU) for the same
model, layout and job. Targets: plait MFU >= 55%, plait tokens/s >= 1.3x the baseline's,
plait peak memory within 10% of the prediction.

Memory is compared two ways (both are printed; the target uses the first):
  * device: ``max_memory_reserved`` + what the process holds outside PyTorch's allocator (CUDA
    context, NCCL buffers, kernel images; measured with ``cudaMemGetInfo`` at the end of the
    run) against the plan's total, which counts the same things;
  * allocated: ``max_memory_allocated`` against the plan's total less its CUDA-context,
    NCCL-buffer and fragmentation items.

Run on the GPU box (one command; it appends a dated section to bench/results/train_gpu.md and
a record to bench/results/train_gpu.json):

    python bench/train_gpu.py --gpu h100-sxm        # or --gpu h200

``--gpu`` may be left out only on a GPU whose name maps explicitly to a spec ("H100 ... HBM3"
or "H100 ... SXM" -> h100-sxm, "H200" -> h200; never PCIe/NVL/GH200 parts, whose peaks
differ). Other options: ``--seq 4096 --mbs 4 --grad-accum 2 --steps 30 --warmup-steps 5``,
``--vocab 32000`` (128256 for the Llama-3 tokenizer), ``--model PRESET`` instead of the default
untied 1.1B Llama, ``--ckpt full``, ``--offload cpu:1`` (plait without compile), ``--precision fp8``
(torchao), ``--no-baseline``, ``--no-compile``, ``--out DIR``.

Smoke test without a GPU (tiny model, sequence 64, 2 steps, CPU, no compile, no MFU; writes
nothing unless ``--out DIR`` is given):

    python bench/train_gpu.py --smoke

The baseline needs ``transformers`` (it is skipped, with the reason printed and recorded, when
it cannot be imported). For a box without internet, fetch the wheels on a machine with it and
install them there from the folder (match the box's Python version; torch is not needed):

    pip download transformers -d wheels/ --only-binary=:all: --python-version 3.11 \
        --platform manylinux2014_x86_64      # transformers and its dependencies
    pip download transformers --no-deps -d wheels/   # or only transformers, when the box
                                                       # already has its dependencies
    # on the box:
    pip install --no-index --find-links wheels/ transformers

plait's runtime trains in bf16 mixed precision on GPU: without FSDP it runs forward and loss
under ``torch.autocast("cuda", torch.bfloat16)`` (fp32 master weights, gradients and AdamW
states: the planner's 16 bytes per parameter; bf16 matmuls and attention), with FSDP through
its ``MixedPrecisionPolicy``. This script runs it as ``plait train`` does.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

try:
    import plait  # noqa: F401
except ImportError:  # running from a checkout that is not pip-installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from plait.errors import PlaitError
from plait.plan.plan import Plan, evaluate
from plait.run.config import OptimConfig, Prediction, RunConfig, RuntimeConfig, TrainJob
from plait.run.data.tokens import open_tokens
from plait.run.metrics import StepRecord, mfu
from plait.run.optim import lr_at
from plait.run.trainer import run_training
from plait.spec.hardware import GPUS, cluster_for_gpu, get_gpu
from plait.spec.layout import JobSpec, Layout
from plait.spec.model import ModelSpec
from plait.spec.models import MODELS, get_model

RESULTS = Path(__file__).resolve().parent / "results"
MD_NAME, JSON_NAME = "train_gpu.md", "train_gpu.json"
PLACEHOLDER_MARK = "<!-- train_gpu: not run yet -->"
GIB = 2**30
DEFAULT_MODEL = "llama-1b-untied"
TARGET_MFU = 0.55
TARGET_SPEEDUP = 1.3
TARGET_MEMORY = 0.10
TARGET_GPUS = ("h100-sxm", "h200")


# ----------------------------------------------------------------------------- setup
def model_spec(name: str, vocab: int, seq_len: int) -> ModelSpec:
    """The default untied ~1B Llama (Llama-3.2-1B shapes, untied head), or a preset by name."""
    if name == DEFAULT_MODEL:
        return ModelSpec(name=f"{DEFAULT_MODEL}-v{vocab}", arch="llama", n_layers=16, hidden=2048,
                         ffn_hidden=8192, n_heads=32, n_kv_heads=8, vocab=vocab,
                         max_seq_len=max(8192, seq_len), tied_embeddings=False)
    return get_model(name)


def gpu_from_device_name(device_name: str) -> str | None:
    """An explicit mapping of CUDA device names to GPU specs; None when not sure."""
    upper = device_name.upper()
    if "NVL" in upper or "PCIE" in upper:
        return None  # lower-clocked parts: a wrong (higher) peak would understate MFU's meaning
    if re.search(r"\bH200\b", upper):
        return "h200"
    if re.search(r"\bH100\b", upper) and ("HBM3" in upper or "SXM" in upper):
        return "h100-sxm"
    return None


def init_single_process_group(device: torch.device, store_dir: str) -> None:
    """A one-rank process group (NCCL on GPU, gloo on CPU) over a file store."""
    store = dist.FileStore(os.path.join(store_dir, "store"), 1)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=device)
    else:
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)


def predict(spec: ModelSpec, gpu: str, job: JobSpec, layout: Layout,
            compile: bool | None) -> tuple[Plan | None, str | None]:
    """The planner's plan for this run on one ``gpu`` with plait's ``compile`` setting (its blocks
    priced compiled or eager as they run), or (None, why not)."""
    from plait.plan.compiled import with_compile
    from plait.plan.params import DEFAULT_PARAMS

    try:
        params = with_compile(DEFAULT_PARAMS, None, compile, "cuda")
        return evaluate(spec, cluster_for_gpu(gpu, 1), job, layout, params, compile=compile), None
    except PlaitError as exc:
        return None, str(exc)


def steady(records_times: list[float], warmup: int) -> float:
    """Median step time after the first ``warmup`` steps (all steps if there are no others)."""
    rest = records_times[warmup:] or records_times
    return statistics.median(rest)


def device_overhead(device: torch.device) -> int:
    """Bytes this process holds on the GPU outside PyTorch's caching allocator (right now)."""
    free, total = torch.cuda.mem_get_info(device)
    return max(0, (total - free) - torch.cuda.memory_reserved(device))


# ----------------------------------------------------------------------------- plait
def run_plait(config: RunConfig, device: torch.device, warmup: int) -> dict:
    problems = config.runtime_problems()
    if problems:
        raise PlaitError("plait cannot run this configuration: " + "; ".join(problems))
    job, compiled = config.job, config.runtime.compile
    print(f"\n== plait: {job.model.name}, layout {job.layout}, global batch {job.global_batch} x "
          f"{job.seq_len}, compile={compiled}", flush=True)
    result = run_training(config, device)
    records: list[StepRecord] = result.records
    out = {"step_times_s": [r.step_time_s for r in records], "losses": [r.loss for r in records],
           "autocast_bf16": device.type == "cuda", "compile": compiled,
           "param_dtype": str(next(iter(result.parts.parameters())).dtype).replace("torch.", "")}
    out["step_time_s"] = steady(out["step_times_s"], warmup)
    out["tokens_per_s"] = job.tokens_per_step / out["step_time_s"]
    out["final_loss"] = records[-1].loss
    if device.type == "cuda":
        out["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        out["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
        out["outside_allocator_bytes"] = device_overhead(device)
        out["peak_device_bytes"] = out["peak_reserved_bytes"] + out["outside_allocator_bytes"]
    out["summary"] = result.summary.to_dict()
    del result, records
    return out


def free_cuda(device: torch.device, compiled: bool) -> None:
    if compiled:
        torch._dynamo.reset()  # drop compiled graphs (and anything they hold) before the baseline
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- baseline
def build_hf_model(spec: ModelSpec, device: torch.device):
    """LlamaForCausalLM of the same shapes, bf16 weights, SDPA attention (or a reason to skip)."""
    try:
        import transformers
        from transformers import AutoModelForCausalLM, LlamaConfig
    except ImportError as exc:
        return None, None, (f"transformers is not importable ({exc}); install it to get the baseline "
                            "(see this script's docstring for an offline wheel)")
    if spec.arch != "llama":
        return None, None, f"the baseline is a Llama and model {spec.name} is {spec.arch}"
    hf_config = LlamaConfig(
        vocab_size=spec.vocab, hidden_size=spec.hidden, intermediate_size=spec.ffn_hidden,
        num_hidden_layers=spec.n_layers, num_attention_heads=spec.n_heads,
        num_key_value_heads=spec.n_kv_heads, max_position_embeddings=spec.max_seq_len,
        tie_word_embeddings=spec.tied_embeddings, rms_norm_eps=1e-5, use_cache=False,
    )
    with torch.device(device):
        try:  # transformers >= 4.56 calls it dtype; older ones torch_dtype
            model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.bfloat16, attn_implementation="sdpa")
        except TypeError:
            model = AutoModelForCausalLM.from_config(hf_config, torch_dtype=torch.bfloat16,
                                                     attn_implementation="sdpa")
    model = model.to(device=device, dtype=torch.bfloat16)
    info = {"transformers": transformers.__version__, "class": type(model).__name__,
            "attn_implementation": getattr(model.config, "_attn_implementation", None),
            "params": sum(p.numel() for p in model.parameters())}
    return model, info, None


def run_baseline(spec: ModelSpec, config: RunConfig, device: torch.device, warmup: int) -> dict:
    """The plain loop a user would write; measured like plait's (see the module docstring)."""
    model, info, skipped = build_hf_model(spec, device)
    if skipped:
        return {"skipped": skipped}
    if info["params"] != spec.total_params():
        print(f"warning: the baseline has {info['params']:,} parameters, plait's model {spec.total_params():,}")
    if info["attn_implementation"] != "sdpa":
        print(f"warning: the baseline's attention is {info['attn_implementation']!r}, not sdpa")
    optim: OptimConfig = config.optim
    job = config.job
    kwargs = {"lr": optim.lr, "betas": (optim.beta1, optim.beta2), "eps": optim.eps,
              "weight_decay": optim.weight_decay}
    try:
        optimizer = torch.optim.AdamW(model.parameters(), fused=True, **kwargs)
        info["fused_adamw"] = True
    except (RuntimeError, TypeError) as exc:
        print(f"note: fused AdamW unavailable here ({exc}); using the default implementation")
        optimizer = torch.optim.AdamW(model.parameters(), **kwargs)
        info["fused_adamw"] = False
    source = open_tokens(job.data, spec.vocab, job.seed)
    n_micro = job.layout.micro_batches(job.global_batch)
    gb, seq = job.global_batch, job.seq_len
    print(f"\n== baseline: transformers {info['transformers']} {info['class']} "
          f"({info['params'] / 1e9:.2f}B params, bf16, attn={info['attn_implementation']}, "
          f"fused AdamW={info['fused_adamw']}), {n_micro} micro-batches of {job.layout.mbs}", flush=True)
    start_allocated = 0
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start_allocated = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    model.train()
    times, losses = [], []
    for step in range(job.steps):
        start = time.perf_counter()
        rows = source.batch(step, range(gb), seq, gb)
        tokens = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64)).to(device)
        inputs, labels = tokens[:, :-1], tokens[:, 1:]
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, job.steps, optim)
        total = torch.zeros((), device=device)
        for x, y in zip(inputs.chunk(n_micro), labels.chunk(n_micro)):
            logits = model(input_ids=x, use_cache=False).logits
            loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten()) / n_micro
            loss.backward()
            total += loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), optim.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss_value = float(total)  # the user's logging line (a host sync, as plait's loss is)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - start
        times.append(elapsed)
        losses.append(loss_value)
        print(f"baseline step {step + 1}/{job.steps} loss {loss_value:.4f} | "
              f"{job.tokens_per_step / elapsed:,.0f} tok/s | {elapsed * 1e3:.0f} ms", flush=True)
    out = {"step_times_s": times, "losses": losses, **info}
    out["step_time_s"] = steady(times, warmup)
    out["tokens_per_s"] = job.tokens_per_step / out["step_time_s"]
    out["final_loss"] = losses[-1]
    if device.type == "cuda":
        out["residual_allocated_bytes"] = start_allocated  # left over from the plait run; subtracted
        out["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device) - start_allocated
        out["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
        out["outside_allocator_bytes"] = device_overhead(device)
        out["peak_device_bytes"] = out["peak_reserved_bytes"] + out["outside_allocator_bytes"]
    del model, optimizer
    return out


# ----------------------------------------------------------------------------- report
def _gib(value) -> str:
    return f"{value / GIB:.2f}" if value is not None else "-"


def _pct(value) -> str:
    return f"{100 * value:.1f}%" if value is not None else "-"


def _rate(value) -> str:
    return f"{value:,.0f}" if value is not None else "-"


def compare(run: dict) -> tuple[list[tuple], list[tuple]]:
    """(measurement rows, target rows) of a run record."""
    plait_r, base, pred = run["plait"], run["baseline"], run["prediction"] or {}
    has_base = "skipped" not in base
    b = base if has_base else {}
    skip_text = "baseline skipped" if not has_base else None
    rows = [
        ("step time, s (median)", f"{plait_r['step_time_s']:.3f}", f"{b['step_time_s']:.3f}" if has_base else "-",
         f"{pred['step_time_s']:.3f}" if pred else "-"),
        ("tokens/s", _rate(plait_r["tokens_per_s"]), _rate(b.get("tokens_per_s")), _rate(pred.get("tokens_per_s"))),
        ("MFU", _pct(plait_r.get("mfu")), _pct(b.get("mfu")), _pct(pred.get("mfu"))),
        ("peak memory, device GiB", _gib(plait_r.get("peak_device_bytes")), _gib(b.get("peak_device_bytes")),
         _gib(pred.get("memory_bytes"))),
        ("peak memory, allocated GiB", _gib(plait_r.get("peak_allocated_bytes")),
         _gib(b.get("peak_allocated_bytes")), _gib(pred.get("allocator_bytes"))),
        ("device memory vs prediction", _pct(run.get("memory_ratio")), _pct(run.get("baseline_memory_ratio")), "-"),
        ("allocated vs prediction", _pct(run.get("allocated_ratio")), "-", "-"),
        ("final loss", f"{plait_r['final_loss']:.4f}", f"{b['final_loss']:.4f}" if has_base else "-", "-"),
    ]
    targets = run["targets"]
    target_rows = [
        (f"MFU >= {TARGET_MFU:.0%}", _pct(plait_r.get("mfu")), targets["mfu"]),
        (f"tokens/s >= {TARGET_SPEEDUP}x baseline",
         f"{run['speedup']:.2f}x" if run.get("speedup") else (skip_text or "-"), targets["speedup"]),
        (f"device memory within {TARGET_MEMORY:.0%} of prediction", _pct(run.get("memory_ratio")), targets["memory"]),
    ]
    return rows, target_rows


def judge(run: dict, on_gpu: bool) -> None:
    """Fill in ratios and pass/fail verdicts."""
    plait_r, base, pred = run["plait"], run["baseline"], run["prediction"]
    targets = {}
    if "skipped" not in base:
        run["speedup"] = plait_r["tokens_per_s"] / base["tokens_per_s"]
    if pred and plait_r.get("peak_device_bytes"):
        run["memory_ratio"] = plait_r["peak_device_bytes"] / pred["memory_bytes"]
        run["allocated_ratio"] = plait_r["peak_allocated_bytes"] / pred["allocator_bytes"]
        if base.get("peak_device_bytes"):
            run["baseline_memory_ratio"] = base["peak_device_bytes"] / pred["memory_bytes"]
    if not on_gpu:
        why = "n/a (CPU smoke run)"
        run["targets"] = {"mfu": why, "speedup": why, "memory": why}
        return
    value = plait_r.get("mfu")
    if value is None:
        targets["mfu"] = "n/a (no GPU peak)"
    elif value > 1.0:
        targets["mfu"] = "INVALID (MFU > 100%: --gpu names a slower GPU than this one)"
    else:
        targets["mfu"] = "PASS" if value >= TARGET_MFU else "FAIL"
    if run.get("speedup") is None:
        targets["speedup"] = "n/a (baseline skipped)"
    else:
        targets["speedup"] = "PASS" if run["speedup"] >= TARGET_SPEEDUP else "FAIL"
    if run.get("memory_ratio") is None:
        targets["memory"] = "n/a (no prediction)"
    else:
        targets["memory"] = "PASS" if abs(run["memory_ratio"] - 1.0) <= TARGET_MEMORY else "FAIL"
    if run["gpu"] not in TARGET_GPUS:
        targets = {k: f"{v} (targets are set for H100/H200)" for k, v in targets.items()}
    run["targets"] = targets


def columns(run: dict) -> tuple[str, ...]:
    gpu = (run["prediction"] or {}).get("gpu")
    return ("metric", "plait", "HF baseline", f"plait plan, 1x {gpu}" if gpu else "plait plan")


def print_tables(run: dict) -> None:
    rows, target_rows = compare(run)
    title = f"{run['model']['name']} on {run['machine']['device']} - layout {run['layout']}, " \
            f"batch {run['global_batch']} x {run['seq_len']}, {run['steps']} steps (first {run['warmup_steps']} excluded)"
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(title)
        print(markdown_table(columns(run), rows))
        print(markdown_table(("target", "measured", "result"), target_rows))
        return
    console = Console() if sys.stdout.isatty() else Console(width=140)
    table = Table(title=title, title_justify="left")
    for column in columns(run):
        table.add_column(column, justify="left" if column == "metric" else "right")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    targets = Table(title="targets", title_justify="left")
    for column in ("target", "measured", "result"):
        targets.add_column(column)
    for row in target_rows:
        style = "green" if row[2].startswith("PASS") else "red" if row[2].startswith(("FAIL", "INVALID")) else None
        targets.add_row(*row, style=style)
    console.print(targets)


def markdown_table(header: tuple, rows: list[tuple]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def markdown_section(run: dict) -> str:
    machine = run["machine"]
    rows, target_rows = compare(run)
    base = run["baseline"]
    plait_r = run["plait"]
    heading = (f"## {run['date']} - {machine['device']} ({run['gpu']}), torch {machine['torch']}, "
               f"CUDA {machine['cuda']}")
    if "skipped" in base:
        baseline_text = f"skipped ({base['skipped']})."
    else:
        baseline_text = (f"transformers {base['transformers']}, bf16 weights, attn={base['attn_implementation']}, "
                         f"fused AdamW={base['fused_adamw']}, no compile.")
    setup = (f"Model {run['model']['name']} ({run['model']['params'] / 1e9:.2f}B parameters, vocab "
             f"{run['model']['vocab']}), layout `{run['layout']}`, global batch {run['global_batch']} x "
             f"{run['seq_len']} tokens ({run['micro_batches']} micro-batches), {run['steps']} steps, median "
             f"over steps {run['warmup_steps'] + 1}-{run['steps']}. plait: compile={plait_r['compile']}, "
             f"autocast bf16={plait_r['autocast_bf16']}, parameters {plait_r['param_dtype']}. "
             f"Baseline: {baseline_text}")
    lines = [heading, "", f"Command: `{run['command']}`", "", setup, "",
             markdown_table(columns(run), rows), "",
             markdown_table(("target", "measured", "result"), target_rows), ""]
    if run.get("prediction_error"):
        lines += [f"No prediction: {run['prediction_error']}", ""]
    return "\n".join(lines)


def write_results(run: dict, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    md = out_dir / MD_NAME
    text = md.read_text() if md.exists() else ""
    if not text or PLACEHOLDER_MARK in text:
        text = ("# Single-GPU training: plait vs a Hugging Face baseline\n\n"
                f"`bench/train_gpu.py` (issue 3). Targets on H100/H200: plait MFU >= {TARGET_MFU:.0%}, "
                f">= {TARGET_SPEEDUP}x the baseline's tokens/s, peak memory within {TARGET_MEMORY:.0%} of the "
                "planner's prediction. Each run appends a dated section; newest at the bottom. "
                "Raw numbers: `train_gpu.json`.\n\n")
    md.write_text(text.rstrip("\n") + "\n\n" + markdown_section(run))
    js = out_dir / JSON_NAME
    runs = []
    if js.exists():
        try:
            runs = json.loads(js.read_text()).get("runs", [])
        except (ValueError, AttributeError):
            runs = []
    runs.append(run)
    js.write_text(json.dumps({"runs": runs}, indent=2) + "\n")
    print(f"\nwrote {md} and {js}")


# ----------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", choices=sorted(GPUS), help="GPU spec: the MFU peak and the prediction "
                        "(default: from the device name, only for H100 SXM/HBM3 and H200)")
    parser.add_argument("--model", default=DEFAULT_MODEL, choices=[DEFAULT_MODEL, *MODELS], metavar="NAME",
                        help="default: Llama-3.2-1B shapes with an untied head")
    parser.add_argument("--vocab", type=int, default=32000, help=f"vocabulary of {DEFAULT_MODEL}")
    parser.add_argument("--seq", type=int, default=4096, help="sequence length (tokens)")
    parser.add_argument("--mbs", type=int, default=4, help="micro-batch size (sequences)")
    parser.add_argument("--grad-accum", type=int, default=2, help="micro-batches per step")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup-steps", type=int, default=5, help="first steps left out of the medians")
    parser.add_argument("--ckpt", default="none", choices=["none", "selective", "full"])
    parser.add_argument("--offload", help="activation offload of plait's run, e.g. cpu:1 (plait trains it "
                        "without compile, which it refuses with offload; the baseline is unchanged)")
    parser.add_argument("--precision", default="bf16", choices=["bf16", "fp8", "mxfp8"],
                        help="plait's GEMM precision (fp8: torchao; the baseline stays bf16)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-compile", action="store_true", help="plait without torch.compile")
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--out", type=Path, help=f"results folder (default {RESULTS}; smoke: none)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny model on CPU, 2 steps: exercises the code paths, writes nothing without --out")
    args = parser.parse_args(argv)
    if args.smoke:
        args.model, args.seq, args.mbs, args.grad_accum = "tiny", 64, 2, 2
        args.steps, args.warmup_steps, args.no_compile = 2, 1, True
    if args.offload and not args.no_compile:
        print("note: --offload: plait runs without torch.compile (plait train refuses compile with offload)")
        args.no_compile = True
    if args.warmup_steps >= args.steps:
        parser.error(f"--warmup-steps {args.warmup_steps} leaves no step of {args.steps} to measure")
    return args


def machine_info(device: torch.device) -> dict:
    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
            "host": platform.machine(), "cpus": os.cpu_count()}
    info["device"] = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    return info


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.smoke:
        device = torch.device("cpu")
    elif not torch.cuda.is_available():
        print("error: torch sees no GPU; run with --smoke to exercise the script on CPU", file=sys.stderr)
        return 2
    else:
        device = torch.device("cuda", 0)
    gpu = args.gpu
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        inferred = gpu_from_device_name(name)
        if gpu is None and inferred is None:
            print(f"error: cannot tell the GPU spec of {name!r} for sure; pass --gpu "
                  f"({', '.join(sorted(GPUS))})", file=sys.stderr)
            return 2
        if gpu and inferred and gpu != inferred:
            print(f"warning: --gpu {gpu} but the device is {name!r} ({inferred}); using --gpu {gpu}")
        gpu = gpu or inferred
    predict_gpu = gpu or "h100-sxm"  # CPU smoke: the prediction is computed only to exercise the code
    spec = model_spec(args.model, args.vocab, args.seq)
    extra = [f"ckpt={args.ckpt}"] if args.ckpt != "none" else []
    extra += [f"offload={args.offload}"] if args.offload else []
    extra += [f"precision={args.precision}"] if args.precision != "bf16" else []
    layout = Layout.parse(",".join([f"dp=1,mbs={args.mbs}", *extra]))
    global_batch = args.mbs * args.grad_accum
    job = JobSpec(global_batch=global_batch, seq_len=args.seq)
    plan, plan_error = predict(spec, predict_gpu, job, layout, compile=not args.no_compile)
    prediction = None
    if plan is not None:
        prediction = dict(plan.to_dict()["prediction"])
        memory = plan.memory
        prediction["allocator_bytes"] = memory.total - memory.cuda_context - memory.comm_buffers - memory.fragmentation
        prediction["tokens_per_s"] = job.global_batch * job.seq_len / plan.step.step_time
        prediction["gpu"] = predict_gpu
        print(f"plait plan on one {predict_gpu}: step {plan.step.step_time:.3f} s, MFU {100 * plan.step.mfu:.1f}%, "
              f"memory {memory.total / GIB:.2f} GiB (fits: {plan.fits})")
        if not plan.fits and device.type == "cuda":
            print("warning: the planner says this does not fit; lower --mbs")
    else:
        print(f"warning: no prediction: {plan_error}")
    config = RunConfig(job=TrainJob(model=spec, layout=layout, global_batch=global_batch, seq_len=args.seq,
                                    steps=args.steps, seed=args.seed),
                       runtime=RuntimeConfig(compile=not args.no_compile, device=device.type,
                                             gpu=gpu if device.type == "cuda" else None),
                       prediction=Prediction.of_plan(plan, predict_gpu) if plan is not None else None)
    peak = get_gpu(gpu).peak_flops("bf16") if device.type == "cuda" else None
    command = " ".join(["python", *sys.argv]) if argv is None else " ".join(["python", "bench/train_gpu.py", *argv])
    run = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "command": command, "machine": machine_info(device), "gpu": gpu or "cpu", "smoke": args.smoke,
           "model": {**spec.to_dict(), "params": spec.total_params()}, "layout": str(layout),
           "global_batch": global_batch, "seq_len": args.seq, "micro_batches": args.grad_accum,
           "steps": args.steps, "warmup_steps": args.warmup_steps, "peak_flops": peak,
           "prediction": prediction, "prediction_error": plan_error}
    with tempfile.TemporaryDirectory() as store_dir:
        init_single_process_group(device, store_dir)
        try:
            try:
                run["plait"] = run_plait(config, device, args.warmup_steps)
            except torch.cuda.OutOfMemoryError:
                print(f"error: plait ran out of GPU memory at --mbs {args.mbs} --seq {args.seq}; "
                      "lower --mbs (and raise --grad-accum)", file=sys.stderr)
                raise
            free_cuda(device, config.runtime.compile)
            if args.no_baseline:
                run["baseline"] = {"skipped": "--no-baseline"}
            else:
                try:
                    run["baseline"] = run_baseline(spec, config, device, args.warmup_steps)
                except torch.cuda.OutOfMemoryError as exc:
                    first_line = str(exc).splitlines()[0] if str(exc) else ""
                    run["baseline"] = {"skipped": f"out of GPU memory at micro-batch {args.mbs} x {args.seq} "
                                                  f"({first_line})"}
                    free_cuda(device, False)
        finally:
            dist.destroy_process_group()
    if "skipped" in run["baseline"]:
        print(f"\nbaseline skipped: {run['baseline']['skipped']}")
    for key in ("plait", "baseline"):
        if "tokens_per_s" in run[key]:
            run[key]["mfu"] = mfu(spec, args.seq, run[key]["tokens_per_s"], 1, peak)
    judge(run, on_gpu=device.type == "cuda")
    print()
    print_tables(run)
    out_dir = args.out if args.out else (None if args.smoke else RESULTS)
    if out_dir is not None:
        write_results(run, out_dir)
    else:
        print("\nsmoke run: no results written (give --out DIR to write them)")
    return 0


if __name__ == "__main__":
    try:
        code = main()
    except Exception:  # noqa: BLE001 - report and exit without interpreter teardown
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip teardown: it can abort in gloo's threads (as plait.run.worker does)
