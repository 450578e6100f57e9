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

The enumeration (``plait.plan.candidates``) yields groups of layouts that differ only in ZeRO stage,
hybrid sharding and checkpoint policy. Asked for the first ``keep`` plans (``plait plan --top``), the
search prices each group's step-time lower bound (``plait.plan.cost.step_lower_bounds``), evaluates
the groups fastest bound first and skips the layouts whose bound is slower than the ``keep`` plans it
has to show; and, per ZeRO stage and hybrid sharding, it prices ckpt=full with the chunked loss and all
offload first: when that does not fit, neither does any other policy's layout (full keeps the fewest
activations). The plans shown are the exhaustive search's (``tests/plan/test_search_bound.py``).
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass

from plait.errors import PlaitError
from plait.plan.candidates import CKPT_ORDER, SearchConstraints, candidate_groups, group_layouts, options
from plait.plan.compiled import compiled_share
from plait.plan.cost import estimate_step, step_lower_bounds
from plait.plan.memory import DEFAULT_HEADROOM, estimate_memory, is_risky
from plait.plan.params import DEFAULT_PARAMS, CostParams
from plait.plan.plan import Plan
from plait.spec.capabilities import runtime_violations
from plait.spec.hardware import ClusterSpec
from plait.spec.layout import RUNTIME_CP_IMPLS, JobSpec, Layout
from plait.spec.model import ModelSpec
from plait.spec.units import GIB
from plait.spec.validate import errors_of, ulysses_splits_heads, validate

NEAR = 0.01  # plans this close to the fastest are "as fast" (rank_with_headroom prefers the most free memory)


@dataclass
class SearchResult:
    plans: list[Plan]  # fitting layouts, fastest first (with runnable=True: only those plait train runs)
    candidates: int  # layouts the enumeration produced (before validation and memory)
    evaluated: int  # valid layouts whose memory was predicted
    rejected_oom: int  # layouts that do not fit (``implied_oom`` of them not evaluated)
    seconds: float
    smallest: Plan | None  # the smallest-memory layout seen (for "nothing fits" messages)
    rule_errors: tuple = ()  # the broken rules of the first candidate, when none was valid
    fitting: list[Plan] | None = None  # every fitting layout, fastest first, runnable or not (None: = plans)
    skipped: int = 0  # layouts not evaluated: slower than the plans ``keep`` asked for (``search``)
    implied_oom: int = 0  # of rejected_oom, not evaluated: ckpt=full with every memory saving does not fit

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


def search(model: ModelSpec, cluster: ClusterSpec, job: JobSpec,
           constraints: SearchConstraints = SearchConstraints(), params: CostParams = DEFAULT_PARAMS, *,
           runnable: bool = False, compile: bool = False, headroom: float = DEFAULT_HEADROOM,
           runtime: str = "torch", cp_impls: tuple[str, ...] = RUNTIME_CP_IMPLS, keep: int | None = None,
           near: float = NEAR) -> SearchResult:
    """All fitting layouts, fastest first (ties: less memory first, then the enumeration's order),
    ranked by ``rank_with_headroom``. ``runtime`` and ``cp_impls``: whose memory model and which
    context-parallel kernels (a stack's: ``plait.spec.stack``; plait's runtime by default).

    Each plan carries the runtime rules it breaks (``Plan.runtime_violations``, with ``plait train
    --compile`` when ``compile``); ``runnable``: keep only the plans that break none. Compiled blocks
    are priced as ``params.compiled_blocks`` says (``plait.plan.compiled``: ``with_compile`` derives it
    from the same setting as ``compile``).

    ``keep``: only the first ``keep`` plans are wanted (``plait plan --top``): groups of layouts
    (``candidate_groups``) are evaluated in the order of a lower bound on their step time
    (``plait.plan.cost.step_lower_bound``), and once ``keep`` fitting plans (runnable ones with
    ``runnable``) outside the memory headroom are found, a group whose bound is slower than the
    ``keep``-th of them by more than ``near`` is skipped (``SearchResult.skipped``): the first ``keep``
    plans, and ``rank_with_headroom``'s choice among those within ``near`` of the fastest, are the
    exhaustive search's (``tests/plan/test_search_bound.py``). The plans after them, and the counts,
    then cover only the layouts evaluated.
    """
    check_cluster(cluster)
    if keep is not None and keep < 1:
        raise PlaitError(f"keep={keep}: at least one plan must be kept")
    start = time.perf_counter()
    ranked: list[tuple[tuple, Plan]] = []
    evaluated = rejected = skipped = implied = 0
    smallest = None
    first_errors = None
    candidates = 0
    groups = list(candidate_groups(model, cluster, job, constraints, params))
    if keep is None:
        groups = [(None, group) for group in groups]
    else:
        groups = _by_bound(model, cluster, job, groups, constraints, params, runtime, cp_impls)
    best_times: list[float] = []  # max-heap (negated) of the ``keep`` fastest wanted plans' step times
    for bounds, group in groups:
        if bounds is not None and len(best_times) == keep and min(bounds.values()) > -best_times[0] / (1 - near):
            skipped += len(group.variants)  # this group's layouts are all slower than the plans to show
            candidates += len(group.variants)
            continue
        too_big = set()  # (zero, hsdp) whose least-memory ckpt=full layout does not fit: no other does (``keep``)
        for order, layout in group_layouts(model, cluster, job, group, constraints, params, cp_impls,
                                           full_first=keep is not None):
            candidates += 1
            if (layout.zero, layout.hsdp) in too_big:
                rejected += 1
                implied += 1
                continue
            slow = bounds is not None and len(best_times) == keep and bounds[layout.ckpt] > -best_times[0] / (1 - near)
            if slow and layout.ckpt != "full":
                skipped += 1
                continue
            violations = validate(model, cluster, job, layout)
            errors = errors_of(violations)
            if errors:
                first_errors = first_errors or errors
                continue
            if bounds is not None and layout.ckpt == "full":  # does the least memory of this sharding fit?
                least = least_memory_variant(layout, constraints)
                memory = estimate_memory(model, cluster, job, least, params, runtime=runtime)
                if not memory.fits:
                    evaluated += 1
                    rejected += 1
                    too_big.add((layout.zero, layout.hsdp))
                    if smallest is None or memory.total < smallest[1].total:
                        smallest = (least, memory)
                    continue
                if slow:
                    skipped += 1
                    continue
            layout, memory = _fitted(model, cluster, job, layout, constraints, params, runtime)
            evaluated += 1
            if smallest is None or memory.total < smallest[1].total:
                smallest = (layout, memory)
            if not memory.fits:
                rejected += 1
                continue
            step = estimate_step(model, cluster, job, layout, params, runtime=runtime)
            plan = Plan(model, cluster, job, layout, memory, step, tuple(violations),
                        tuple(runtime_violations(model, layout, job, compile=compile)),
                        compiled_share(params, model, layout))
            ranked.append(((-step.tokens_per_s_per_gpu, memory.total, order), plan))
            if keep is not None and not is_risky(memory, headroom) and not (runnable and plan.runtime_violations):
                if len(best_times) < keep:
                    heapq.heappush(best_times, -step.step_time)
                elif step.step_time < -best_times[0]:
                    heapq.heapreplace(best_times, -step.step_time)
    ranked.sort(key=lambda item: item[0])
    plans = [plan for _, plan in ranked]
    fitting = None
    if runnable:
        fitting, plans = rank_with_headroom(plans, headroom, near), [p for p in plans if not p.runtime_violations]
    plans = rank_with_headroom(plans, headroom, near)
    seconds = time.perf_counter() - start
    smallest_plan = None
    if smallest is not None:
        layout, memory = smallest
        smallest_plan = Plan(model, cluster, job, layout, memory, estimate_step(model, cluster, job, layout, params),
                             compiled=compiled_share(params, model, layout))
    return SearchResult(plans, candidates, evaluated, rejected, seconds, smallest_plan,
                        tuple(first_errors or ()) if evaluated == 0 else (), fitting, skipped, implied)


