"""Host time of plait's runtime machinery per layer, and how much communication hides behind
compute: the two things a CPU profile needs beyond kernel rates (torch; run by the profile worker).

A CPU executes each op as it is dispatched, so the runtime's per-op host cost - module calls,
autograd nodes, DTensor's sharding propagation and redistribution, FSDP2's unshard / reshard /
reduce hooks, the context-parallel attention's exchange loop - is on the critical path, while on
a GPU the host runs ahead of the kernels. ``layer_host_seconds`` times models of the runtime's own
blocks (``plait.run.model``) through short ``plait train`` runs (the runtime's whole step) at one
short sequence, under one layout per mechanism over every rank: data parallelism alone
("plain"), tensor parallel, context parallel, FSDP2, selective activation checkpointing
(``ckpt=balanced``); with 5 and 1 layers (per layer =
(t(5) - t(1)) / 4: the embedding, the head and the loss cancel) and, plain, with three
micro-batches. ``plait.measure.profile.cpu_fit`` keeps what the
planner's own terms do not explain for the same configurations as ``layer_overhead_s``,
``microbatch_overhead_s``, ``step_overhead_s`` and ``tp_``, ``cp_``, ``fsdp_``, ``sac_layer_overhead_s``.

``overlap`` times a batch of GEMMs alone, a batch of all-reduces alone and both at once (the
all-reduces issued asynchronously first): the fraction of the shorter one that disappears is how
much communication this device hides behind compute (on a CPU the collective's thread competes
with the compute threads for the same cores; a GPU has copy engines and NICs of its own).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import statistics
import time

import torch
import torch.distributed as dist

from plait.measure.profile.cpu_fit import BLOCK_REPEATS, HOST_LAYERS, HOST_MICRO_BATCHES, overlap_hidden
from plait.spec.model import ModelSpec



OVERLAP_TRIALS = 25  # a trial hides nearly all or nearly nothing on a CPU: the mean needs many (cpu_fit.overlap_hidden)


def train_step_seconds(spec: ModelSpec, layers: int, layout_text: str, device: torch.device, seq_len: int,
                       micro_batches: int = 1, steps: int = 24) -> float:
    """Median steady-state step time of a ``steps``-step ``plait train`` run (``plait.run.trainer.run_training``,
    in this process group, every rank) of ``spec`` with ``layers`` layers under ``layout_text``,
    ``micro_batches`` micro-batches of ``mbs`` sequences of ``seq_len`` tokens per data-parallel
    rank, synthetic data: the runtime's whole step - data, forward and backward, gradient sync,
    clipping, AdamW, the loss and its host read, the step log - as a user's run has it."""
    from plait.run.config import LogConfig, RunConfig, RuntimeConfig, TrainJob
    from plait.run.metrics import median_step_time
    from plait.run.trainer import run_training
    from plait.spec.layout import Layout

    layout = Layout.parse(layout_text)
    job = TrainJob(model=dataclasses.replace(spec, n_layers=layers), layout=layout,
                   global_batch=layout.mbs * layout.dp * micro_batches, seq_len=seq_len, steps=steps)
    config = RunConfig(job=job, runtime=RuntimeConfig(device=device.type), observe=LogConfig(log_every=steps))
    with contextlib.redirect_stdout(io.StringIO()):  # its progress and summary lines are not the profile's
        result = run_training(config, device)
    return median_step_time(result.records)


def block_seconds(spec: ModelSpec, device: torch.device, seq_len: int, batches: list[int],
                  repeats: int = BLOCK_REPEATS) -> dict:
    """{"seq_len", "batches", "LxB": seconds}: the median seconds of one forward and backward (the loss
    on the logits, gradients set to None after each) of ``spec`` with L layers (``HOST_LAYERS``) on B
    sequences of ``seq_len`` tokens, for each B of ``batches``, in this process: no optimizer, no
    collective, ``repeats`` times after two warm-up steps. The per-layer difference between two token
    counts is the per-token work of a layer as plait's modules run it (``cpu_fit.block_passes``),
    timed tightly enough to tell apart from the planner's (two training runs' difference is not)."""
    import torch.nn.functional as F

    from plait.run.model import apply_kernels, build_model, init_weights
    from plait.spec.layout import Layout

    kernels = Layout.parse("dp=1")
    out: dict = {"seq_len": seq_len, "batches": list(batches)}
    generator = torch.Generator().manual_seed(0)
    for layers in HOST_LAYERS:
        layered = dataclasses.replace(spec, n_layers=layers)
        model = build_model(layered, "cpu")
        apply_kernels(model, kernels.attn, kernels.norm, "unfused")
        model.tie_embeddings()
        init_weights(model, layered, 0, "cpu")
        model = model.to(device)
        for batch in batches:
            tokens = torch.randint(0, spec.vocab, (batch, seq_len + 1), generator=generator).to(device)

            def step() -> None:
                logits = model(tokens[:, :-1])
                F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)).backward()
                model.zero_grad(set_to_none=True)

            for _ in range(2):
                step()
            times = []
            for _ in range(max(1, repeats)):
                start = time.perf_counter()
                step()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                times.append(time.perf_counter() - start)
            out[f"{layers}x{batch}"] = statistics.median(times)
    return out


