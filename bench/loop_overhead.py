"""Benchmark (issue 17): the CPU cost of plait's training loop against a minimal loop and a
Hugging Face loop that train the same model on the same batch.

What is compared, per optimizer step, in the same process(es), rounds interleaved (each round
runs ``--steps-per-round`` steps of every contestant, the order rotating from round to round,
so that machine drift hits all of them alike):

  * ``plait``: ``plait.run.trainer.train`` (the real loop: batch from the token source, seed,
    forward/backward, loss all-reduce, clipping, AdamW, records, logging) on the layout plait
    picks for ``--layout`` (the micro-batch completed by ``plait.run.launcher.micro_batch`` as
    ``plait train`` does: the largest that fits in host memory);
  * ``plait-mbs1`` (dp=1 only): plait with ``mbs=1`` (gradient accumulation over one-sequence
    micro-batches: what ``--layout dp=1`` meant before the completion);
  * ``minimal``: a hand-written loop over plait's own ``Transformer`` (same weights): random
    batch, forward, fp32 cross entropy, backward, ``clip_grad_norm_(foreach=True)``, AdamW
    (fused, as plait's, so that the ratio measures the loop and not the optimizer kernel; the same
    two parameter groups), the loss read on logging steps only. With dp=2:
    wrapped in ``torch.nn.parallel.DistributedDataParallel`` (plait ``zero=0``) or FSDP2
    ``fully_shard`` per block then the root (plait ``zero=3``);
  * ``hf`` (dp=1, when transformers is installed): ``LlamaForCausalLM`` of the same shapes
    (SDPA attention), the same loss, clipping and optimizer.

The measure is CPU time per step (``time.process_time``: all threads of the process, which
with one intra-op thread is the step's own work plus gloo's) and wall time per step; the bar of
issue 17 is plait / minimal CPU time per step <= 1.03, as the median over rounds of the per-round
ratio. Everything runs on one intra-op thread per process (``--threads``).

    python bench/loop_overhead.py                  # dp=1, dp=2 DDP, dp=2 ZeRO-3; appends to
                                                   # bench/results/loop_overhead.md
    python bench/loop_overhead.py --modes dp1 --rounds 3 --no-record   # a quick look
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

try:
    import plait  # noqa: F401
except ImportError:  # running from a checkout that is not pip-installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from plait.run.config import OptimConfig, RunConfig, RuntimeConfig, TrainJob, LogConfig
from plait.run.faults import FaultPlan
from plait.run.launcher.micro_batch import choose_mbs
from plait.run.metrics import Display
from plait.run.observe.jsonl import JsonlLog
from plait.run.model import build_model, init_weights
from plait.run.trainer import build_setup, train
from plait.spec.layout import JobSpec, Layout
from plait.spec.model import ModelSpec

RESULTS = Path(__file__).resolve().parent / "results" / "loop_overhead.md"
BAR = 1.03
MODES = {"dp1": (1, "dp=1"), "ddp2": (2, "dp=2,zero=0"), "zero3": (2, "dp=2,zero=3")}


def model_spec(vocab: int, seq_len: int) -> ModelSpec:
    """A 13M-parameter Llama (untied): 4 layers, hidden 384, GQA 6/2 heads, vocabulary ``vocab``."""
    return ModelSpec(name="llama-13m", arch="llama", n_layers=4, hidden=384, ffn_hidden=1024, n_heads=6,
                     n_kv_heads=2, vocab=vocab, max_seq_len=seq_len, tied_embeddings=False)


def completed_layout(text: str, spec: ModelSpec, global_batch: int, seq_len: int) -> tuple[Layout, str]:
    """The layout ``plait train --layout TEXT`` runs on this CPU (its micro-batch completed by
    ``plait.run.launcher.micro_batch.choose_mbs``, as ``plait train`` does), and the note."""
    layout = Layout.parse(text)
    return choose_mbs(spec, JobSpec(global_batch, seq_len), layout, gpu=None, on_gpu=False, processes=layout.dp)


# ----------------------------------------------------------------------------- contestants
class PlaitLoop:
    """plait's own loop (``plait.run.trainer.train``), ``steps`` at a time."""

    def __init__(self, spec: ModelSpec, layout: Layout, global_batch: int, seq_len: int, log_every: int):
        total = 10**6  # the schedule's length only; rounds stop the loop early
        self.config = RunConfig(job=TrainJob(model=spec, layout=layout, global_batch=global_batch,
                                             seq_len=seq_len, steps=total),
                                optim=OptimConfig(warmup_steps=2), runtime=RuntimeConfig(device="cpu"),
                                observe=LogConfig(log_every=log_every))
        self.setup = build_setup(self.config, torch.device("cpu"), FaultPlan())
        self.setup.parts.train()
        self.log = JsonlLog(None)
        self.display = Display(total, False, log_every)
        self.done = 0

    def run(self, steps: int) -> None:
        end = self.done + steps
        self.setup.config = replace(self.config, job=replace(self.config.job, steps=end))
        train(self.setup, self.done, None, self.log, self.display)
        self.done = end