def _by_bound(model, cluster, job, groups, constraints, params, runtime, cp_impls) -> list:
    """(step-time lower bound by checkpoint policy, group) pairs, the fastest group first (ties: the
    enumeration's order). A group whose first layout breaks a rule gets bound 0: evaluated, never skipped."""
    choose = constraints.fixed_value("cp_impl") is None
    ckpts = options(constraints, "ckpt", list(CKPT_ORDER))
    out = []
    for index, group in enumerate(groups):
        base = group.base
        if errors_of(validate(model, cluster, job, base)):
            bounds = dict.fromkeys(ckpts, 0.0)
        else:
            impls = tuple(cp_impls) if base.cp > 1 and choose else ()
            if impls:
                impls = tuple(impl for impl in impls if impl != "ulysses" or ulysses_splits_heads(model, base))
            bounds = step_lower_bounds(model, cluster, job, base, params, runtime, impls, tuple(ckpts))
        out.append((min(bounds.values()), index, bounds, group))
    out.sort(key=lambda item: (item[0], item[1]))
    return [(bounds, group) for _, _, bounds, group in out]


def least_memory_variant(layout: Layout, constraints: SearchConstraints) -> Layout:
    """``layout`` (ckpt=full) with every memory saving the search may add (the chunked loss, then
    offload: ``_fitted``): when it does not fit, no checkpoint policy of the same sharding does (full
    keeps the fewest activations; ``tests/plan/test_search_bound.py``)."""
    if constraints.fixed_value("loss") is None:
        layout = layout.variant(loss="fused")
    if constraints.allow_offload:
        layout = layout.variant(**OFFLOAD_STEPS[-1])
    return layout


def _fitted(model, cluster, job, layout, constraints, params, runtime):
    """(layout, memory): ``layout``, or, when it does not fit, the chunked loss and then offload
    where they make it fit (module docstring)."""
    memory = estimate_memory(model, cluster, job, layout, params, runtime=runtime)
    # the chunked loss shrinks the logits term: it helps only where that stage is the peak
    if (not memory.fits and memory.logits > 0 and layout.loss == "unfused"
            and constraints.fixed_value("loss") is None):
        chunked = layout.variant(loss="fused")
        chunked_memory = estimate_memory(model, cluster, job, chunked, params, runtime=runtime)
        if chunked_memory.fits:
            layout, memory = chunked, chunked_memory
    if not memory.fits and constraints.allow_offload and layout.ckpt != "none":
        layout, memory = _with_offload(model, cluster, job, layout, memory, params, runtime)
    return layout, memory


def rank_with_headroom(plans: list[Plan], headroom: float = DEFAULT_HEADROOM, near: float = NEAR) -> list[Plan]:
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
    last = layout.variant(**OFFLOAD_STEPS[-1])
    last_memory = estimate_memory(model, cluster, job, last, params, runtime=runtime)
    if not last_memory.fits:
        return last, last_memory
    for changes in OFFLOAD_STEPS[:-1]:
        candidate = layout.variant(**changes)
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
