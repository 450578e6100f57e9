"""The GPU proof (issue 35): is plait's runtime right, fast and calibrated on one GPU? One command.

    bash bench/gpu_proof.sh                  # on a one-GPU box (H100/H200): <= 560 s, set-up included
    bash bench/gpu_proof.sh --gpu h100-sxm   # when the device name does not say which GPU spec it is
    bash bench/gpu_proof.sh --only right,fast  # a rerun of some steps (results of the others are kept)
    bash bench/gpu_proof.sh --dry-run        # the same steps on the CPU with a tiny model (tests/measure/test_gpu_proof.py)

The shell script runs each step below as ``python bench/gpu_proof.py run STEP`` under coreutils
``timeout`` with the step's limit (SIGTERM 5 s before it, then SIGKILL), so a step that fails or
hangs is reported and the next one still runs. Each step writes ``$OUT/steps/STEP.json`` as its
parts finish (results of a step killed half-way are kept) and its output to ``$OUT/logs/STEP.log``.
Then ``summary`` writes ``$OUT/summary.md`` and ``summary.json`` and prints the table: what ran,
what failed (the first line of its error), the numbers, and the issue's targets met or not.
``$OUT`` defaults to ``bench/results/gpu_proof`` (the device tool sets ``$OUT``; ``--out DIR``).

Steps (limits in seconds; they add up to ``BUDGET_S`` = 560, 9 min 20 s, on an H100; set from the
first run's times, bench/results/gpu_proof: 16, 56, 26, 41, 114, 29 and 88 s with torchao carried.
moe has 60 s since its side-stream check was added (not yet run on a GPU): the 26 s, then the check
in what is left, about 29 s before the SIGTERM, of which it waits at most 23 (6 s to end its
processes), against an estimated 8-13 s on an H100 (gpu_proof_overlap.py, "Time"); the 10 s came
from fast, which has the most room: 41 s measured on a fresh machine, compile caches cold):

  setup          30  install wheels carried in bench/wheels/ (pip --no-index, only if the folder
                     exists), then record GPU, driver, torch, CUDA, transformers, torchao
  right          90  llama-125m: CPU fp32 vs GPU fp32 losses within an arithmetic tolerance, no host
                     sync in the loop, bf16 + compile + fused loss, fp8 if torchao (gpu_proof_right.py)
  moe            60  a 60M MoE (8 experts top-2): torch._grouped_mm = per-expert GEMMs in bf16 and
                     torchao's fp8 grouped GEMM against them, forward and backward, within derived
                     bounds; training in bf16 and fp8 vs the CPU fp32 reference; measured vs predicted
                     step time; last, in the time left: moe_overlap's CUDA side stream, 2 ranks on
                     the GPU over gloo (gpu_proof_moe.py, gpu_proof_overlap.py; issue 33)
  fast           70  bench/train_gpu.py: 1.1B Llama at seq 4096, plait (default recipe) vs a plain HF
                     loop: tokens/s, MFU, peak memory vs the planner's prediction
  fast_variants 140  bench/train_gpu.py --no-baseline with ckpt=full, offload=cpu:1, fp8 (torchao)
  profile        45  bench/profile_gpu.py: plait profile (GEMM curve, attention, HBM) -> $OUT/calibrations/<gpu>.json
  sweep         115  bench/sweep_gpu.py: plait sweep of 5 one-GPU layouts of llama3.2-1b (mbs, ckpt,
                     offload, fp8), predicted vs measured, from the fresh profile and the shipped defaults
  summary        10  the table

What each number means: docs/benchmarks.md, "The GPU proof".
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import importlib.util
import json
import os
import platform
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path[:0] = [str(BENCH), str(ROOT / "src")]

DEFAULT_OUT = ROOT / "bench" / "results" / "gpu_proof"
DRY_LIMIT_SCALE = 3  # --dry-run: every limit x3: the tests' CPU is shared and slow
KILL_GRACE_S = 5  # gpu_proof.sh: SIGTERM at limit - 5 s, SIGKILL at the limit
TARGET_MFU, TARGET_SPEEDUP, TARGET_MEMORY, TARGET_SWEEP = 0.50, 1.3, 0.10, 0.10  # issue 35's targets
SWEEP_MODEL, SWEEP_SEQ, SWEEP_BATCH = "llama3.2-1b", 2048, 8
SWEEP_LAYOUTS = ("dp=1,mbs=1", "dp=1,mbs=2", "dp=1,mbs=4,ckpt=full", "dp=1,mbs=2,offload=cpu:1",
                 "dp=1,mbs=2,precision=fp8")
DRY_SWEEP_LAYOUTS = ("dp=1,mbs=2,ckpt=full",)  # one layout: each is a torchrun launch


@dataclass(frozen=True)
class Step:
    name: str
    limit_s: int
    what: str


STEPS = (
    Step("setup", 30, "carried wheels, GPU, driver and versions"),
    Step("right", 90, "fp32 GPU = CPU, no host sync, bf16 + compile + fused loss, fp8"),
    Step("moe", 60, "MoE experts: grouped GEMM = per-expert GEMMs (bf16, fp8), training, measured vs predicted, "
                    "overlap side stream"),
    Step("fast", 70, "1.1B Llama at seq 4096: plait vs a plain HF loop (bench/train_gpu.py)"),
    Step("fast_variants", 140, "the same with ckpt=full, offload=cpu:1, fp8 (plait only)"),
    Step("profile", 45, "plait profile -> calibrations/<gpu>.json (bench/profile_gpu.py)"),
    Step("sweep", 115, "plait sweep of 5 layouts: fresh profile and shipped defaults (bench/sweep_gpu.py)"),
    Step("summary", 10, "the table (summary.md)"),
)
BUDGET_S = sum(step.limit_s for step in STEPS)
assert BUDGET_S <= 560, BUDGET_S


def effective_steps(dry_run: bool = False, environ=os.environ) -> tuple[Step, ...]:
    """STEPS with the limits of a dry run (x ``DRY_LIMIT_SCALE``, or x ``GPU_PROOF_DRY_SCALE``: the
    test suite's CPU may be shared by other jobs) and of ``GPU_PROOF_LIMITS="fast=200,sweep=150"``
    (seconds as given: a slower GPU; the tests' timeout check); raises ValueError with a one-line
    message on a bad value."""
    text = environ.get("GPU_PROOF_LIMITS", "").strip()
    limits = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        if name not in {step.name for step in STEPS}:
            raise ValueError(f"GPU_PROOF_LIMITS: no step {name!r}")
        if not value.isdigit() or int(value) < 6:
            raise ValueError(f"GPU_PROOF_LIMITS: {item!r} needs whole seconds >= 6")
        limits[name] = int(value)
    scale_text = environ.get("GPU_PROOF_DRY_SCALE", str(DRY_LIMIT_SCALE)).strip()
    if not scale_text.isdigit() or int(scale_text) < 1:
        raise ValueError(f"GPU_PROOF_DRY_SCALE: {scale_text!r} needs a whole number >= 1")
    scale = int(scale_text) if dry_run else 1
    return tuple(Step(step.name, limits.get(step.name, step.limit_s * scale), step.what) for step in STEPS)


class Record:
    """A step's result file, rewritten as each part ends: ``$OUT/steps/NAME.json``."""

    def __init__(self, out: Path, name: str, dry_run: bool, limit_s: float | None = None):
        self.path = out / "steps" / f"{name}.json"
        self.start = time.perf_counter()
        # the step's StepTimeout (SIGTERM or SIGALRM) comes KILL_GRACE_S before its limit
        self.deadline = None if limit_s is None else self.start + limit_s - KILL_GRACE_S
        self.data = {"step": name, "dry_run": dry_run, "status": "running", "checks": [], "numbers": {}}
        self.save()

    def check(self, name: str, status: str, detail: str, numbers: dict | None = None) -> None:
        self.data["checks"].append({"name": name, "status": status, "detail": detail, "numbers": numbers or {},
                                    "at_s": round(time.perf_counter() - self.start, 1)})
        print(f"[{time.perf_counter() - self.start:.1f} s] {name}: {status}: {detail}", flush=True)
        self.save()

    def left_s(self) -> float | None:
        """Seconds until the step's StepTimeout (None without a limit): a part that starts
        processes or waits ends within it (the moe step's side-stream check)."""
        return None if self.deadline is None else self.deadline - time.perf_counter()

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str) + "\n")
        tmp.replace(self.path)

    def finish(self, error: str | None = None) -> None:
        statuses = [c["status"] for c in self.data["checks"]]
        if error:
            self.data["error"] = error
        if error or "failed" in statuses:
            self.data["status"] = "failed"
        elif statuses and all(s == "skipped" for s in statuses):
            self.data["status"] = "skipped"
        else:
            self.data["status"] = "ok"
        self.save()


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def free_device() -> None:
    import gc

    import torch

    torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def resolve_gpu(out: Path, given: str | None, dry_run: bool) -> str:
    """The GPU spec: --gpu, else what setup recorded, else from the device name; "cpu" in a dry run."""
    if dry_run:
        return "cpu"
    if given:
        return given
    setup = out / "steps" / "setup.json"
    if setup.is_file():
        gpu = json.loads(setup.read_text()).get("numbers", {}).get("gpu")
        if gpu:
            return gpu
    import torch
    from train_gpu import gpu_from_device_name

    if not torch.cuda.is_available():
        raise RuntimeError("torch sees no GPU (use --dry-run on a CPU box)")
    name = torch.cuda.get_device_name(0)
    gpu = gpu_from_device_name(name)
    if gpu is None:
        raise RuntimeError(f"cannot tell the GPU spec of {name!r}; pass --gpu (e.g. h100-sxm, h200)")
    return gpu


