"""The planner on mixture-of-experts models: expert sharding, saved activations, all-to-all, search."""

from __future__ import annotations

from dataclasses import replace
from math import comb

import pytest

from plait.cli import main
from plait.plan import comm
from plait.plan.cost import estimate_step
from plait.plan.memory import estimate_memory
from plait.plan.moe.memory import moe_layer_saved_bytes
from plait.plan.moe.sync import moe_sync_layer
from plait.plan.moe.timing import remote_nodes_per_token
from plait.plan.params import DEFAULT_PARAMS
from plait.plan.candidates import candidate_layouts
from plait.plan.search import SearchConstraints, search
from plait.spec.hardware import get_cluster
from plait.spec.layout import JobSpec, Layout
from plait.spec.models import MODELS
from plait.spec.moe.counts import blocks_params, expert_params_total

MIXTRAL = MODELS["mixtral-8x7b"]
CLUSTER = get_cluster("dgx-h100", 64)
JOB = JobSpec(512, 4096)


def test_expert_states_are_sharded_by_ep_and_the_expert_data_parallel_group():
    memory = estimate_memory(MIXTRAL, CLUSTER, JOB, Layout.parse("dp=64,ep=8,zero=1,ckpt=full"))
    experts = expert_params_total(MIXTRAL)
    dense = MIXTRAL.total_params() - experts
    norms = MIXTRAL.total_params() - blocks_params(MIXTRAL)  # embeddings, head, final norm: all dense
    assert dense > norms
    assert memory.weights == pytest.approx(2 * (dense + experts / 8))
    # optimizer: dense states over dp = 64 ranks, the experts' over edp = 64 / 8 = 8 ranks
    assert memory.optimizer == pytest.approx(12 * (dense / 64 + experts / 8 / 8))
    zero3 = estimate_memory(MIXTRAL, CLUSTER, JOB, Layout.parse("dp=64,ep=8,zero=3,ckpt=full"))
    assert zero3.weights == pytest.approx(2 * (dense / 64 + experts / 8 / 8))


def test_moe_block_saved_bytes_item_by_item():
    tiny = MODELS["tiny-moe"]
    layout = Layout.parse("dp=1,mbs=2")
    tokens, h, e, k, f, fs = 256 * 2, 128, 8, 2, 96, 96
    routed = tokens * k
    assert moe_layer_saved_bytes(tiny, layout, 256) == {
        "moe_router_probs": 4 * tokens * e, "moe_combine_weights": 4 * tokens * k,
        "moe_dispatched": 2 * routed * h, "moe_up": 2 * 2 * routed * f, "moe_act_out": 2 * 2 * routed * f,
        "moe_expert_out": 2 * routed * h, "moe_shared_up": 2 * 2 * tokens * fs, "moe_shared_act_out": 2 * 2 * tokens * fs,
        "moe_topk_indices": 8 * tokens * k, "moe_topk_norm": 4 * tokens * (k + 1),
        "moe_token_indices": 2 * 8 * routed, "moe_aux_fraction": 4 * e,
    }
    # sequence parallelism hands the router and dispatch a tp shard; the shared experts split their ffn
    sp = moe_layer_saved_bytes(tiny, Layout.parse("tp=2,mbs=2"), 256)
    assert sp["moe_dispatched"] == 2 * routed / 2 * h and sp["moe_shared_up"] == 2 * 2 * tokens * fs / 2
    capped = replace(tiny, moe=replace(tiny.moe, capacity_factor=1.25))
    assert moe_layer_saved_bytes(capped, layout, 256)["moe_dispatched"] == 2 * routed * h  # balanced: under the cap


def test_remote_nodes_per_token():
    top1 = replace(MIXTRAL.moe, top_k=1)
    assert remote_nodes_per_token(top1, 4) == pytest.approx(3 / 4)
    miss = comb(4, 2) / comb(8, 2)  # 8 experts on 2 nodes, top-2: no expert on a given node
    assert remote_nodes_per_token(MIXTRAL.moe, 2) == pytest.approx(2 * (1 - miss) / 2)
    v3 = MODELS["deepseek-v3"].moe  # group-limited: at most 4 of 8 nodes
    assert remote_nodes_per_token(v3, 8) == pytest.approx(4 * 7 / 8)


