"""Expert parallelism on a layout: the validator's MoE rules and where the expert groups lie.

Megatron-Core's expert mesh (as torchtitan's): the tp·cp·dp ranks of one pipeline stage are
re-divided for the experts into etp (innermost) × ep × expert-data-parallel, edp = tp·cp·dp /
(ep·etp). Each rank holds n_experts / ep routed experts of each MoE layer, each split etp ways;
the routed experts' gradients are reduced (and, with ZeRO, their states sharded) over the edp
ranks that hold the same experts. Attention, dense MLPs, shared experts and the router keep the
dense layout (tp, and ZeRO over dp·cp).
"""

from __future__ import annotations

from plait.spec.layout import GroupPlacement, Layout, rank_strides
from plait.spec.units import divisors

_NON_PP = ("tp", "cp", "dp")


def expert_data_parallel(layout: Layout, runtime: str = "megatron") -> int:
    """Ranks holding the same routed experts, at least 1: Megatron-Core re-divides the tp·cp·dp ranks
    into etp × ep × edp (tp·cp·dp / (ep·etp)); plait's runtime (``torch``) carves ep out of dp·cp alone,
    every tp rank holding the same experts (etp = 1) or its own etp slice of them (etp = tp), so its
    experts are sharded by ZeRO over dp·cp / ep (``expert_groups``' edp)."""
    if runtime == "torch":
        return max(1, layout.cp * layout.dp // layout.ep)
    return max(1, layout.tp * layout.cp * layout.dp // (layout.ep * layout.etp))


def expert_tp_sum(layout: Layout, runtime: str = "megatron") -> bool:
    """Whether plait's runtime (``torch``) sums the routed experts' gradients over tp: its tp ranks
    hold the same experts (etp = 1) and, under sequence parallelism, route different tokens."""
    return runtime == "torch" and layout.tp > 1 and layout.etp == 1 and layout.sequence_parallel


def _non_pp_ranks(layout: Layout, dims: tuple[str, ...] = _NON_PP) -> list[int]:
    """Global ranks of the ``dims`` ranks of pipeline stage 0 (rank 0's group), the first of ``dims``
    innermost: Megatron's order (tp, cp, dp) by default."""
    strides = rank_strides(layout)
    ranks = [0]
    for dim in dims:
        ranks = [r + k * strides[dim] for k in range(getattr(layout, dim)) for r in ranks]
    return ranks


def _placement(ranks: list[int], gpus_per_node: int) -> GroupPlacement:
    size = len(ranks)
    nodes = len({r // gpus_per_node for r in ranks}) if size > 1 else 1
    stride = ranks[1] - ranks[0] if size > 1 else 1
    return GroupPlacement(size, stride, nodes, max(1, size // nodes))


def expert_groups(layout: Layout, gpus_per_node: int, runtime: str = "megatron") -> dict[str, GroupPlacement]:
    """Placement of the group holding rank 0 for ``ep`` (the all-to-all), ``etp`` and ``edp``
    (the routed experts' gradient reduction).

    Megatron-Core (``runtime`` megatron or megatron-core) re-divides the tp·cp·dp ranks, tp innermost,
    into etp × ep × edp, so with etp=1 an ep group takes the tp ranks first. plait's runtime
    (``torch``: ``plait.run.parallel.mesh.expert_view``) builds ep from the dp·cp ranks alone, in the
    order ``layout.order`` gives them, ep innermost; its experts are split over the tp ranks
    (etp = tp) or not at all (etp = 1)."""
    ep, etp = layout.ep, layout.etp
    if runtime == "torch":
        ranks = _non_pp_ranks(layout, tuple(d for d in layout.order.split("-") if d in ("cp", "dp")))
        tp_ranks = _non_pp_ranks(layout, ("tp",))
        return {"etp": _placement(tp_ranks[:etp], gpus_per_node), "ep": _placement(ranks[:ep], gpus_per_node),
                "edp": _placement(ranks[0::ep], gpus_per_node)}
    ranks = _non_pp_ranks(layout)
    return {
        "etp": _placement(ranks[:etp], gpus_per_node),
        "ep": _placement(ranks[0:ep * etp:etp], gpus_per_node),
        "edp": _placement(ranks[0::ep * etp], gpus_per_node),
    }


def moe_overlap_noops(model, layout: Layout) -> list[tuple[str, str]]:
    """(rule, message) when ``layout``'s ``moe_overlap`` has nothing to overlap, so that the planner and
    the runtime run it as ``none`` (a warning: the layout runs, the setting does nothing)."""
    mode = layout.moe_overlap
    if mode == "none":
        return []
    if model.moe is None:
        return [("moe-overlap-noop", f"moe_overlap={mode} on {model.name}, a dense model (no experts): "
                 "nothing to overlap; it runs as none")]
    if layout.ep == 1:
        return [("moe-overlap-noop", f"moe_overlap={mode} with ep=1: no expert all-to-all to hide; it runs as "
                 "none (ep > 1 has one)")]
    if mode == "shared" and not model.moe.n_shared:
        return [("moe-overlap-noop", f"moe_overlap=shared but {model.name} has no shared experts to compute "
                 "while the dispatch is in flight; it runs as none (moe_overlap=chunked overlaps the expert GEMMs)")]
    return []


def moe_rule_errors(model, layout: Layout) -> list[tuple[str, str]]:
    """(rule, message) of every MoE rule ``layout`` breaks for ``model``."""
    ep, etp = layout.ep, layout.etp
    moe = model.moe
    if moe is None:
        if ep > 1 or etp > 1:
            return [("moe-dense-ep", f"ep={ep}, etp={etp} but {model.name} is dense (no experts): use ep=1, etp=1")]
        return []
    out = []
    ranks = layout.tp * layout.cp * layout.dp
    if moe.n_experts % ep:
        fits = [d for d in divisors(moe.n_experts) if ranks % (d * etp) == 0]
        out.append(("ep-divides-experts", f"ep={ep} does not divide n_experts={moe.n_experts}; "
                    f"ep that would: {', '.join(map(str, fits)) or 'none'}"))
    if ranks % (ep * etp):
        out.append(("ep-carved", f"ep·etp = {ep}·{etp} = {ep * etp} does not divide tp·cp·dp = "
                    f"{layout.tp}·{layout.cp}·{layout.dp} = {ranks}: expert-parallel ranks are carved out of "
                    "tp·cp·dp"))
    if moe.expert_ffn % etp:
        out.append(("etp-divides-expert-ffn", f"etp={etp} does not divide the expert ffn {moe.expert_ffn}"))
    if moe.n_shared and moe.shared_width % layout.tp:
        out.append(("tp-divides-shared-ffn", f"tp={layout.tp} does not divide the shared expert ffn {moe.shared_width}"))
    return out