# ----------------------------------------------------------------------------- steps
def step_setup(record: Record, args) -> None:
    wheels = ROOT / "bench" / "wheels"
    files = sorted(str(p) for p in wheels.glob("*.whl")) if wheels.is_dir() else []
    if not files:
        record.check("setup: carried wheels", "skipped", "no bench/wheels/*.whl")
    elif args.dry_run:
        record.check("setup: carried wheels", "skipped", f"dry run ({len(files)} wheels not installed)")
    else:
        try:
            proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--find-links", str(wheels),
                                   *files], capture_output=True, text=True, timeout=12, check=False)
            tail = (proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or [""])[-1]
            status, detail = "ok" if proc.returncode == 0 else "failed", f"exit {proc.returncode}: {tail}"
        except subprocess.TimeoutExpired:
            status, detail = "failed", "pip did not finish in 12 s"
        record.check("setup: carried wheels", status, f"pip install --no-index {len(files)} wheels: {detail}",
                     {"wheels": [Path(f).name for f in files]})
    env = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version()}
    for package in ("torch", "transformers", "torchao"):
        try:
            env[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            env[package] = None
    env["torchao_found"] = importlib.util.find_spec("torchao") is not None  # imported by the fp8 runs only
    try:
        query = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=5, check=False)
        env["nvidia_smi"] = query.stdout.strip() or query.stderr.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        env["nvidia_smi"] = f"not available ({first_line(exc)})"
    if args.dry_run:  # torch's import (seconds on a loaded CPU) is left to the steps that use it
        record.data["numbers"] = env
        record.check("setup: environment", "ok", f"dry run on the CPU; torch {env['torch']}", env)
        return
    import torch

    env.update(torch=torch.__version__, cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())
    record.data["numbers"] = env
    if not torch.cuda.is_available():
        raise RuntimeError(f"torch {env['torch']} sees no GPU; on a CPU box run bench/gpu_proof.sh --dry-run")
    env["device"] = torch.cuda.get_device_name(0)
    env["gpu"] = resolve_gpu(record.path.parents[1], args.gpu, False)
    record.data["numbers"] = env
    record.check("setup: environment", "ok", f"{env['device']} ({env['gpu']}), {env['nvidia_smi']}, torch "
                 f"{env['torch']}, CUDA {env['cuda']}, torchao {env['torchao'] or 'no'}", env)


