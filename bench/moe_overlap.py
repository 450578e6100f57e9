"""Benchmark (issue 33, item 3): expert overlap on this CPU - moe_overlap none, chunked, shared -
measured step times next to the planner's.

A MoE model wide enough for its all-to-all to show on gloo (``wide-moe``: hidden 512, 8 experts
top-2 of ffn 128, one shared expert, 4 layers of which 3 are MoE, vocab 2048; written to the work
folder) is trained on 2 CPU processes with ``dp=2,ep=2`` and each ``moe_overlap``:

  1. ``plait profile --device cpu --nproc-per-node 2`` describes this CPU (GEMM curve, gloo
     collectives as alpha-beta, the all-to-all included) in a calibration file;
  2. ``plait sweep --calibration FILE --layout ...`` runs the three layouts through ``plait train``
     (repeats interleaved, warm-up steps excluded) and records the planner's predicted step time
     beside the measured one;
  3. each layout is evaluated again with the same calibration for the planner's itemized exposed
     all-to-all (``ep_comm``) and the routed experts' and shared experts' GEMM windows it hides
     behind; the table gives measured and predicted step times, and the saving of each mode
     against ``none``, measured and predicted.

The load average (other users of the machine) is recorded before and after. Results are appended
to ``bench/results/moe_overlap.md``.

    python bench/moe_overlap.py                  # 3 repeats
    python bench/moe_overlap.py --repeats 1 --no-record
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from results_file import append_result  # noqa: E402

MODEL = {"name": "wide-moe", "arch": "llama", "n_layers": 4, "hidden": 512, "ffn_hidden": 1024, "n_heads": 8,
         "n_kv_heads": 8, "vocab": 2048, "max_seq_len": 512, "tied_embeddings": False, "dropout": False,
         "moe": {"n_experts": 8, "top_k": 2, "expert_ffn": 128, "n_shared": 1, "first_dense": 1}}
SEQ_LEN, GLOBAL_BATCH, MBS = 256, 8, 2
MODES = ("none", "chunked", "shared")


def layout(mode: str) -> str:
    return f"dp=2,ep=2,mbs={MBS},moe_overlap={mode}"


def plait(*args: str, log: Path) -> None:
    """Run ``python -m plait.cli ARGS`` (this checkout's source), its output appended to ``log``."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    with log.open("a") as out:
        out.write(f"\n$ plait {' '.join(args)}\n")
        out.flush()
        done = subprocess.run([sys.executable, "-m", "plait.cli", *args], stdout=out, stderr=subprocess.STDOUT,
                              env=env, cwd=ROOT)
    if done.returncode:
        raise SystemExit(f"plait {args[0]} failed (exit {done.returncode}); see {log}")


def planner_items(model_path: Path, calibration: Path) -> dict[str, dict]:
    """Per mode, with the profile: predicted step time, exposed all-to-all (ep_comm) of the step, and
    one MoE layer's forward all-to-all, routed and shared expert GEMM seconds (one micro-batch)."""
    from plait.plan.calibration import read_calibration
    from plait.plan.cost import estimate_step
    from plait.plan.moe.timing import expert_a2a, moe_mlp_times
    from plait.spec.hardware import get_cluster
    from plait.spec.layout import Layout
    from plait.spec.models import get_model
    from plait.spec.layout import JobSpec

    model = get_model(str(model_path))
    profile = read_calibration(str(calibration))
    cluster, _ = profile.apply(get_cluster("dgx-h100"))
    job = JobSpec(global_batch=GLOBAL_BATCH, seq_len=SEQ_LEN)
    out = {}
    for mode in MODES:
        lay = Layout.parse(layout(mode))
        step = estimate_step(model, cluster, job, lay, profile.params)
        _, shared, experts = moe_mlp_times(model, cluster.gpu, profile.params, lay, MBS * SEQ_LEN, SEQ_LEN)
        out[mode] = {"step_s": step.step_time, "ep_comm_s": step.items()["ep_comm"],
                     "a2a_s": expert_a2a(model, cluster, lay, SEQ_LEN, profile.params),
                     "experts_s": experts, "shared_s": shared}
    return out


def _exchange_worker(rank: int, port: int, repeats: int, queue) -> None:
    """One rank of ``exchange_timings``: each mode's exchange (dispatch, routed experts, combine and
    the shared expert, forward and backward) of one micro-batch of MODEL's shapes, ``repeats`` times
    interleaved; rank 0 puts the medians (seconds, first two rounds left out) on ``queue``."""
    import statistics
    import time
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from plait.run.modules.experts import expert_forward
    from plait.run.modules.moe import SharedExperts
    from plait.run.parallel.expert import AllToAllDispatcher
    from plait.run.parallel.expert_overlap import OverlappedDispatcher

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=300))
    moe, hidden, tokens = MODEL["moe"], MODEL["hidden"], MBS * SEQ_LEN
    experts, local, ffn = moe["n_experts"], moe["n_experts"] // 2, moe["expert_ffn"]
    torch.manual_seed(rank)
    counts = torch.bincount(torch.randint(0, experts, (tokens * moe["top_k"],)), minlength=experts)
    rows = torch.randn(tokens * moe["top_k"], hidden, requires_grad=True)
    x = torch.randn(tokens, hidden, requires_grad=True)
    weights = [torch.randn(local, hidden, ffn, requires_grad=True), torch.randn(local, hidden, ffn, requires_grad=True),
               torch.randn(local, ffn, hidden, requires_grad=True)]
    shared = SharedExperts(hidden, moe["n_shared"] * ffn)
    group = dist.group.WORLD
    dispatchers = {"none": AllToAllDispatcher(group, 2, experts)}
    dispatchers.update({mode: OverlappedDispatcher(group, 2, experts, mode) for mode in ("chunked", "shared")})
    times = {mode: [] for mode in MODES}
    for _ in range(repeats + 2):
        for mode in MODES:
            dist.barrier()
            start = time.perf_counter()
            out, side = dispatchers[mode].exchange(rows, counts, lambda r, c: expert_forward(r, c, *weights),
                                                   lambda: shared(x))
            (out.sum() + side.sum()).backward()
            times[mode].append(time.perf_counter() - start)
    if rank == 0:
        queue.put({mode: statistics.median(values[2:]) for mode, values in times.items()})
    dist.barrier()
    dist.destroy_process_group()


