"""Property tests: invariants of the specs, the memory and time model and the search, on random inputs.

Every strategy draws *valid* inputs (a ModelSpec that constructs, a preset cluster with a GPU count
that the search can handle quickly, a job whose batch is a multiple of the GPU count), so a failure
is a failure of plait, not of the strategy. Example counts are kept small: the whole file runs in
well under a minute on two cores.
"""

from __future__ import annotations

import dataclasses
import math

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from plait.plan.cost import estimate_step
from plait.plan.memory import estimate_memory, is_risky, rank_memory, stage_params
from plait.plan.search import SearchConstraints, search
from plait.spec.hardware import CLUSTERS, ClusterSpec
from plait.spec.layout import (
    ATTENTION_KERNELS,
    CKPT_POLICIES,
    OFFLOAD_TARGETS,
    PARALLEL_DIMS,
    PRECISIONS,
    SCHEDULES,
    JobSpec,
    Layout,
)
from plait.spec.model import ModelSpec
from plait.spec.validate import errors_of, validate

FAST = SearchConstraints(max_pp=8, max_mbs=4)
SEQ_LENS = (512, 1024, 2048, 4096)
GPU_COUNTS = (1, 2, 4, 8, 16, 32)
REL = 1e-9  # relative slack for float comparisons of sums


