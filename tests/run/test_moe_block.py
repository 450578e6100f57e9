"""The MoE MLP (plait.run.modules.moe) in one process: the grouped experts compute what a per-token
loop over each token's top-k experts computes, and the auxiliary loss's injected gradient is the
gradient of (output loss + scale · aux)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import tolerances  # noqa: E402

from plait.run.model import build_model, init_weights  # noqa: E402
from plait.run.modules.moe import MoEFeedForward  # noqa: E402
from plait.spec.models import get_model  # noqa: E402

SPEC = get_model("tiny-moe")  # hidden 128, 8 experts top-2 (renormalized), expert ffn 96, one shared expert


def moe_layer() -> MoEFeedForward:
    model = build_model(SPEC, "cpu")
    init_weights(model, SPEC, seed=7, device="cpu")
    layer = model.layers["1"].feed_forward
    assert isinstance(layer, MoEFeedForward) and not isinstance(model.layers["0"].feed_forward, MoEFeedForward)
    return layer


def per_token(layer: MoEFeedForward, x: torch.Tensor) -> torch.Tensor:
    """Σ over each token's top-k experts of weight · SwiGLU_e(x), plus the shared expert, token by token."""
    probs = F.softmax(layer.router(x), dim=-1)
    weights, ids = probs.topk(SPEC.moe.top_k, dim=-1)
    weights = weights / weights.sum(-1, keepdim=True)
    w1, w3, w2 = layer.experts.w1, layer.experts.w3, layer.experts.w2
    rows = []
    for t in range(x.shape[0]):
        out = layer.shared(x[t])
        for j in range(SPEC.moe.top_k):
            e = ids[t, j]
            out = out + weights[t, j] * ((F.silu(x[t] @ w1[e]) * (x[t] @ w3[e])) @ w2[e])
        rows.append(out)
    return torch.stack(rows)


def test_grouped_experts_match_the_per_token_computation():
    torch.manual_seed(0)
    layer = moe_layer()
    x = torch.randn(2, 24, SPEC.hidden)
    got = layer(x).reshape(-1, SPEC.hidden)
    want = per_token(layer, x.reshape(-1, SPEC.hidden))
    # the same sums in another order: a dot product of hidden (128) or expert ffn (96) terms, O(1) values
    assert (got - want).abs().max().item() <= tolerances.reduction_rtol(SPEC.hidden) * 4 * want.abs().max().item()


def test_an_expert_without_tokens_still_gets_a_zero_gradient():
    layer = moe_layer()
    x = torch.randn(1, 1, SPEC.hidden)  # one token: top-2 of 8 experts, 6 get no row
    layer(x).sum().backward()
    grads = layer.experts.w1.grad
    assert grads is not None and (grads.flatten(1).abs().sum(1) == 0).sum().item() == SPEC.moe.n_experts - 2


def test_the_aux_loss_gradient_is_injected_with_its_scale():
    torch.manual_seed(1)
    x = torch.randn(2, 16, SPEC.hidden)
    injected, explicit = moe_layer(), moe_layer()
    injected.aux_grad_scale = 0.25
    injected(x).square().mean().backward()
    explicit.aux_coef = 0.0  # no injection: add 0.25·aux to the loss by hand
    x2 = x.reshape(-1, SPEC.hidden)
    probs, _, ids, _ = explicit.route(x2)
    counts = torch.bincount(ids.reshape(-1), minlength=SPEC.moe.n_experts)
    explicit.aux_coef = SPEC.moe.aux_loss_coef
    aux = explicit.aux_loss(probs, counts)
    explicit.aux_coef = 0.0
    (explicit(x).square().mean() + 0.25 * aux).backward()
    assert aux.item() > 0
    got, want = injected.router.weight.grad, explicit.router.weight.grad
    assert torch.allclose(got, want, rtol=0, atol=tolerances.reduction_rtol(SPEC.hidden) * want.abs().max().item())
    assert not torch.equal(got, moe_router_grad_without_aux(x))


def moe_router_grad_without_aux(x: torch.Tensor) -> torch.Tensor:
    layer = moe_layer()
    layer.aux_coef = 0.0
    layer(x).square().mean().backward()
    return layer.router.weight.grad