def exchange_timings(repeats: int) -> dict[str, float]:
    """Median seconds of one MoE exchange, forward and backward, per mode, on 2 gloo processes."""
    from gpu_proof_overlap import two_ranks

    result = two_ranks(_exchange_worker, (repeats,), 1200)
    if "error" in result:
        raise SystemExit(f"the exchange timing failed: {result['error']}")
    return result


def predicted_exchange(model_path: Path, calibration: Path) -> dict[str, float]:
    """The planner's seconds of what ``exchange_timings`` runs: the routed and shared experts'
    GEMMs forward and backward (3x the forward), the exposed all-to-alls and the dispatcher's
    synchronisation (the count exchange and the launches: ``plait.plan.moe.sync``), per mode."""
    from plait.plan.calibration import read_calibration
    from plait.plan.moe.sync import moe_sync_layer
    from plait.plan.moe.timing import moe_comm_layer, moe_mlp_times
    from plait.spec.hardware import get_cluster
    from plait.spec.layout import Layout
    from plait.spec.models import get_model

    model = get_model(str(model_path))
    profile = read_calibration(str(calibration))
    cluster, _ = profile.apply(get_cluster("dgx-h100"))
    out = {}
    for mode in MODES:
        lay = Layout.parse(layout(mode))
        _, shared, experts = moe_mlp_times(model, cluster.gpu, profile.params, lay, MBS * SEQ_LEN, SEQ_LEN)
        out[mode] = (3 * (shared + experts) + sum(moe_comm_layer(model, cluster, lay, MBS * SEQ_LEN, SEQ_LEN,
                                                                 profile.params))
                     + moe_sync_layer(model, cluster, lay, profile.params, "torch").total)
    return out


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def measure(model_path: Path, calibration: Path, out: Path, args, log: Path) -> None:
    """The profile of this CPU, then the sweep of the three layouts with it."""
    plait("profile", "--device", "cpu", "--nproc-per-node", "2", "--model", str(model_path), "--seq-len",
          str(SEQ_LEN), "--out", str(calibration), log=log)
    plait("sweep", "--model", str(model_path), "--nproc-per-node", "2", "--global-batch", str(GLOBAL_BATCH),
          "--seq-len", str(SEQ_LEN), "--device", "cpu", "--calibration", str(calibration), "--steps",
          str(args.steps), "--repeats", str(args.repeats), "--min-time", "0", "--out", str(out),
          *[arg for mode in MODES for arg in ("--layout", layout(mode))], log=log)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--work", default=None)
    parser.add_argument("--no-record", action="store_true")
    parser.add_argument("--exchange-repeats", type=int, default=10, help="rounds of the exchange-only timing (0: none)")
    parser.add_argument("--reuse", action="store_true", help="report on --work's profile and sweep, if there")
    parser.add_argument("--note", default="", help="a line added under the table (e.g. the load seen during a reused run)")
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="moe-overlap-"))
    work.mkdir(parents=True, exist_ok=True)
    log = work / "bench.log"
    model_path = work / "wide-moe.json"
    model_path.write_text(json.dumps(MODEL))
    started, load_before = datetime.datetime.now(datetime.timezone.utc), load()
    calibration, out = work / "cpu-2proc.json", work / "sweep.csv"
    if not (args.reuse and calibration.exists() and out.exists()):
        measure(model_path, calibration, out, args, log)
    exchange = exchange_timings(args.exchange_repeats) if args.exchange_repeats else {}
    load_after = load()
    from plait.spec.layout import Layout

    with out.open() as handle:  # the sweep writes layouts in full: key them by their moe_overlap
        rows = {Layout.parse(row["layout"]).moe_overlap: row for row in csv.DictReader(handle)}
    items = planner_items(model_path, calibration)
    text = report(rows, items, started, load_before, load_after, args)
    if exchange:
        text += exchange_report(exchange, predicted_exchange(model_path, calibration), args)
    print(text)
    if not args.no_record:
        print("appended to", append_result("moe_overlap.md", "Expert overlap on CPU (moe_overlap)",
                                           "moe_overlap.py", text))