def step_right(record: Record, args) -> None:
    from gpu_proof_right import run_step

    run_step(record, args.dry_run)


def step_moe(record: Record, args) -> None:
    from gpu_proof_moe import run_step

    run_step(record, args.dry_run, resolve_gpu(args.out, args.gpu, args.dry_run))


def _train_gpu(out: Path, gpu: str, dry_run: bool, extra: list[str], label: str) -> dict:
    """bench/train_gpu.py in this process, results in ``out/train_gpu/LABEL/``; the record of its run."""
    import train_gpu

    folder = out / "train_gpu" / label
    argv = (["--smoke"] if dry_run else ["--gpu", gpu]) + [*extra, "--out", str(folder)]
    code = train_gpu.main(argv)
    if code != 0:
        raise RuntimeError(f"bench/train_gpu.py {' '.join(argv)} exited {code}")
    return json.loads((folder / "train_gpu.json").read_text())["runs"][-1]


def _fast_numbers(run: dict) -> dict:
    p, base, pred = run["plait"], run["baseline"], run["prediction"] or {}
    return {"layout": run["layout"], "model": run["model"]["name"], "seq_len": run["seq_len"],
            "global_batch": run["global_batch"], "tokens_per_s": p["tokens_per_s"], "mfu": p.get("mfu"),
            "step_time_s": p["step_time_s"], "peak_device_bytes": p.get("peak_device_bytes"),
            "peak_allocated_bytes": p.get("peak_allocated_bytes"), "predicted_memory_bytes": pred.get("memory_bytes"),
            "predicted_step_time_s": pred.get("step_time_s"), "memory_ratio": run.get("memory_ratio"),
            "baseline_tokens_per_s": base.get("tokens_per_s"), "baseline_skipped": base.get("skipped"),
            "speedup": run.get("speedup"), "compile": p.get("compile"), "final_loss": p.get("final_loss")}