def test_compiled_blocks_leave_moe_blocks_eager_and_train_the_same():
    from plait.run.parallel.compile import compile_blocks

    tokens = torch.randint(0, SPEC.vocab, (1, 16), generator=torch.Generator().manual_seed(3))
    eager, compiled = build_model(SPEC, "cpu"), build_model(SPEC, "cpu")
    for model in (eager, compiled):
        init_weights(model, SPEC, seed=7, device="cpu")
    compile_blocks([compiled], "aot_eager", tensor_parallel=False)
    compiled_blocks = {name for name, block in compiled.layers.items() if block._compiled_call_impl is not None}
    assert compiled_blocks == {"0"}  # layer 0 is dense (first_dense=1); 1-3 are MoE
    losses = [model(tokens).logsumexp(-1).mean() for model in (eager, compiled)]
    assert abs(losses[0].item() - losses[1].item()) <= tolerances.LOSS_RTOL * abs(losses[0].item())


@pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="this torch has no torch._grouped_mm")
def test_the_grouped_gemm_path_equals_the_per_expert_loop():
    """The GPU path (torch._grouped_mm; torch 2.13 also runs it on the CPU) and the CPU loop give
    the same outputs and weight gradients, experts without rows included."""
    from plait.run.modules.experts import expert_forward

    generator = torch.Generator().manual_seed(5)
    counts = [5, 0, 9, 2]
    x = torch.randn(sum(counts), 32, generator=generator)
    weights = [torch.randn(4, *shape, generator=generator) * 0.1 for shape in ((32, 16), (32, 16), (16, 32))]
    results = []
    for grouped in (True, False):
        leaves = [w.clone().requires_grad_() for w in weights]
        out = expert_forward(x, counts, *leaves, grouped=grouped)
        out.square().sum().backward()
        results.append((out.detach(), [w.grad for w in leaves]))
    (out_g, grads_g), (out_l, grads_l) = results
    bound = tolerances.reduction_rtol(32) * 4  # dot products of 32 (or 16) terms, then squares: O(1) values
    assert (out_g - out_l).abs().max().item() <= bound * out_l.abs().max().item()
    for got, want in zip(grads_g, grads_l):
        assert (got - want).abs().max().item() <= bound * want.abs().max().item()
    assert grads_g[0][1].abs().sum().item() == 0.0  # expert 1 had no rows


@pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="this torch has no torch._grouped_mm")
def test_the_expert_gemms_the_planner_counts_launches_are_the_runtime_s():
    """The GEMM launches ``plait.plan.moe.sync`` prices for plait's runtime: the grouped path (a GPU)
    runs one grouped GEMM per projection whatever the local experts, the CPU loop one GEMM per
    local expert and projection (``expert_gemm_kernels``), forward and backward."""
    from op_record import OpRecord

    import dataclasses

    from plait.plan.moe.sync import expert_gemm_kernels
    from plait.run.modules.experts import expert_forward
    from plait.spec.hardware import get_cluster
    from plait.spec.layout import Layout

    h100 = get_cluster("dgx-h100").gpu  # bf16 on Hopper: grouped; a CPU (fp32): the loop
    cpu = dataclasses.replace(h100, name="cpu", element_bytes=4.0)
    generator = torch.Generator().manual_seed(6)
    for n_experts in (2, 8):
        model = SimpleNamespace(hidden=32, moe=SimpleNamespace(n_experts=n_experts, expert_ffn=16))
        for grouped, op, gpu in ((True, "aten._grouped_mm.default", h100), (False, "aten.mm.default", cpu)):
            x = torch.randn(4 * n_experts, 32, generator=generator, requires_grad=True)
            weights = [(torch.randn(n_experts, *shape, generator=generator) * 0.1).requires_grad_()
                       for shape in ((32, 16), (32, 16), (16, 32))]
            with OpRecord() as forward:
                out = expert_forward(x, [4] * n_experts, *weights, grouped=grouped)
            with OpRecord() as backward:
                out.square().sum().backward()
            assert (forward.count(op), backward.count(op)) == \
                expert_gemm_kernels(model, Layout.parse("dp=1"), "torch", gpu)