def layer_host_seconds(spec: ModelSpec, device: torch.device, seq_len: int, layouts: dict[str, str],
                       steps: int = 24, rounds: int = 1) -> dict:
    """{"spec", "tokens", "layer_params", "layouts", <mechanism>: {"LxM": seconds}}: the step time of a
    short training run (``train_step_seconds``) of ``spec``'s blocks with L layers and M
    micro-batches of one sequence of ``seq_len`` tokens, for each of ``layouts`` (mechanism -> layout
    over every rank; "plain" is data parallelism alone): L in ``HOST_LAYERS`` with M = 1, and for
    "plain" also with M = ``HOST_MICRO_BATCHES`` (both L). Their differences give the per layer costs
    (per micro-batch and once per step), per micro-batch and per step costs
    (``plait.measure.profile.cpu_fit``). Every run is made ``rounds`` times, all runs in turn each round, and reported as the median of its rounds: the
    differences of two runs are what is fitted, so a slow spell of the machine during one run
    must not land in one of them alone."""
    out = {"spec": spec.name, "tokens": seq_len, "layer_params": spec.layer_params(), "layouts": dict(layouts),
           "steps": steps, "rounds": rounds}
    runs = []
    for mechanism, layout_text in layouts.items():
        shapes = [(layers, 1) for layers in HOST_LAYERS]
        if mechanism == "plain":
            shapes += [(layers, HOST_MICRO_BATCHES) for layers in HOST_LAYERS]
        runs += [(mechanism, layout_text, layers, micro_batches) for layers, micro_batches in shapes]
    seconds: dict[tuple, list[float]] = {}
    for _ in range(max(1, rounds)):
        for mechanism, layout_text, layers, micro_batches in runs:
            seconds.setdefault((mechanism, layers, micro_batches), []).append(
                train_step_seconds(spec, layers, layout_text, device, seq_len, micro_batches, steps))
    for (mechanism, layers, micro_batches), times in seconds.items():
        out.setdefault(mechanism, {})[f"{layers}x{micro_batches}"] = statistics.median(times)
    return out


def overlap(device: torch.device, dtype: torch.dtype, gemm_size: int, reduce_bytes: int, repeats: int,
            compute_over_comm: float = 0.0) -> dict:
    """``OVERLAP_TRIALS`` trials, each the seconds of ``repeats`` GEMMs (``gemm_size``³), of ``repeats``
    all-reduces of ``reduce_bytes`` over every rank, and of both at once, with the fraction of the
    shorter one that hid; ``hidden``: its mean over the trials (``cpu_fit.overlap_hidden``; on a CPU
    whose processes and collective threads share the cores it varies from trial to trial between 0
    and 1). ``compute_over_comm`` > 0: as many GEMMs as take that many times the all-reduces (timed
    after the warm-up, the same count on every rank), so that the all-reduces are the shorter side
    and ``hidden`` is the fraction of them that hid behind compute longer than they are - a gradient
    bucket's all-reduce behind the rest of the backward."""
    a = torch.randn(gemm_size, gemm_size, device=device, dtype=dtype)
    b = torch.randn(gemm_size, gemm_size, device=device, dtype=dtype)
    c = torch.empty_like(a)
    buffers = [torch.ones(max(1, reduce_bytes // 4), device=device, dtype=torch.float32) for _ in range(repeats)]
    gemm_count = repeats

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def gemms():
        for _ in range(gemm_count):
            torch.mm(a, b, out=c)

    def reduces(async_op: bool):
        return [dist.all_reduce(x, async_op=async_op) for x in buffers]

    def timed(fn) -> float:
        dist.barrier()
        start = time.perf_counter()
        fn()
        sync()
        elapsed = torch.tensor([time.perf_counter() - start], device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        return float(elapsed.item())

    def both():
        works = reduces(True)
        gemms()
        for work in works:
            work.wait()

    gemms(), reduces(False)  # warm-up
    if compute_over_comm > 0:  # ranks agree on the slowest timings, so on the count
        per_gemm = timed(gemms) / gemm_count
        gemm_count = max(repeats, math.ceil(compute_over_comm * timed(lambda: reduces(False)) / per_gemm))
    trials = []
    for _ in range(OVERLAP_TRIALS):  # each: alone, alone, together - the hidden fraction varies a lot
        compute, comm, together = timed(gemms), timed(lambda: reduces(False)), timed(both)
        trials.append({"compute_s": compute, "comm_s": comm, "together_s": together,
                       "hidden": min(1.0, max(0.0, (compute + comm - together) / min(compute, comm)))})
    return {"gemm_size": gemm_size, "reduce_bytes": reduce_bytes, "repeats": repeats, "gemm_repeats": gemm_count,
            "trials": trials, "hidden": overlap_hidden(trials)}