def _fast_detail(n: dict) -> str:
    parts = [f"{n['layout']}: {n['tokens_per_s']:,.0f} tok/s"]
    parts += [f"MFU {100 * n['mfu']:.1f}%"] if n.get("mfu") is not None else []
    parts += [f"{n['speedup']:.2f}x the HF loop"] if n.get("speedup") else []
    if n.get("peak_device_bytes") and n.get("predicted_memory_bytes"):
        parts.append(f"memory {n['peak_device_bytes'] / 2**30:.1f} GiB vs predicted "
                     f"{n['predicted_memory_bytes'] / 2**30:.1f} ({100 * (n['memory_ratio'] - 1):+.1f}%)")
    return ", ".join(parts)


def step_fast(record: Record, args) -> None:
    gpu = resolve_gpu(args.out, args.gpu, args.dry_run)
    extra = [] if args.dry_run else ["--steps", "8", "--warmup-steps", "3"]
    numbers = _fast_numbers(_train_gpu(args.out, gpu, args.dry_run, extra, "default"))
    record.check("fast: plait vs HF loop", "ok", _fast_detail(numbers) + (" (dry run: CPU, tiny)" if args.dry_run
                                                                          else ""), numbers)


def step_fast_variants(record: Record, args) -> None:
    from gpu_proof_right import torchao_importable

    gpu = resolve_gpu(args.out, args.gpu, args.dry_run)
    # the slowest last (offload moves every layer's activations to the host and back: seconds per
    # step): a timeout then keeps the others' results
    for label, extra, steps in (("ckpt=full", ["--ckpt", "full"], ["--steps", "6", "--warmup-steps", "2"]),
                                ("fp8", ["--precision", "fp8"], ["--steps", "6", "--warmup-steps", "2"]),
                                ("offload=cpu:1", ["--offload", "cpu:1"], ["--steps", "4", "--warmup-steps", "1"])):
        steps = [] if args.dry_run else steps
        name = f"fast: {label}"
        missing = torchao_importable() if label == "fp8" else None
        if missing:
            record.check(name, "skipped", missing)
            continue
        try:
            numbers = _fast_numbers(_train_gpu(args.out, gpu, args.dry_run, [*extra, "--no-baseline", *steps],
                                               label.replace("=", "_").replace(":", "")))
            record.check(name, "ok", _fast_detail(numbers), numbers)
        except Exception as exc:  # noqa: BLE001 - one variant's failure (an OOM too) is its result
            traceback.print_exc()
            record.check(name, "failed", first_line(exc))
        free_device()