def test_the_grouped_gemm_is_taken_only_for_operands_whose_strides_cuda_accepts():
    """CUDA's grouped GEMM needs every stride but the last a multiple of 16 bytes: in bf16 widths that
    are multiples of 8; a width of 100 (an imported config's) takes the per-expert loop instead."""
    from plait.run.modules.experts import grouped_mm_aligned

    def operands(hidden, ffn):
        return (torch.zeros(12, hidden, dtype=torch.bfloat16), torch.zeros(4, hidden, ffn, dtype=torch.bfloat16),
                torch.zeros(4, ffn, hidden, dtype=torch.bfloat16))

    assert grouped_mm_aligned(*operands(64, 96))
    assert not grouped_mm_aligned(*operands(64, 100))  # ffn 100: a 200-byte row stride
    assert not grouped_mm_aligned(*operands(60, 96))  # hidden 60: 120 bytes
    assert grouped_mm_aligned(torch.zeros(3, 4, dtype=torch.float32))  # fp32: 16 bytes with a width of 4


def test_the_per_expert_loop_backward_builds_no_whole_weight_gradient_per_expert():
    """The CPU loop takes each expert's weights and rows from one ``unbind`` / ``split``: the backward
    stacks the experts' weight gradients and concatenates the rows' once, instead of building a
    zero-padded gradient of the whole weight (or of every row) per expert and summing them."""
    from op_record import OpRecord

    from plait.run.modules.experts import expert_forward

    generator = torch.Generator().manual_seed(3)
    counts = [5, 0, 9, 2]
    x = torch.randn(sum(counts), 32, generator=generator, requires_grad=True)
    weights = [(torch.randn(4, *shape, generator=generator) * 0.1).requires_grad_()
               for shape in ((32, 16), (32, 16), (16, 32))]
    for biases in (None, tuple(torch.zeros(4, n, requires_grad=True) for n in (16, 16, 32))):
        loss = expert_forward(x, counts, *weights, grouped=False, biases=biases).square().sum()
        with OpRecord() as record:
            loss.backward()
        assert "aten.mm.default" in record.ops
        assert not record.padded(), f"whole-size zero-padded gradients in the backward: {record.padded()}"


def test_under_autocast_the_experts_cast_their_rows_once_and_compute_as_autocast_would():
    """The MoE block's rows arrive fp32 under autocast (the residual stream's dtype). The experts cast
    them to autocast's dtype once, so that ``use_grouped_mm`` sees bf16 (on CUDA: the grouped GEMM
    the planner prices, not one GEMM per expert with autocast casting the rows for each), and give
    what autocast computes GEMM by GEMM bit for bit (the same casts, once instead of per GEMM)."""
    import plait.run.modules.experts as experts_module
    from op_record import OpRecord

    generator = torch.Generator().manual_seed(11)
    counts = [6, 0, 3, 7]
    x = torch.randn(sum(counts), 32, generator=generator)
    weights = [torch.randn(4, *shape, generator=generator) * 0.1 for shape in ((32, 16), (32, 16), (16, 32))]
    asked = []
    original = experts_module.use_grouped_mm
    experts_module.use_grouped_mm = lambda rows, *weights: asked.append(rows.dtype) or original(rows, *weights)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16), OpRecord() as record:
            out = experts_module.expert_forward(x, counts, *weights)
    finally:
        experts_module.use_grouped_mm = original
    assert experts_module.compute_dtype(x) == torch.float32  # outside autocast: the rows' own
    assert asked == [torch.bfloat16] and out.dtype == torch.bfloat16
    row_casts = [shape for name, shape, _ in record.outputs if name == "aten._to_copy.default" and shape == tuple(x.shape)]
    assert len(row_casts) == 1, f"the rows were cast {len(row_casts)} times"
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast's own casts, GEMM by GEMM
        want, start = [], 0
        for e, n in enumerate(counts):
            rows = x[start:start + n]
            gate, up = rows @ weights[0][e], rows @ weights[1][e]
            want.append((F.silu(gate) * up) @ weights[2][e])
            start += n
    assert torch.equal(out, torch.cat(want))


def test_under_autocast_the_rows_are_dispatched_in_the_compute_dtype():
    """Under autocast the MoE block gathers and dispatches its rows in bf16 (2 bytes per element through
    the all-to-all, as the planner prices it; the fp32 residual stream would move 4), gives what it
    gave with fp32 rows cast by the experts bit for bit, and returns an fp32 gradient to its input."""
    layer = moe_layer()
    seen = []
    exchange = layer.dispatcher.exchange
    layer.dispatcher.exchange = lambda rows, *rest: seen.append(rows.dtype) or exchange(rows, *rest)
    x = torch.randn(2, 16, SPEC.hidden, generator=torch.Generator().manual_seed(4), requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x)
    out.float().square().sum().backward()
    assert seen == [torch.bfloat16] and x.grad.dtype == torch.float32
    layer.dispatcher.exchange = lambda rows, *rest: exchange(rows.float(), *rest)  # fp32 rows, as before
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(layer(x), out)