def test_hierarchical_all_to_all_never_slower_than_flat():
    from plait.spec.layout import GroupPlacement

    group = GroupPlacement(32, 1, 4, 8)
    flat = comm.all_to_all(CLUSTER, group, 1e8)
    assert comm.all_to_all_hierarchical(CLUSTER, group, 1e8, 1e8) <= flat  # both levels at once
    assert comm.all_to_all_hierarchical(CLUSTER, group, 1e8, 1e7) < flat
    inside = GroupPlacement(8, 1, 1, 8)
    assert comm.all_to_all_hierarchical(CLUSTER, inside, 1e8, 0.0) == comm.all_to_all(CLUSTER, inside, 1e8)


def test_all_to_all_is_itemized_and_overlap_hides_part_of_it():
    base = "dp=64,ep=8,zero=1,ckpt=selective,mbs=2"
    none = estimate_step(MIXTRAL, CLUSTER, JOB, Layout.parse(base))
    # across nodes (ep=64: 8 nodes) chunked hides more all-to-all than its chunks cost; inside one
    # node Mixtral's 352 MB of expert weights per layer make the chunks' gradient sums cost more
    dsv3 = "dp=64,ep=64,zero=1,ckpt=selective,mbs=1"
    deepseek = [estimate_step(MODELS["deepseek-v3"], CLUSTER, JOB, Layout.parse(dsv3 + overlap))
                for overlap in ("", ",moe_overlap=chunked")]
    assert deepseek[0].items()["ep_comm"] > deepseek[1].ep_comm > 0
    chunked = estimate_step(MIXTRAL, CLUSTER, JOB, Layout.parse(base + ",moe_overlap=chunked"))
    assert chunked.ep_comm > none.ep_comm > 0
    ep1 = estimate_step(MIXTRAL, CLUSTER, JOB, Layout.parse("dp=64,zero=1,ckpt=selective,mbs=2"))
    assert ep1.ep_comm == 0.0  # ep=1: no all-to-all, and the dispatcher's sync is its own item, not "ep comm"
    for step, text in ((ep1, "dp=64,zero=1,ckpt=selective,mbs=2"), (none, base)):  # 32 layers x 4 micro-batches
        per_layer = moe_sync_layer(MIXTRAL, CLUSTER, Layout.parse(text), DEFAULT_PARAMS).total
        assert step.moe_sync == pytest.approx(32 * 4 * per_layer)
    assert ep1.moe_sync > 0.0
    # across nodes the all-to-all costs more than inside one. plait's runtime takes ep from the dp ranks
    # (stride tp=8 in the default order: 8 nodes; dp innermost: one node); Megatron-Core takes the tp
    # ranks first (the default order: one node)
    dp_inside = Layout.parse("tp=8,dp=8,ep=8,zero=1,ckpt=selective,mbs=2,order=dp-tp-cp-pp")
    tp_inside = Layout.parse("tp=8,dp=8,ep=8,zero=1,ckpt=selective,mbs=2")
    assert (estimate_step(MIXTRAL, CLUSTER, JOB, tp_inside).ep_comm
            > estimate_step(MIXTRAL, CLUSTER, JOB, dp_inside).ep_comm)
    assert (estimate_step(MIXTRAL, CLUSTER, JOB, dp_inside, runtime="megatron-core").ep_comm
            > estimate_step(MIXTRAL, CLUSTER, JOB, tp_inside, runtime="megatron-core").ep_comm)


def test_mfu_counts_active_parameters():
    step = estimate_step(MIXTRAL, CLUSTER, JOB, Layout.parse("dp=64,ep=8,zero=1,ckpt=selective"))
    assert step.model_flops_per_token == MIXTRAL.model_flops_per_token(4096)
    assert step.model_flops_per_token < 6 * MIXTRAL.total_params() / 3


def test_dense_models_get_no_expert_candidates():
    llama = MODELS["llama3-8b"]
    layouts = list(candidate_layouts(llama, CLUSTER, JOB, SearchConstraints(fixed=(("tp", 1), ("pp", 1)))))
    assert layouts and {(lay.ep, lay.etp) for lay in layouts} == {(1, 1)}