def step_profile(record: Record, args) -> None:
    import profile_gpu

    gpu = resolve_gpu(args.out, args.gpu, args.dry_run)
    calibration = args.out / "calibrations" / f"{gpu}.json"
    calibration.parent.mkdir(parents=True, exist_ok=True)
    where = ["--cpu", "--model", "tiny"] if args.dry_run else ["--gpu", gpu, "--model", SWEEP_MODEL, "--seq-len",
                                                               str(SWEEP_SEQ)]
    profile_gpu.main([*where, "--nproc-per-node", "1", "--out", str(calibration),
                      "--results", str(args.out / "profile.md")])
    data = json.loads(calibration.read_text())
    fits, over = data["fits"], data["gpu_overrides"]
    numbers = {"calibration": str(calibration), "gemm_rate_flops": fits["gemm"].get("rate"),
               "gemm_half_flops": fits["gemm"].get("half_flops"), "gemm_fit_max_error": fits["gemm"].get("max_error"),
               "attention_rate_flops": (fits.get("attention") or {}).get("rate"),
               "memory_bytes_per_s": fits.get("memory_bytes_per_s"), "gemm_efficiency": over.get("gemm_efficiency"),
               "attention_efficiency": over.get("attention_efficiency"),
               "memory_efficiency": over.get("memory_efficiency"), "kernel_overhead_s": over.get("kernel_overhead")}
    attention = f", attention {numbers['attention_rate_flops'] / 1e12:.3g} TFLOP/s" \
        if numbers["attention_rate_flops"] else ""
    record.check("calibrated: plait profile", "ok",
                 f"GEMM {numbers['gemm_rate_flops'] / 1e12:.3g} TFLOP/s{attention}, memory "
                 f"{(numbers['memory_bytes_per_s'] or 0) / 1e9:.3g} GB/s -> {calibration.name}", numbers)


def step_sweep(record: Record, args) -> None:
    import sweep_gpu
    from gpu_proof_report import sweep_numbers

    gpu = resolve_gpu(args.out, args.gpu, args.dry_run)
    calibration = args.out / "calibrations" / f"{gpu}.json"
    report = args.out / "sweep"
    if args.dry_run:
        argv = ["--cpu", "--model", "tiny", "--global-batch", "4", "--seq-len", "64", "--steps", "2",
                "--nproc-per-node", "1", "--repeats", "1", "--min-time", "0", "--timeout", "60"]
        layouts = DRY_SWEEP_LAYOUTS
    else:
        argv = ["--gpu", gpu, "--model", SWEEP_MODEL, "--global-batch", str(SWEEP_BATCH), "--seq-len", str(SWEEP_SEQ),
                "--steps", "4", "--timeout", "40"]  # eager runs (plait sweep's default), 3 timed steps each
        layouts = SWEEP_LAYOUTS
    argv += [item for layout in layouts for item in ("--layout", layout)]
    argv += ["--report-dir", str(report), "--results", str(args.out / "sweep.md")]
    fresh = calibration.is_file()
    argv += ["--calibration", str(calibration)] if fresh else []
    code = sweep_gpu.run(argv)
    csv_path = report / ("sweep_cpu.csv" if args.dry_run else "sweep_gpu.csv")
    numbers, table = sweep_numbers(csv_path, "h100-sxm" if args.dry_run else gpu, args.dry_run, fresh)
    (args.out / "sweep_predictions.md").write_text(table + "\n")
    numbers["fresh_profile"] = fresh
    numbers["plait_sweep_exit"] = code
    detail = (f"{numbers['ok']}/{numbers['layouts']} layouts ran; median |step error| "
              f"{_pct(numbers['median_step_error_fresh'])} with the "
              f"{'fresh profile' if fresh else 'defaults (NO fresh profile: the profile step failed)'}, "
              f"{_pct(numbers['median_step_error_defaults'])} with the shipped defaults; median |memory error| "
              f"{_pct(numbers['median_memory_error_fresh'])}")
    record.check("calibrated: plait sweep", "ok" if numbers["ok"] else "failed", detail, numbers)


def _pct(value) -> str:
    return f"{100 * value:.1f}%" if value is not None else "n/a"


RUNNERS = {"setup": step_setup, "right": step_right, "moe": step_moe, "fast": step_fast, "fast_variants": step_fast_variants,
           "profile": step_profile, "sweep": step_sweep}