def test_a_capacity_factor_drops_the_lowest_scored_pairs_of_full_experts():
    import dataclasses

    capped_spec = dataclasses.replace(SPEC, moe=dataclasses.replace(SPEC.moe, capacity_factor=1.0))
    torch.manual_seed(4)
    dropless = moe_layer()
    capped = MoEFeedForward(capped_spec)
    capped.load_state_dict(dropless.state_dict())
    x = torch.randn(1, 24, SPEC.hidden)
    x2 = x.reshape(-1, SPEC.hidden)
    probs, weights, ids, _ = dropless.route(x2)
    capacity = 24 * SPEC.moe.top_k // SPEC.moe.n_experts  # ceil(1.0 · T·k / E) = 6
    # the expected output: the per-token sum without the pairs beyond each expert's capacity
    scores = probs.gather(1, ids)
    keep = torch.ones_like(ids, dtype=torch.bool)
    for e in range(SPEC.moe.n_experts):
        pairs = (ids == e).nonzero().tolist()
        pairs.sort(key=lambda p: -scores[p[0], p[1]].item())
        for t, j in pairs[capacity:]:
            keep[t, j] = False
    assert not keep.all(), "the test needs an expert over capacity"
    w1, w3, w2 = dropless.experts.w1, dropless.experts.w3, dropless.experts.w2
    want = torch.stack([dropless.shared(x2[t]) + sum(
        weights[t, j] * ((F.silu(x2[t] @ w1[ids[t, j]]) * (x2[t] @ w3[ids[t, j]])) @ w2[ids[t, j]])
        for j in range(SPEC.moe.top_k) if keep[t, j]) for t in range(24)])
    got = capped(x).reshape(-1, SPEC.hidden)
    assert (got - want).abs().max().item() <= tolerances.reduction_rtol(SPEC.hidden) * 4 * want.abs().max().item()


def test_the_sigmoid_router_chooses_within_the_best_groups_on_biased_scores():
    import dataclasses

    spec = dataclasses.replace(SPEC, moe=dataclasses.replace(SPEC.moe, router="sigmoid", n_groups=4, topk_groups=2,
                                                             route_scale=2.5))
    layer = MoEFeedForward(spec)
    generator = torch.Generator().manual_seed(6)
    with torch.no_grad():
        layer.router.weight.copy_(torch.randn(layer.router.weight.shape, generator=generator) * 0.1)
        layer.score_bias.copy_(torch.randn(8, generator=generator) * 0.05)
    x = torch.randn(16, SPEC.hidden, generator=generator)
    _, weights, ids, _ = layer.route(x)
    scores = torch.sigmoid(layer.router(x)).detach()
    for t in range(16):
        choice = (scores[t] + layer.score_bias).tolist()
        groups = sorted(range(4), key=lambda g: -sum(sorted(choice[2 * g:2 * g + 2], reverse=True)[:2]))[:2]
        allowed = [e for g in groups for e in (2 * g, 2 * g + 1)]
        chosen = sorted(allowed, key=lambda e: -choice[e])[:2]
        assert sorted(ids[t].tolist()) == sorted(chosen)
        want = scores[t, ids[t]] / scores[t, ids[t]].sum() * 2.5
        assert torch.allclose(weights[t].detach(), want, rtol=4 * tolerances.U, atol=0)
    assert layer.expert_load.sum().item() == 16 * 2  # training forward: the pairs are counted


def test_the_balancing_bias_moves_towards_the_mean_load():
    import dataclasses

    layer = MoEFeedForward(dataclasses.replace(SPEC, moe=dataclasses.replace(SPEC.moe, router="sigmoid")))
    layer.reset_buffers()
    layer.update_score_bias(torch.tensor([0.0, 1, 2, 3, 4, 5, 6, 7]))  # mean 3.5
    step = 1e-3
    assert layer.score_bias.tolist() == pytest.approx([step] * 4 + [-step] * 4)
