"""The layouts the search enumerates (``plait.plan.search``), as groups that differ only in ZeRO
stage, hybrid sharding and checkpoint policy, so a lower bound on their step time covers each group
(``plait.plan.cost.step_lower_bounds``). No torch."""

from __future__ import annotations

from dataclasses import dataclass

from plait.plan.attention_choice import fastest_attention
from plait.plan.context.choice import fastest_cp_impl
from plait.plan.params import DEFAULT_PARAMS, CostParams
from plait.spec.hardware import ClusterSpec
from plait.spec.layout import CKPT_POLICIES, RUNTIME_CP_IMPLS, JobSpec, Layout
from plait.spec.model import ModelSpec
from plait.spec.units import divisors

CKPT_ORDER = CKPT_POLICIES  # tried in this order: cheapest recompute first
# keys the enumeration does not vary (plait.plan.search's docstring says why), with the value it uses unless pinned
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



def options(constraints: SearchConstraints, key: str, default: list) -> list:
    """The values of ``key`` to try: the pinned one, else ``default``."""
    value = constraints.fixed_value(key)
    return [value] if value is not None else default


@dataclass(frozen=True)
class CandidateGroup:
    """Layouts of the search that differ only in ZeRO stage, hybrid sharding and checkpoint policy
    (and what the search derives from them: cp_impl, loss, offload), so ``step_lower_bound`` bounds them all."""

    base: Layout  # the first variant's layout (its cp_impl not chosen yet)
    variants: tuple[tuple[tuple[int, ...], int, int, str], ...]  # (enumeration order, zero, hsdp, ckpt)


def candidate_groups(model: ModelSpec, cluster: ClusterSpec, job: JobSpec,
                     constraints: SearchConstraints = SearchConstraints(), params: CostParams = DEFAULT_PARAMS):
    """Yield the search's layouts as ``CandidateGroup``s, in the enumeration's order (each variant's
    ``order`` tuple sorts as the flat enumeration: tp, cp, pp, mbs, schedule, zero, hsdp, experts, ckpt).
    ``attn``, unless pinned, is the fastest kernel plait's runtime runs the model with (priced with
    ``params``: ``plait.plan.attention_choice``)."""
    n = cluster.n_gpus
    heads_gcd = _gcd(model.n_heads, model.n_kv_heads, model.ffn_hidden)
    tps = options(constraints, "tp", [t for t in divisors(heads_gcd) if n % t == 0 and t <= cluster.gpus_per_node])
    cps = options(constraints, "cp", [c for c in divisors(n) if c & (c - 1) == 0 and job.seq_len % (2 * c) == 0
                                         and (c == 1 or job.seq_len // c >= 4096)])
    zeros = options(constraints, "zero", [0, 1, 2, 3])
    ckpts = options(constraints, "ckpt", list(CKPT_ORDER))
    kernels = {key: options(constraints, key, [default])[0] for key, default in KERNEL_DEFAULTS.items()}
    if constraints.fixed_value("attn") is None:
        kernels["attn"] = fastest_attention(model, cluster.gpu, params, job.seq_len, job.doc_len)
    skeleton = 0
    for tp in tps:
        for cp in cps:
            if n % (tp * cp):
                continue
            rest = n // (tp * cp)
            pps = options(constraints, "pp", [p for p in divisors(rest) if p <= min(constraints.max_pp, model.n_layers)])
            for pp in pps:
                if rest % pp:
                    continue
                dp = rest // pp
                if constraints.fixed_value("dp") not in (None, dp) or job.global_batch % dp:
                    continue
                per_rank = job.global_batch // dp
                mbss = options(constraints, "mbs", [m for m in divisors(per_rank) if m <= constraints.max_mbs])
                for mbs in mbss:
                    if per_rank % mbs:
                        continue
                    micro = per_rank // mbs
                    for schedule, vpp in _schedules(model, pp, micro, constraints):
                        skeleton += 1
                        split = "even" if model.n_layers % (pp * vpp) == 0 else "uneven"
                        sharding = [(zi, zero, hi, hsdp) for zi, zero in enumerate(zeros) if not (zero and dp * cp == 1)
                                    for hi, hsdp in enumerate(_hsdp_options(zero, dp, tp * cp, cluster.gpus_per_node,
                                                                            constraints))]
                        if not sharding:
                            continue
                        for ei, (ep, etp) in enumerate(_expert_options(model, tp, tp * cp * dp, constraints)):
                            variants = tuple(((skeleton, zi, hi, ei, ci), zero, hsdp, ckpt)
                                             for zi, zero, hi, hsdp in sharding for ci, ckpt in enumerate(ckpts))
                            _, zero, hsdp, ckpt = variants[0]
                            base = Layout(dp=dp, tp=tp, pp=pp, cp=cp, vpp=vpp, mbs=mbs, zero=zero, hsdp=hsdp,
                                          ckpt=ckpt, schedule=schedule, split=split, ep=ep, etp=etp, **kernels)
                            yield CandidateGroup(base, variants)


def group_layouts(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, group: CandidateGroup,
                  constraints: SearchConstraints, params: CostParams, cp_impls: tuple[str, ...], *,
                  full_first: bool = False):
    """Yield (enumeration order, layout) for each variant of ``group``: a cp > 1 layout gets the
    context-parallel kernel the planner prices fastest (``fastest_cp_impl``) unless pinned.
    ``full_first``: for each ZeRO stage and hybrid sharding, ckpt=full (the least activation memory of
    the policies) before the others, so that a search can skip those when it does not fit."""
    choose = group.base.cp > 1 and constraints.fixed_value("cp_impl") is None
    variants = group.variants
    if full_first:
        variants = sorted(variants, key=lambda v: (v[0][1], v[0][2], v[3] != "full"))
    for order, zero, hsdp, ckpt in variants:
        base = group.base
        layout = base if (zero, hsdp, ckpt) == (base.zero, base.hsdp, base.ckpt) else \
            base.variant(zero=zero, hsdp=hsdp, ckpt=ckpt)
        if choose:
            layout = layout.variant(cp_impl=fastest_cp_impl(model, cluster, job, layout, params, cp_impls))
        yield order, layout


def candidate_layouts(model: ModelSpec, cluster: ClusterSpec, job: JobSpec,
                      constraints: SearchConstraints = SearchConstraints(), params: CostParams = DEFAULT_PARAMS,
                      cp_impls: tuple[str, ...] = RUNTIME_CP_IMPLS):
    """Yield the layouts the search considers (before the memory check); ``params`` price the
    context-parallel kernels a cp > 1 layout gets (the fastest of ``cp_impls``: ``fastest_cp_impl``)."""
    for group in candidate_groups(model, cluster, job, constraints, params):
        for _, layout in group_layouts(model, cluster, job, group, constraints, params, cp_impls):
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
    for schedule in options(constraints, "schedule", list(constraints.schedules)):
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
    etps = options(constraints, "etp", sorted({1, tp}))
    for etp in etps:
        for ep in options(constraints, "ep", divisors(model.moe.n_experts)):
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