def report(rows: dict, items: dict, started, load_before: str, load_after: str, args) -> str:
    measured = {mode: float(rows[mode]["measured_step_time_s"] or "nan") for mode in MODES}
    spread = {mode: (rows[mode].get("repeat_min_s"), rows[mode].get("repeat_max_s")) for mode in MODES}
    lines = [f"## {platform.processor() or platform.machine()} x {os.cpu_count()}, {started.isoformat(timespec='seconds')}",
             "",
             f"wide-moe (bench/moe_overlap.py's MODEL), seq {SEQ_LEN}, global batch {GLOBAL_BATCH}, mbs {MBS}, "
             f"2 gloo processes, {args.steps} steps ({args.repeats} repeats, interleaved); load average "
             f"(1, 5, 15 min) before {load_before}, after {load_after}. Planner: the profile of this CPU "
             "taken just before (`plait profile --device cpu --nproc-per-node 2`).",
             "",
             "| layout | measured step, s (repeat min-max) | predicted step, s | error | measured saving vs none, s "
             "| predicted saving, s | predicted exposed a2a (ep_comm), s |",
             "|---|---|---|---|---|---|---|"]
    for mode in MODES:
        got, want = measured[mode], items[mode]["step_s"]
        low, high = spread[mode]
        lines.append(f"| `{layout(mode)}` | {got:.3f} ({float(low or 'nan'):.3f}-{float(high or 'nan'):.3f}) | "
                     f"{want:.3f} | {got / want - 1:+.0%} | {measured['none'] - got:+.3f} | "
                     f"{items['none']['step_s'] - want:+.3f} | {items[mode]['ep_comm_s']:.4f} |")
    one = items["none"]
    lines += ["", f"Planner, one MoE layer and micro-batch, forward: one all-to-all {one['a2a_s'] * 1e3:.2f} ms, "
              f"routed expert GEMMs {one['experts_s'] * 1e3:.2f} ms, shared expert GEMMs {one['shared_s'] * 1e3:.2f} ms.", ""]
    if args.reuse:
        lines += ["Reported from an earlier profile and sweep (`--reuse`): the load average above is the report's.", ""]
    if args.note:
        lines += [args.note, ""]
    return "\n".join(lines) + "\n"



def exchange_report(measured: dict, predicted: dict, args) -> str:
    lines = [f"One MoE exchange alone (dispatch, experts, combine, shared expert; forward and backward; one "
             f"micro-batch of wide-moe on 2 gloo processes, median of {args.exchange_repeats} interleaved rounds) "
             "against the planner's GEMMs plus exposed all-to-alls with the same profile:", "",
             "| moe_overlap | measured, s | predicted, s | measured saving vs none, s | predicted saving, s |",
             "|---|---|---|---|---|"]
    for mode in MODES:
        lines.append(f"| {mode} | {measured[mode]:.4f} | {predicted[mode]:.4f} | {measured['none'] - measured[mode]:+.4f} "
                     f"| {predicted['none'] - predicted[mode]:+.4f} |")
    return "\n".join(lines) + "\n\n"


if __name__ == "__main__":
    main()