def _settings(n: int):
    return settings(max_examples=n, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _le(a: float, b: float) -> bool:
    """a <= b up to rounding of sums of floats."""
    return a <= b + REL * max(abs(a), abs(b), 1.0)


# ------------------------------------------------------------------------------------ strategies
@st.composite
def models(draw, max_layers: int = 48, arch=None) -> ModelSpec:
    arch = arch or draw(st.sampled_from(("llama", "gpt")))
    n_heads = draw(st.sampled_from((4, 8, 16, 32)))
    head_dim = draw(st.sampled_from((64, 128)))
    hidden = n_heads * head_dim
    n_kv_heads = n_heads if arch == "gpt" else draw(st.sampled_from(_divisors(n_heads)))
    # a multiple of 64 between 1x and 4x hidden: divisible by every tp the search may try
    ffn_hidden = 64 * draw(st.integers(hidden // 64, 4 * hidden // 64))
    return ModelSpec(
        name="random",
        arch=arch,
        n_layers=draw(st.integers(2, max_layers)),
        hidden=hidden,
        ffn_hidden=ffn_hidden,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        vocab=draw(st.integers(1000, 130000)),
        max_seq_len=draw(st.sampled_from((4096, 8192))),  # >= every drawn seq_len (gpt positions)
        tied_embeddings=draw(st.booleans()),
        dropout=draw(st.booleans()),
    )


@st.composite
def clusters(draw, gpu_counts=GPU_COUNTS) -> ClusterSpec:
    preset = draw(st.sampled_from(sorted(CLUSTERS)))
    return CLUSTERS[preset].with_gpus(draw(st.sampled_from(gpu_counts)))


@st.composite
def jobs(draw, n_gpus: int, max_factor: int = 8) -> JobSpec:
    return JobSpec(global_batch=n_gpus * draw(st.integers(1, max_factor)), seq_len=draw(st.sampled_from(SEQ_LENS)))


@st.composite
def problems(draw, gpu_counts=GPU_COUNTS, max_layers: int = 48):
    model = draw(models(max_layers=max_layers))
    cluster = draw(clusters(gpu_counts))
    return model, cluster, draw(jobs(cluster.n_gpus))


def _tp_options(model: ModelSpec) -> list[int]:
    g = math.gcd(model.n_heads, model.n_kv_heads, model.ffn_hidden)
    return [t for t in _divisors(g) if t <= 64]


# ------------------------------------------------------------------------------------ search
@_settings(60)
@given(problems())
def test_search_returns_only_valid_fitting_layouts_fastest_first(problem):
    model, cluster, job = problem
    result = search(model, cluster, job, FAST)
    plans = result.plans
    assert len(plans) <= result.evaluated
    for plan in plans:
        layout = plan.layout
        assert layout.world_size == cluster.n_gpus, str(layout)
        errors = errors_of(validate(model, cluster, job, layout))
        assert not errors, f"{layout}: {[str(e) for e in errors]}"
        assert plan.fits and plan.memory.total <= plan.memory.capacity == cluster.gpu.hbm_bytes, str(layout)
        assert layout.pp <= FAST.max_pp and layout.mbs <= FAST.max_mbs
        # the plan's numbers are those of its layout (offload retries must not leave stale figures)
        assert plan.memory == estimate_memory(model, cluster, job, layout)
        assert plan.step == estimate_step(model, cluster, job, layout)
    # fastest first, with the memory headroom's order (rank_with_headroom): layouts with headroom before
    # those inside it, and first the roomiest of the safe layouts within 1% of the fastest safe one
    safe = [p for p in plans if not is_risky(p.memory)]
    risky = [p for p in plans if is_risky(p.memory)]
    assert plans == (safe + risky if safe else risky), "a risky layout is ranked before a safe one"
    for group in (safe[1:], risky):
        rates = [p.step.tokens_per_s_per_gpu for p in group]
        assert all(a >= b for a, b in zip(rates, rates[1:])), "plans are not sorted fastest first"
    if safe:
        assert safe[0].step.tokens_per_s_per_gpu >= 0.99 * max(p.step.tokens_per_s_per_gpu for p in safe)
    assert len({str(p.layout) for p in plans}) == len(plans), "the same layout is listed twice"


@_settings(40)
@given(problems(gpu_counts=(1, 2, 4, 8), max_layers=24))
def test_step_time_items_are_non_negative_and_add_up(problem):
    model, cluster, job = problem
    plans = search(model, cluster, job, FAST).plans
    assume(plans)
    for plan in plans:
        step = plan.step
        items = step.items()
        assert all(v >= 0 and math.isfinite(v) for v in items.values()), (str(plan.layout), items)
        assert step.step_time > 0
        assert _le(step.compute, step.step_time)
        # the step is exactly the critical path these items itemize
        assert math.isclose(step.step_time, sum(items.values()), rel_tol=1e-9), (str(plan.layout), items)
        assert 0.0 < step.mfu < 1.0, (str(plan.layout), step.mfu)
        assert _le(step.mfu, step.hfu) and step.hfu < 1.0, (str(plan.layout), step.mfu, step.hfu)
        if plan.layout.ckpt == "none":
            assert math.isclose(step.mfu, step.hfu, rel_tol=1e-12)


# ------------------------------------------------------------------------------------ memory
@_settings(100)
@given(models(), st.sampled_from(sorted(CLUSTERS)), st.sampled_from(SEQ_LENS), st.integers(1, 64), st.data())
def test_weights_per_gpu_do_not_grow_with_tp_or_pp(model, cluster_name, seq_len, batch, data):
    """Weight bytes per GPU never grow when tp or pp grows (zero=0, everything else equal).

    ``estimate_memory`` itemizes the most loaded GPU *by total*: with pp > 1 that can be the last
    stage (logits) for one layout and the first stage (embedding, gpt position table) for the next,
    so its ``weights`` item alone is not monotone in tp/pp. The per-GPU maximum over the stages
    is, and so is the single stage of pp=1 - both are checked here.
    """
    cluster = CLUSTERS[cluster_name]
    job = JobSpec(global_batch=batch, seq_len=seq_len)
    t1, t2 = sorted(data.draw(st.lists(st.sampled_from(_tp_options(model)), min_size=2, max_size=2), label="tps"))
    p1, p2 = sorted(data.draw(st.lists(st.sampled_from(_divisors(model.n_layers)), min_size=2, max_size=2),
                              label="pps"))
    ckpt = data.draw(st.sampled_from(CKPT_POLICIES), label="ckpt")

    def reported(tp: int, pp: int) -> float:
        return estimate_memory(model, cluster, job, Layout(tp=tp, pp=pp, ckpt=ckpt)).weights

    def most_per_gpu(tp: int, pp: int) -> float:
        layout = Layout(tp=tp, pp=pp, ckpt=ckpt)
        per_stage = [2.0 * params for params in stage_params(model, layout).values()]  # bf16 weights
        assert any(math.isclose(reported(tp, pp), w, rel_tol=1e-12) for w in per_stage)
        return max(per_stage)

    weights = most_per_gpu
    assert _le(weights(t2, p1), weights(t1, p1)), (t1, t2, p1)  # more tp, same pp
    assert _le(weights(t2, p2), weights(t1, p2)), (t1, t2, p2)
    assert _le(weights(t1, p2), weights(t1, p1)), (t1, p1, p2)  # more pp, same tp
    assert _le(weights(t2, p2), weights(t2, p1)), (t2, p1, p2)
    assert _le(weights(t2, p2), weights(t1, p1))
    if t2 > t1:  # GEMM weights dominate every drawn model: strictly less
        assert weights(t2, 1) < weights(t1, 1)
    # one stage holds everything: the itemized weights are monotone too
    assert _le(reported(t2, 1), reported(t1, 1)), (t1, t2)
    assert _le(reported(t1, p2), reported(t1, 1)) and _le(reported(t2, p2), reported(t1, 1))


@st.composite
def activation_cases(draw):
    model = draw(models())
    pp = draw(st.sampled_from([p for p in _divisors(model.n_layers) if p <= 8]))
    tp = draw(st.sampled_from([t for t in _tp_options(model) if t <= 8]))
    job = JobSpec(global_batch=draw(st.integers(1, 32)), seq_len=draw(st.sampled_from(SEQ_LENS)))
    schedule = "1f1b" if pp == 1 else draw(st.sampled_from(("gpipe", "1f1b", "zero-bubble")))
    layout = Layout(tp=tp, pp=pp, mbs=draw(st.integers(1, 4)), sp=draw(st.booleans()), schedule=schedule,
                    attn=draw(st.sampled_from(ATTENTION_KERNELS)))
    return model, job, layout


def _activations(model, job, layout, ckpt):
    return estimate_memory(model, CLUSTERS["dgx-h100"], job, dataclasses.replace(layout, ckpt=ckpt)).activations


@_settings(150)
@given(activation_cases())
def test_activations_shrink_with_stronger_checkpointing(case):
    """none -> selective -> full and none -> balanced -> full never need more activation memory.

    Every policy also counts the tensors one layer dropped, live again while it is recomputed, so
    with a single layer and micro-batch on a stage checkpointing saves nothing (and must not cost).
    """
    model, job, layout = case
    act = {c: _activations(model, job, layout, c) for c in CKPT_POLICIES}
    assert all(v > 0 for v in act.values()), act
    assert _le(act["selective"], act["none"]), act
    assert _le(act["balanced"], act["none"]), act
    assert _le(act["full"], act["none"]), act
    assert _le(act["full"], act["selective"]), (str(layout), act)
    assert _le(act["full"], act["balanced"]), (str(layout), act)
    layers = model.n_layers // layout.pp
    if layers >= 2:
        assert act["full"] < act["none"], act
        if layout.attn == "eager":
            assert act["selective"] < act["none"], act  # the s x s scores are dropped


@_settings(40)
@given(activation_cases(), st.integers(1, 8))
def test_partial_checkpointing_lies_between_none_and_all_layers(case, ckpt_layers):
    model, job, layout = case
    per_stage = model.n_layers // layout.pp
    assume(ckpt_layers < per_stage)
    for policy in ("selective", "balanced", "full"):
        partial = _activations(model, job, dataclasses.replace(layout, ckpt_layers=ckpt_layers), policy)
        if policy != "full":  # full adds one re-materialized layer on top
            assert _le(_activations(model, job, layout, policy), partial), policy
        assert _le(partial, _activations(model, job, layout, "none")), policy


@st.composite
def zero_cases(draw):
    model = draw(models())
    dp = draw(st.sampled_from((2, 4, 8, 16, 32)))
    tp = draw(st.sampled_from([t for t in _tp_options(model) if t <= 8]))
    pp = draw(st.sampled_from([p for p in _divisors(model.n_layers) if p <= 8]))
    cp = draw(st.sampled_from((1, 2)))
    hsdp = draw(st.sampled_from([h for h in _divisors(dp) if h < dp]))  # the shard group has >= 2 ranks
    layout = Layout(dp=dp, tp=tp, pp=pp, cp=cp, hsdp=hsdp, ckpt=draw(st.sampled_from(CKPT_POLICIES)),
                    opt_offload=draw(st.booleans()))
    job = JobSpec(global_batch=dp * draw(st.integers(1, 8)), seq_len=draw(st.sampled_from(SEQ_LENS)))
    cluster = draw(clusters(gpu_counts=(layout.world_size,)))
    return model, cluster, job, layout


@_settings(100)
@given(zero_cases())
def test_zero_stages_shrink_model_states(case):
    """On every pipeline rank (the most loaded one can change with the stage: zero=0 adds autocast
    copies that make the last stage the heaviest, so its states are compared with the first's)."""
    model, cluster, job, layout = case
    for rank in range(layout.pp):
        states = [rank_memory(model, cluster, job, dataclasses.replace(layout, zero=z), rank).model_states
                  for z in (0, 1, 2, 3)]
        assert _le(states[3], states[2]) and _le(states[2], states[1]) and _le(states[1], states[0]), (rank, states)
        assert states[3] < states[0], (rank, states)  # something is sharded over >= 2 ranks
    if not layout.opt_offload:
        assert states[1] < states[0], states  # the optimizer states are sharded


# ------------------------------------------------------------------------------------ round trips
@st.composite
def layouts(draw) -> Layout:
    vpp = draw(st.sampled_from((1, 1, 2, 3, 4)))
    schedule = "interleaved-1f1b" if vpp > 1 else draw(st.sampled_from(SCHEDULES))
    offload = draw(st.one_of(st.just(0.0), st.just(1.0), st.floats(0.0, 1.0, allow_nan=False)))
    target = draw(st.sampled_from(OFFLOAD_TARGETS))
    ckpt = draw(st.sampled_from(CKPT_POLICIES))
    return Layout(
        dp=draw(st.integers(1, 64)), tp=draw(st.integers(1, 16)), pp=draw(st.integers(1, 32)),
        cp=draw(st.integers(1, 8)), vpp=vpp, mbs=draw(st.integers(1, 16)), zero=draw(st.integers(0, 3)),
        hsdp=draw(st.integers(1, 8)), reshard=draw(st.booleans()), sp=draw(st.booleans()),
        ckpt=ckpt, ckpt_layers=draw(st.integers(0, 8)), schedule=schedule,
        split=draw(st.sampled_from(("even", "uneven"))), offload=offload, offload_target=target,
        opt_offload=draw(st.booleans()), precision=draw(st.sampled_from(PRECISIONS)),
        attn=draw(st.sampled_from(ATTENTION_KERNELS)),
        order="-".join(draw(st.permutations(PARALLEL_DIMS))),
    )


@_settings(150)
@given(layouts())
def test_layout_string_and_dict_round_trip(layout):
    text = str(layout)
    assert Layout.parse(text) == layout, text
    assert str(Layout.parse(text)) == text  # canonical: parsing and printing again changes nothing
    assert Layout.from_dict(layout.to_dict()) == layout
    assert Layout.from_json(layout.to_json()) == layout
    # keys in any order and spaces instead of commas parse the same
    parts = text.split(",")
    assert Layout.parse(" ".join(reversed(parts))) == layout


@_settings(60)
@given(models())
def test_model_json_round_trip(model):
    again = ModelSpec.from_json(model.to_json())
    assert again == model
    assert again.total_params() == model.total_params()
    assert ModelSpec.from_dict(model.to_dict()) == model


@st.composite
def cluster_specs(draw) -> ClusterSpec:
    base = draw(clusters())
    positive = st.floats(min_value=1e-3, max_value=1e16, allow_nan=False, allow_infinity=False)
    fraction = st.floats(min_value=0.01, max_value=1.0, allow_nan=False)
    gpu = dataclasses.replace(base.gpu, hbm_bytes=draw(positive), gemm_efficiency=draw(fraction),
                              kernel_overhead=draw(positive))
    node = draw(st.sampled_from((1, 2, 4, 8, 16)))
    per_nic = draw(st.sampled_from([n for n in (1, 2, 4, 8) if n <= node]))
    return dataclasses.replace(base, gpu=gpu, gpus_per_node=node, gpus_per_nic=per_nic,
                               inter_node_bandwidth=draw(positive), link_efficiency=draw(fraction))


@_settings(60)
@given(cluster_specs())
def test_cluster_json_round_trip(cluster):
    assert ClusterSpec.from_json(cluster.to_json()) == cluster
    assert ClusterSpec.from_dict(cluster.to_dict()) == cluster
    # a preset GPU may be given by name
    named = {**cluster.to_dict(), "gpu": cluster.gpu.name}
    preset = CLUSTERS[next(n for n, c in CLUSTERS.items() if c.gpu.name == cluster.gpu.name)].gpu
    assert ClusterSpec.from_dict(named).gpu == preset


# ------------------------------------------------------------------------------ regression cases
def test_offload_fraction_survives_round_trip():
    layout = Layout(offload=1 / 3)
    assert Layout.parse(str(layout)) == layout


def test_offload_target_survives_round_trip_without_offload():
    layout = Layout(offload_target="disk")
    assert Layout.parse(str(layout)) == layout


def test_recompute_transient_is_counted_for_every_policy():
    model = ModelSpec(name="m", arch="llama", n_layers=2, hidden=256, ffn_hidden=256, n_heads=4, n_kv_heads=1,
                      vocab=1000, max_seq_len=4096)
    job = JobSpec(global_batch=1, seq_len=512)
    layout = Layout(attn="eager")
    # full keeps a subset of what balanced keeps and recomputes a superset: it can never need more
    assert _activations(model, job, layout, "full") <= _activations(model, job, layout, "balanced")