# ----------------------------------------------------------------------------- command line
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("steps", "run", "summary"),
                        help="steps: the step table; run STEP...: steps (several: in this process, each under "
                             "SIGALRM; the dry run); summary: the table of results")
    parser.add_argument("steps", nargs="*", help="with run: of " + ", ".join(RUNNERS))
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or DEFAULT_OUT))
    parser.add_argument("--gpu", help="GPU spec (h100-sxm, h200, ...); default: from the device name")
    parser.add_argument("--dry-run", action="store_true", help="the CPU, a tiny model, seconds")
    args = parser.parse_args(argv)
    wrong = [name for name in args.steps if name not in RUNNERS]
    if args.command == "run" and (wrong or not args.steps):
        parser.error(f"run needs steps of: {', '.join(RUNNERS)}")
    return args


class StepTimeout(BaseException):
    """The step's time limit (less ``KILL_GRACE_S``) passed: SIGTERM from gpu_proof.sh's ``timeout``,
    or SIGALRM when several steps run in one process. A BaseException, so that a step's own
    ``except Exception`` does not swallow it; ``plait sweep`` stops its run on it."""


def _time_limit(signum, frame):
    raise StepTimeout(f"the step's time limit passed ({signal.Signals(signum).name})")


def run_one(name: str, args, limit_s: float | None = None) -> int:
    """One step in this process: its record, then 0, 1 (it failed) or 124 (its time limit passed).
    ``limit_s``: the step's limit (its record's ``left_s``), timed from the call (a whole process
    started by gpu_proof.sh's ``timeout`` is a fraction of a second older)."""
    record = Record(args.out, name, args.dry_run, limit_s)
    try:
        if os.environ.get("GPU_PROOF_STALL") == name:  # the tests' timeout check: this step hangs
            time.sleep(3600)
        RUNNERS[name](record, args)
    except StepTimeout as exc:
        traceback.print_exc()
        record.finish(f"{type(exc).__name__}: {exc}")
        return 124
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the step's failure is its result; the next step runs
        traceback.print_exc()
        record.finish(first_line(exc))
        return 1
    record.finish()
    return 0 if record.data["status"] != "failed" else 1


def run_in_process(names: list[str], limits: dict[str, int], args) -> int:
    """Several steps one after the other in this process (the dry run: one import of torch instead
    of one per step), each under SIGALRM at its limit less ``KILL_GRACE_S``, its output (also of the
    processes it starts) in ``logs/STEP.log``, its exit status and seconds in ``steps/STEP.rc``."""
    worst = 0
    (args.out / "logs").mkdir(parents=True, exist_ok=True)
    for name in names:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        start = time.perf_counter()
        with open(args.out / "logs" / f"{name}.log", "w") as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            signal.alarm(max(1, limits[name] - KILL_GRACE_S))
            try:
                code = run_one(name, args, limits[name])
            finally:
                signal.alarm(0)
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
                for fd in saved:
                    os.close(fd)
        took = time.perf_counter() - start
        (args.out / "steps" / f"{name}.rc").write_text(f"{code} {took:.1f}\n")
        word = {0: "ok", 124: "TIMEOUT"}.get(code, f"FAILED (exit {code})")
        print(f"{name:<14} {word} after {took:.1f} s (limit {limits[name]} s; log logs/{name}.log)", flush=True)
        worst = max(worst, code)
    return 1 if worst else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        steps = effective_steps(args.dry_run)
    except ValueError as exc:
        print(f"gpu_proof: {exc}", file=sys.stderr)
        return 2
    if args.command == "steps":
        for step in steps:
            print(step.name, step.limit_s, step.what)
        return 0
    if args.command == "summary":
        from gpu_proof_report import write_summary

        return write_summary(args.out, steps, args.dry_run)
    signal.signal(signal.SIGTERM, _time_limit)  # gpu_proof.sh's timeout: TERM 5 s before the limit
    signal.signal(signal.SIGALRM, _time_limit)
    limits = {step.name: step.limit_s for step in steps}
    if len(args.steps) == 1:
        return run_one(args.steps[0], args, limits[args.steps[0]])
    return run_in_process(args.steps, limits, args)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown: it can abort in gloo's or NCCL's threads (train_gpu.py does the same)