class MinimalLoop:
    """A hand-written loop over the same model: what a user writes in 60 lines."""

    def __init__(self, model: torch.nn.Module, spec: ModelSpec, per_rank_batch: int, seq_len: int, log_every: int):
        self.model, self.spec, self.batch, self.seq_len, self.log_every = model, spec, per_rank_batch, seq_len, log_every
        params = [p for p in model.parameters()]
        groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.1},
                  {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
        self.params = params
        self.optimizer = torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95), fused=True)
        self.generator = torch.Generator().manual_seed(dist.get_rank() if dist.is_initialized() else 0)
        self.step_index = 0
        self.last_loss = None

    def logits(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.model(inputs)

    def run(self, steps: int) -> None:
        for _ in range(steps):
            tokens = torch.randint(self.spec.vocab, (self.batch, self.seq_len + 1), generator=self.generator)
            inputs, labels = tokens[:, :-1], tokens[:, 1:]
            loss = F.cross_entropy(self.logits(inputs).flatten(0, 1).float(), labels.flatten())
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.params, 1.0, foreach=True)
            for group in self.optimizer.param_groups:
                group["lr"] = 3e-4 * min(1.0, (self.step_index + 1) / 2)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            if self.step_index == 0 or (self.step_index + 1) % self.log_every == 0:  # plait's cadence
                self.last_loss = float(loss.detach())
            self.step_index += 1


class HfLoop(MinimalLoop):
    """``transformers.LlamaForCausalLM`` of the same shapes in the minimal loop."""

    def logits(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=inputs).logits


def hf_model(spec: ModelSpec):
    """LlamaForCausalLM with ``spec``'s shapes (SDPA attention), or None without transformers."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        return None
    config = LlamaConfig(vocab_size=spec.vocab, hidden_size=spec.hidden, intermediate_size=spec.ffn_hidden,
                         num_hidden_layers=spec.n_layers, num_attention_heads=spec.n_heads,
                         num_key_value_heads=spec.n_kv_heads, max_position_embeddings=spec.max_seq_len,
                         tie_word_embeddings=False, attn_implementation="sdpa")
    return LlamaForCausalLM(config)


def plain_model(spec: ModelSpec, zero: int, world: int) -> torch.nn.Module:
    """plait's Transformer with its deterministic weights, wrapped as the minimal loop's dp needs."""
    model = build_model(spec, "meta")
    if world > 1 and zero == 3:
        from torch.distributed.fsdp import fully_shard

        for block in model.layers.values():
            fully_shard(block)
        fully_shard(model)
    model.to_empty(device="cpu")
    init_weights(model, spec, 0, "cpu")
    if world > 1 and zero == 0:
        model = torch.nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True)
    return model


# ----------------------------------------------------------------------------- measurement
def measure(contestants: dict, rounds: int, steps_per_round: int, warmup_rounds: int) -> dict[str, list[dict]]:
    """Per contestant, one {cpu_s, wall_s} per step, per measured round (rotating order)."""
    names = list(contestants)
    out: dict[str, list[dict]] = {name: [] for name in names}
    for index in range(warmup_rounds + rounds):
        order = names[index % len(names):] + names[:index % len(names)]
        for name in order:
            if dist.is_initialized():
                dist.barrier()
            cpu0, wall0 = time.process_time(), time.perf_counter()
            contestants[name].run(steps_per_round)
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            if index >= warmup_rounds:
                out[name].append({"cpu_s": cpu / steps_per_round, "wall_s": wall / steps_per_round})
    return out


def run_mode(mode: str, args) -> dict:
    """One mode's measurements on this rank (the caller initialized the process group)."""
    world, text = MODES[mode]
    torch.set_num_threads(args.threads)
    spec = model_spec(args.vocab, args.seq_len)
    layout, note = completed_layout(text, spec, args.global_batch, args.seq_len)
    per_rank = args.global_batch // world
    contestants = {"plait": PlaitLoop(spec, layout, args.global_batch, args.seq_len, args.log_every)}
    if mode == "dp1":
        contestants["plait-mbs1"] = PlaitLoop(spec, replace(layout, mbs=1), args.global_batch, args.seq_len,
                                              args.log_every)
    contestants["minimal"] = MinimalLoop(plain_model(spec, layout.zero, world), spec, per_rank, args.seq_len,
                                         args.log_every)
    if mode == "dp1":
        hf = hf_model(spec)
        if hf is not None:
            contestants["hf"] = HfLoop(hf, spec, per_rank, args.seq_len, args.log_every)
    times = measure(contestants, args.rounds, args.steps_per_round, args.warmup_rounds)
    return {"mode": mode, "layout": str(layout), "completion": note, "times": times,
            "parameters": sum(p.numel() for p in build_model(spec).parameters())}


