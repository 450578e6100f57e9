"""Enumerate every valid layout for N GPUs, drop what does not fit, rank by predicted throughput.

Dimensions searched: tp (divisors of the head counts and ffn, inside a node unless fixed),
cp (when each rank keeps >= 4096 tokens), pp (with even or uneven stage splits), dp (the rest;
must divide the global batch), micro-batch size, ZeRO stage 0-3 and hybrid sharding inside a
node, checkpoint policy none/selective/balanced/full, schedules 1F1B, interleaved (2 and 4
virtual stages) and zero-bubble. Offload (activations to host, then the optimizer) is tried only
for layouts that do not fit otherwise. ``fixed`` pins any layout key (``--fix tp=8``).

Kernel knobs (``attn``, ``norm``, ``loss``) are not enumerated: ``norm=fused`` is never slower
nor larger than ``unfused`` in the model, and ``attn`` is the fastest kernel plait's runtime runs
the model with (``plait.plan.attention_choice``: flash for a plain causal model, flex with
soft-caps, sinks or a window's mask; the choice depends on the model and sequence, not the
layout), so trying the others would only multiply the candidates; they are evaluated when pinned
(``--fix attn=eager``). The chunked loss (``loss=fused``) costs one more LM-head GEMM and
saves memory, so, like offload, it is tried for a layout that does not fit with ``unfused``
(before offload, and kept only if it makes the layout fit), unless ``loss`` is pinned.

Experts (a model with ``moe``): ep over the divisors of n_experts that divide tp·cp·dp (the
expert ranks are carved out of them, ``plait.spec.moe.layout``), etp 1 and, with tp > 1, etp = tp;
a dense model gets ep = etp = 1 (no extra candidates). ``moe_overlap`` is not enumerated: ``none``
unless pinned (what a runtime without overlap does).
A cp > 1 layout gets the context-parallel kernel (``cp_impl``: ring, allgather, torch, ulysses
where cp divides the K/V heads) whose attention and exchange the planner prices fastest
(``plait.plan.context.choice``; memory does not tell them apart), unless pinned.

Every plan carries the runtime rules it breaks (``plait.spec.capabilities``); with
``runnable=True`` only the layouts that ``plait train`` runs are kept.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from plait.errors import PlaitError
from plait.plan.attention_choice import fastest_attention
from plait.plan.context.choice import fastest_cp_impl
from plait.plan.cost import estimate_step
from plait.plan.memory import DEFAULT_HEADROOM, estimate_memory, is_risky
from plait.plan.params import DEFAULT_PARAMS, CostParams
from plait.plan.plan import Plan
from plait.spec.capabilities import runtime_violations
from plait.spec.hardware import ClusterSpec
from plait.spec.layout import CKPT_POLICIES, RUNTIME_CP_IMPLS, JobSpec, Layout
from plait.spec.model import ModelSpec
from plait.spec.units import GIB, divisors
from plait.spec.validate import errors_of, validate

CKPT_ORDER = CKPT_POLICIES  # tried in this order: cheapest recompute first
# keys the enumeration does not vary (see the module docstring), with the value it uses unless pinned
KERNEL_DEFAULTS = {"precision": "bf16", "attn": "flash", "norm": "fused", "loss": "unfused", "moe_overlap": "none"}


@dataclass(frozen=True)
class SearchConstraints:
    fixed: tuple[tuple[str, object], ...] = ()  # (key, value) pairs every layout must have
    max_pp: int = 128
    max_mbs: int = 16
    schedules: tuple[str, ...] = ("1f1b", "interleaved-1f1b", "zero-bubble")
    allow_offload: bool = True

    def fixed_value(self, key: str):
        return dict(self.fixed).get(key)


@dataclass
class SearchResult:
    plans: list[Plan]  # fitting layouts, fastest first (with runnable=True: only those plait train runs)
    candidates: int  # layouts the enumeration produced (before validation and memory)
    evaluated: int  # valid layouts whose memory was predicted
    rejected_oom: int
    seconds: float
    smallest: Plan | None  # the smallest-memory layout seen (for "nothing fits" messages)
    rule_errors: tuple = ()  # the broken rules of the first candidate, when none was valid
    fitting: list[Plan] | None = None  # every fitting layout, fastest first, runnable or not (None: = plans)

    def all_fitting(self) -> list[Plan]:
        """Every fitting layout, fastest first, including those ``runnable=True`` dropped."""
        return self.plans if self.fitting is None else self.fitting

    def unrunnable_ahead(self, k: int) -> int:
        """Fitting layouts that plait train does not run ranked ahead of the k-th runnable one
        (all of them when fewer than k are runnable)."""
        dropped = kept = 0
        for plan in self.all_fitting():
            if plan.runtime_violations:
                dropped += 1
            else:
                kept += 1
                if kept == k:
                    break
        return dropped

    @property
    def layouts_per_second(self) -> float:
        return self.evaluated / self.seconds if self.seconds > 0 else float("inf")


def _options(constraints: SearchConstraints, key: str, default: list) -> list:
    value = constraints.fixed_value(key)
    return [value] if value is not None else default


def candidate_layouts(model: ModelSpec, cluster: ClusterSpec, job: JobSpec,
                      constraints: SearchConstraints = SearchConstraints(), params: CostParams = DEFAULT_PARAMS,
                      cp_impls: tuple[str, ...] = RUNTIME_CP_IMPLS):
    """Yield the layouts the search considers (before the memory check); ``params`` price the
    context-parallel kernels a cp > 1 layout gets (the fastest of ``cp_impls``: ``fastest_cp_impl``)."""
    n = cluster.n_gpus
    heads_gcd = _gcd(model.n_heads, model.n_kv_heads, model.ffn_hidden)
    tps = _options(constraints, "tp", [t for t in divisors(heads_gcd) if n % t == 0 and t <= cluster.gpus_per_node])
    cps = _options(constraints, "cp", [c for c in divisors(n) if c & (c - 1) == 0 and job.seq_len % (2 * c) == 0
                                         and (c == 1 or job.seq_len // c >= 4096)])
    zeros = _options(constraints, "zero", [0, 1, 2, 3])
    ckpts = _options(constraints, "ckpt", list(CKPT_ORDER))
    kernels = {key: _options(constraints, key, [default])[0] for key, default in KERNEL_DEFAULTS.items()}
    if constraints.fixed_value("attn") is None:
        kernels["attn"] = fastest_attention(model, cluster.gpu, params, job.seq_len, job.doc_len)
    for tp in tps:
        for cp in cps:
            if n % (tp * cp):
                continue
            rest = n // (tp * cp)
            pps = _options(constraints, "pp", [p for p in divisors(rest) if p <= min(constraints.max_pp, model.n_layers)])
            for pp in pps:
                if rest % pp:
                    continue
                dp = rest // pp
                if constraints.fixed_value("dp") not in (None, dp) or job.global_batch % dp:
                    continue
                per_rank = job.global_batch // dp
                mbss = _options(constraints, "mbs", [m for m in divisors(per_rank) if m <= constraints.max_mbs])
                for mbs in mbss:
                    if per_rank % mbs:
                        continue
                    micro = per_rank // mbs
                    for schedule, vpp in _schedules(model, pp, micro, constraints):
                        split = "even" if model.n_layers % (pp * vpp) == 0 else "uneven"
                        for zero in zeros:
                            if zero and dp * cp == 1:
                                continue
                            for hsdp in _hsdp_options(zero, dp, tp * cp, cluster.gpus_per_node, constraints):
                                for ep, etp in _expert_options(model, tp, tp * cp * dp, constraints):
                                    for ckpt in ckpts:
                                        layout = Layout(dp=dp, tp=tp, pp=pp, cp=cp, vpp=vpp, mbs=mbs, zero=zero,
                                                        hsdp=hsdp, ckpt=ckpt, schedule=schedule, split=split,
                                                        ep=ep, etp=etp, **kernels)
                                        if cp > 1 and constraints.fixed_value("cp_impl") is None:
                                            # the fastest context-parallel kernel (plait.plan.context.choice)
                                            layout = replace(layout, cp_impl=fastest_cp_impl(
                                                model, cluster, job, layout, params, cp_impls))
                                        yield layout


def _gcd(*values: int) -> int:
    from math import gcd

    out = 0
    for v in values:
        out = gcd(out, v)
    return out


def _schedules(model: ModelSpec, pp: int, micro: int, constraints: SearchConstraints):
    if pp == 1:
        yield "1f1b", 1
        return
    fixed_vpp = constraints.fixed_value("vpp")
    for schedule in _options(constraints, "schedule", list(constraints.schedules)):
        if schedule == "interleaved-1f1b":
            for vpp in ([fixed_vpp] if fixed_vpp else (2, 4)):
                if vpp > 1 and pp * vpp <= model.n_layers and micro % pp == 0:
                    yield schedule, vpp
        elif not fixed_vpp or fixed_vpp == 1:
            yield schedule, 1


def _expert_options(model: ModelSpec, tp: int, ranks: int, constraints: SearchConstraints):
    """(ep, etp) pairs for ``ranks`` = tp·cp·dp ranks of a stage (module docstring)."""
    if model.moe is None:
        yield constraints.fixed_value("ep") or 1, constraints.fixed_value("etp") or 1
        return
    etps = _options(constraints, "etp", sorted({1, tp}))
    for etp in etps:
        for ep in _options(constraints, "ep", divisors(model.moe.n_experts)):
            if ranks % (ep * etp) == 0 and model.moe.expert_ffn % etp == 0:
                yield ep, etp


def _hsdp_options(zero: int, dp: int, model_parallel: int, gpus_per_node: int, constraints: SearchConstraints):
    fixed = constraints.fixed_value("hsdp")
    if fixed is not None:
        yield fixed
        return
    yield 1
    shard_in_node = max(1, gpus_per_node // model_parallel)
    if zero >= 1 and dp > shard_in_node and dp % shard_in_node == 0:
        yield dp // shard_in_node  # shard inside a node, replicate across nodes


def search(model: ModelSpec, cluster: ClusterSpec, job: JobSpec,
           constraints: SearchConstraints = SearchConstraints(), params: CostParams = DEFAULT_PARAMS, *,
           runnable: bool = False, compile: bool = False, headroom: float = DEFAULT_HEADROOM,
           runtime: str = "torch", cp_impls: tuple[str, ...] = RUNTIME_CP_IMPLS) -> SearchResult:
    """All fitting layouts, fastest first (ties: less memory first), ranked by ``rank_with_headroom``.
    ``runtime`` and ``cp_impls``: whose memory model and which context-parallel kernels (a stack's:
    ``plait.spec.stack``; plait's runtime by default).

    Each plan carries the runtime rules it breaks (``Plan.runtime_violations``, with ``plait train
    --compile`` when ``compile``); ``runnable``: keep only the plans that break none.
    """
    check_cluster(cluster)
    start = time.perf_counter()
    plans: list[Plan] = []
    evaluated = rejected = 0
    smallest = None
    first_errors = None
    candidates = 0
    for layout in candidate_layouts(model, cluster, job, constraints, params, cp_impls):
        candidates += 1
        violations = validate(model, cluster, job, layout)
        errors = errors_of(violations)
        if errors:
            first_errors = first_errors or errors
            continue
        memory = estimate_memory(model, cluster, job, layout, params, runtime=runtime)
        evaluated += 1
        # the chunked loss shrinks the logits term: it helps only where that stage is the peak
        if (not memory.fits and memory.logits > 0 and layout.loss == "unfused"
                and constraints.fixed_value("loss") is None):
            chunked = replace(layout, loss="fused")
            chunked_memory = estimate_memory(model, cluster, job, chunked, params, runtime=runtime)
            if chunked_memory.fits:
                layout, memory = chunked, chunked_memory
        if not memory.fits and constraints.allow_offload and layout.ckpt != "none":
            layout, memory = _with_offload(model, cluster, job, layout, memory, params, runtime)
        if smallest is None or memory.total < smallest[1].total:
            smallest = (layout, memory)
        if not memory.fits:
            rejected += 1
            continue
        step = estimate_step(model, cluster, job, layout, params, runtime=runtime)
        plans.append(Plan(model, cluster, job, layout, memory, step, tuple(violations),
                          tuple(runtime_violations(model, layout, job, compile=compile))))
    plans.sort(key=lambda p: (-p.step.tokens_per_s_per_gpu, p.memory.total))
    fitting = None
    if runnable:
        fitting, plans = rank_with_headroom(plans, headroom), [p for p in plans if not p.runtime_violations]
    plans = rank_with_headroom(plans, headroom)
    seconds = time.perf_counter() - start
    smallest_plan = None
    if smallest is not None:
        layout, memory = smallest
        smallest_plan = Plan(model, cluster, job, layout, memory, estimate_step(model, cluster, job, layout, params))
    return SearchResult(plans, candidates, evaluated, rejected, seconds, smallest_plan,
                        tuple(first_errors or ()) if evaluated == 0 else (), fitting)


def rank_with_headroom(plans: list[Plan], headroom: float = DEFAULT_HEADROOM, near: float = 0.01) -> list[Plan]:
    """``plans`` (fastest first) with those inside the memory headroom (``is_risky``) moved after the
    others, and first the one with the most free memory among the safe plans within ``near`` of
    the fastest safe one. Risky plans lead only when no plan fits with the headroom."""
    safe = [p for p in plans if not is_risky(p.memory, headroom)]
    if not safe or len(safe) == len(plans) and len(plans) < 2:
        return plans
    risky = [p for p in plans if is_risky(p.memory, headroom)]
    fastest = safe[0].step.tokens_per_s_per_gpu
    count = 0
    while count < len(safe) and safe[count].step.tokens_per_s_per_gpu >= (1 - near) * fastest:
        count += 1
    top = max(range(count), key=lambda i: (safe[i].memory.headroom, -i))
    return [safe[top]] + safe[:top] + safe[top + 1:] + risky


OFFLOAD_STEPS = ({"offload": 0.5}, {"offload": 1.0}, {"offload": 1.0, "opt_offload": True})  # less GPU memory each


def _with_offload(model, cluster, job, layout, memory, params, runtime: str = "torch"):
    """Try activation offload (half of a stage's layers, then all: Kwai's α), then optimizer
    offload, on a checkpointed layout that does not fit; the first that fits, else the last tried.

    Each step holds no more on the GPU than the one before (``tests/plan/test_memo.py`` checks it),
    so the last is tried first: when it does not fit, neither does any other, and the search is
    spared the other two estimates of a layout that no offload saves."""
    last = replace(layout, **OFFLOAD_STEPS[-1])
    last_memory = estimate_memory(model, cluster, job, last, params, runtime=runtime)
    if not last_memory.fits:
        return last, last_memory
    for changes in OFFLOAD_STEPS[:-1]:
        candidate = replace(layout, **changes)
        candidate_memory = estimate_memory(model, cluster, job, candidate, params, runtime=runtime)
        if candidate_memory.fits:
            return candidate, candidate_memory
    return last, last_memory


def nothing_fits_message(model: ModelSpec, cluster: ClusterSpec, result: SearchResult) -> str:
    """Say by how much the best attempt misses and what would make the model fit."""
    capacity = cluster.gpu.hbm_bytes
    states = 16.0 * model.total_params()
    needed_gpus = -(-int(states / (0.85 * capacity)) // cluster.gpus_per_node) * cluster.gpus_per_node
    text = f"no layout of {model.name} fits on {cluster.n_gpus} x {cluster.gpu.name} ({capacity / GIB:.0f} GiB)"
    if result.smallest is not None:
        memory = result.smallest.memory
        text += (f": the smallest, {result.smallest.layout}, needs {memory.total / GIB:.1f} GiB per GPU "
                 f"({(memory.total - capacity) / GIB:.1f} GiB over)")
    text += (f"; model states alone are {states / GIB:.0f} GiB (16 bytes/parameter), so use at least "
             f"~{max(needed_gpus, cluster.gpus_per_node)} GPUs, a shorter sequence or smaller batch, "
             "or allow more pp / offload")
    return text


def check_cluster(cluster: ClusterSpec) -> None:
    """Rules on the GPU count that no layout can repair."""
    n, per_node = cluster.n_gpus, cluster.gpus_per_node
    if n < 1:
        raise PlaitError(f"--gpus {n}: need at least one GPU")
    if n > per_node and n % per_node:
        lower, upper = n // per_node * per_node, -(-n // per_node) * per_node
        raise PlaitError(f"{n} GPUs is not a whole number of {per_node}-GPU nodes; use {lower} or {upper}")


def require_plans(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, result: SearchResult,
                  constraints: SearchConstraints = SearchConstraints()) -> list[Plan]:
    if result.candidates == 0:
        fixed = ", ".join(f"{k}={v}" for k, v in constraints.fixed)
        raise PlaitError(
            f"no valid layout of {model.name} for {cluster.n_gpus} GPUs and global batch {job.global_batch}"
            + (f" with {fixed}" if fixed else "")
            + f": dp = GPUs/(tp·pp·cp) must divide the global batch, tp must divide n_heads={model.n_heads}, "
            f"n_kv_heads={model.n_kv_heads} and ffn_hidden={model.ffn_hidden}, pp must be <= n_layers={model.n_layers}; "
            "try a global batch that is a multiple of the GPU count")
    if result.rule_errors:
        raise PlaitError(f"no valid layout of {model.name} on {cluster.n_gpus} GPUs: "
                         + "; ".join(e.message for e in result.rule_errors))
    if not result.all_fitting():
        raise PlaitError(nothing_fits_message(model, cluster, result))
    if not result.plans:
        best = result.all_fitting()[0]
        raise PlaitError(f"none of the {len(result.all_fitting())} layouts of {model.name} that fit on "
                         f"{cluster.n_gpus} x {cluster.gpu.name} is one plait train runs yet; the fastest, "
                         f"{best.layout}: " + "; ".join(v.message for v in best.runtime_violations)
                         + " (plait plan --any-runtime ranks them anyway)")
    return result.plans