def test_search_ranks_expert_parallel_layouts():
    fixed = (("ckpt", "selective"), ("pp", 1), ("tp", 1), ("zero", 1))
    result = search(MIXTRAL, CLUSTER, JOB, SearchConstraints(fixed=fixed))
    # ZeRO-1 without pp: 16 bytes per expert parameter fit only split 4 or 8 ways
    assert {p.layout.ep for p in result.plans} == {4, 8} and result.rejected_oom > 0
    assert result.plans[0].layout.ep > 1


def test_plan_explain_itemizes_the_expert_all_to_all(capsys):
    code = main(["plan", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "64", "--global-batch", "512",
                 "--seq-len", "4096", "--layout", "dp=64,ep=8,zero=1,ckpt=selective", "--explain"])
    out = capsys.readouterr().out
    assert code == 0 and "ep comm" in out and "ep=8" in out


def test_plan_explain_says_what_moe_sync_holds(capsys):
    """The ``moe sync`` item comes with its parts per MoE layer and micro-batch, as the planner counts
    them: plait's runtime issues 3+6 grouped expert GEMMs, Megatron-Core 2+4 per local expert."""
    import re

    from plait.plan.moe.sync import moe_kernels

    for stack, gemms in (("plait", 3 + 6), ("megatron-core", 1 * (2 + 4))):  # ep=8: one local expert
        code = main(["plan", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "64", "--global-batch",
                     "512", "--seq-len", "4096", "--layout", "dp=64,ep=8,zero=1,ckpt=selective", "--stack", stack])
        out = " ".join(capsys.readouterr().out.split())
        found = re.search(r"moe sync, per MoE layer and micro-batch: .* and (\d+) kernel launches .*; (\d+) of them", out)
        assert code == 0 and found, out
        runtime = "torch" if stack == "plait" else "megatron-core"
        want = sum(moe_kernels(MIXTRAL, Layout.parse("dp=64,ep=8,zero=1,ckpt=selective"), DEFAULT_PARAMS, runtime,
                               CLUSTER.gpu))
        assert (int(found.group(1)), int(found.group(2))) == (round(want), gemms)


def test_the_bottleneck_is_named_as_the_step_table_names_it(capsys):
    """An all-to-all-bound layout (DeepSeek-V3 at ep=256 over 32 nodes): the plans table's bottleneck
    column and the line under the step table say "ep comm", as the step table's item does."""
    code = main(["plan", "--model", "deepseek-v3", "--cluster", "dgx-h100", "--gpus", "256", "--global-batch", "1024",
                 "--seq-len", "4096", "--layout", "dp=256,ep=256,zero=3,ckpt=full"])
    out = capsys.readouterr().out
    import re

    assert code == 0 and "bottleneck: ep comm" in out and re.search(r"│ ep comm\s*│", out) and "ep_comm" not in out


def test_plait_runtime_shards_experts_over_dp_cp_only_and_sums_their_gradients_over_tp():
    """plait's runtime carves ep out of dp·cp and holds the same experts on every tp rank (etp = 1):
    their optimizer states shard over dp·cp/ep = 32/8 = 4 ranks, not Megatron's tp·cp·dp/ep = 8; and
    with sp it sums their gradients over tp once a step (plait.run.parallel.moe_tensor.sync_gradients)."""
    from plait.plan.moe.timing import expert_tp_comm
    from plait.plan.params import DEFAULT_PARAMS
    from plait.plan.moe.memory import stage_expert_params
    from plait.spec.layout import group_of
    from plait.plan import comm

    lay = Layout.parse("dp=32,tp=2,ep=8,zero=1,ckpt=full")
    experts = expert_params_total(MIXTRAL) / 8
    mine = estimate_memory(MIXTRAL, CLUSTER, JOB, lay, runtime="torch")
    megatron = estimate_memory(MIXTRAL, CLUSTER, JOB, lay, runtime="megatron")
    assert mine.optimizer - megatron.optimizer == pytest.approx(12 * (experts / 4 - experts / 8))
    layers = MIXTRAL.n_layers
    grads = DEFAULT_PARAMS.grad_reduce_bytes * stage_expert_params(MIXTRAL, lay, layers)
    tp_group = group_of(lay, CLUSTER.gpus_per_node, ("tp",))
    assert expert_tp_comm(MIXTRAL, CLUSTER, lay, layers, DEFAULT_PARAMS, "torch") == pytest.approx(
        comm.all_reduce(CLUSTER, tp_group, grads))
    assert expert_tp_comm(MIXTRAL, CLUSTER, lay, layers, DEFAULT_PARAMS, "megatron") == 0.0
    assert expert_tp_comm(MIXTRAL, CLUSTER, lay.variant(sp=False), layers, DEFAULT_PARAMS, "torch") == 0.0