def _worker(rank: int, world: int, mode: str, args, store_path: str, out_path: str) -> None:
    store = dist.FileStore(store_path, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    try:
        result = run_mode(mode, args)
        Path(f"{out_path}.{rank}").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def run_spawned(mode: str, args) -> list[dict]:
    """``mode`` on its world size of gloo processes; every rank's result."""
    world = MODES[mode][0]
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "result")
        mp.spawn(_worker, args=(world, mode, args, os.path.join(tmp, "store"), out_path), nprocs=world)
        return [json.loads(Path(f"{out_path}.{rank}").read_text()) for rank in range(world)]


# ----------------------------------------------------------------------------- report
def summarize(results: list[dict]) -> list[dict]:
    """Per contestant: median CPU and wall ms per step (mean over ranks) and the per-round ratio to minimal."""
    names = list(results[0]["times"])
    rounds = len(results[0]["times"]["minimal"])

    def per_round(name: str, key: str) -> list[float]:
        return [statistics.mean(r["times"][name][i][key] for r in results) for i in range(rounds)]

    minimal_cpu = per_round("minimal", "cpu_s")
    rows = []
    for name in names:
        cpu, wall = per_round(name, "cpu_s"), per_round(name, "wall_s")
        ratios = [c / m for c, m in zip(cpu, minimal_cpu)]
        low, high = median_interval(ratios)
        rows.append({"loop": name, "cpu_ms": 1e3 * statistics.median(cpu), "wall_ms": 1e3 * statistics.median(wall),
                     "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
                     "ratio_low": low, "ratio_high": high})
    return rows


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """A distribution-free confidence interval of the median: the order statistics (k, n+1-k) with
    the largest k such that P(Binomial(n, 1/2) < k) <= (1 - confidence)/2."""
    ordered, n = sorted(values), len(values)
    k, tail = 0, 0.0
    while k < n // 2:
        tail_next = tail + math.comb(n, k) / 2**n
        if tail_next > (1 - confidence) / 2:
            break
        tail, k = tail_next, k + 1
    if k == 0:  # too few rounds for this confidence
        return ordered[0], ordered[-1]
    return ordered[k - 1], ordered[n - k]


def table(mode: str, result: dict, rows: list[dict]) -> str:
    lines = [f"#### {mode}: plait layout `{result['layout']}` ({result['completion']})", "",
             "| loop | CPU ms/step | wall ms/step | CPU time / minimal (median of rounds) | 95% CI of the median | "
             "min–max over rounds |",
             "|---|---:|---:|---:|---|---|"]
    for row in rows:
        lines.append(f"| {row['loop']} | {row['cpu_ms']:.1f} | {row['wall_ms']:.1f} | {row['ratio']:.3f} | "
                     f"{row['ratio_low']:.3f}–{row['ratio_high']:.3f} | {row['ratio_min']:.3f}–{row['ratio_max']:.3f} |")
    plait_row = next(r for r in rows if r["loop"] == "plait")
    verdict = "meets" if plait_row["ratio"] <= BAR else "misses"
    lines += ["", f"plait / minimal = {plait_row['ratio']:.3f}: {verdict} the bar (<= {BAR})", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default="dp1,ddp2,zero3", help="comma-separated: dp1, ddp2, zero3")
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--warmup-rounds", type=int, default=2)
    parser.add_argument("--steps-per-round", type=int, default=1)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per process")
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--no-record", action="store_true", help=f"print only; do not append to {RESULTS}")
    args = parser.parse_args(argv)
    sections = []
    for mode in args.modes.split(","):
        if mode not in MODES:
            parser.error(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
        results = run_spawned(mode, args)
        rows = summarize(results)
        text = table(mode, results[0], rows)
        print(text, flush=True)
        sections.append(text)
    if not args.no_record:
        header = (f"\n### {datetime.date.today()} — {platform.node()} ({platform.processor() or platform.machine()}, "
                  f"{os.cpu_count()} cores), torch {torch.__version__}\n\n"
                  f"13M-parameter Llama ({args.global_batch} x {args.seq_len} tokens per step, vocabulary "
                  f"{args.vocab}), {args.threads} thread(s) per process, {args.rounds} rounds x "
                  f"{args.steps_per_round} steps after {args.warmup_rounds} warm-up round(s), log every "
                  f"{args.log_every} steps. Command: `python bench/loop_overhead.py {' '.join(argv or sys.argv[1:])}`\n\n")
        if not RESULTS.exists():
            RESULTS.write_text("# Loop overhead: plait vs a minimal loop vs a Hugging Face loop (CPU)\n\n"
                               "Written by bench/loop_overhead.py; newest at the bottom.\n")
        with RESULTS.open("a") as handle:
            handle.write(header + "\n".join(sections))
    return 0


if __name__ == "__main__":
    sys.exit(main())