def test_plait_prices_experts_it_cannot_run_in_fp8_in_bf16_and_megatron_in_fp8():
    """plait's runtime gives its experts torchao's fp8 grouped GEMM only when the hidden width and the
    expert ffn / etp are multiples of 16 (``routed_expert_precision``; the runtime's
    ``experts_fp8_blocker`` reads the same FP8_ALIGNMENT); otherwise they run, and are priced, in bf16:
    no faster than bf16, and without torchao's cast kernels. Megatron's fp8 covers them either way."""
    from plait.plan.moe.sync import FP8_GROUPED_KERNELS, PROJECTION_GEMMS, expert_gemm_kernels
    from plait.plan.moe.timing import routed_expert_gemms

    odd = replace(MIXTRAL, moe=replace(MIXTRAL.moe, expert_ffn=14344))  # 14344 = 16·896 + 8
    gpu, rows = CLUSTER.gpu, 65536.0
    for model, runs_fp8 in ((MIXTRAL, True), (odd, False)):
        bf16 = routed_expert_gemms(model, gpu, DEFAULT_PARAMS, Layout.parse("dp=64,ep=8"), rows)
        fp8 = routed_expert_gemms(model, gpu, DEFAULT_PARAMS, Layout.parse("dp=64,ep=8,precision=fp8"), rows)
        megatron = routed_expert_gemms(model, gpu, DEFAULT_PARAMS, Layout.parse("dp=64,ep=8,precision=fp8"), rows,
                                       runtime="megatron-core")
        assert megatron < bf16
        assert (fp8 < bf16) if runs_fp8 else (fp8 == pytest.approx(bf16))
        kernels = expert_gemm_kernels(model, Layout.parse("dp=64,ep=8,precision=fp8"), "torch", gpu)
        extra = tuple(3 * k if runs_fp8 else 0 for k in FP8_GROUPED_KERNELS)
        assert kernels == tuple(g + e for g, e in zip(PROJECTION_GEMMS, extra))
    # the rule reads the ffn after etp: 14336 / 2 = 7168 stays aligned
    assert routed_expert_gemms(MIXTRAL, gpu, DEFAULT_PARAMS, Layout.parse("dp=64,tp=2,etp=2,precision=fp8"), rows) < \
        routed_expert_gemms(MIXTRAL, gpu, DEFAULT_PARAMS, Layout.parse("dp=64,tp=2,etp=2"), rows)


DSV3_RECIPE = "dp=128,pp=16,ep=64,zero=1,precision=fp8,ckpt=balanced,mbs=1,split=uneven"


def test_deepseek_v3_s_published_recipe_fits_80_gb_on_h800_and_h100():
    """DeepSeek-V3's pre-training layout (technical report, arXiv 2412.19437, sections 3.2-3.3: 2,048
    H800s, 16-way pipeline, 64-way expert parallelism over 8 nodes, ZeRO-1, no tensor parallelism, fp8
    GEMMs, the RMSNorms and MLA's up-projections recomputed; batch 15,360 × 4,096 tokens) as plait
    states it: ``ckpt=balanced`` recomputes the norms and element-wise ops and keeps the GEMM outputs,
    the up-projections' too (more than DeepSeek keeps), so a fit is conservative. It fits 80 GB on
    both presets; keeping the element-wise outputs too (``selective``) or the attention whole (``mlp``) does
    not (docs/planner.md)."""
    model, job = MODELS["deepseek-v3"], JobSpec(15360, 4096)
    for name in ("hgx-h800", "dgx-h100"):
        cluster = get_cluster(name, 2048)
        recipe = estimate_memory(model, cluster, job, Layout.parse(DSV3_RECIPE))
        assert recipe.total <= recipe.capacity == 80 * 2 ** 30, f"{name}: {recipe.total / 2 ** 30:.1f} GiB"
        for policy in ("selective", "mlp"):  # keeping the element-wise outputs, or the attention whole
            kept = estimate_memory(model, cluster, job, Layout.parse(DSV3_RECIPE.replace("balanced", policy)))
            assert kept.total > kept.capacity, policy
