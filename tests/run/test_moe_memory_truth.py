"""Memory truth of the MoE block: the bytes the runtime's MoE MLP (plait.run.modules.moe) saves for
its backward, counted with ``saved_tensors_hooks``, equal the planner's items
(``plait.plan.moe.memory.moe_layer_saved_bytes``), item by item.

One bf16 ``MoEFeedForward`` of tiny-moe (and variants: no renormalization, no aux loss, no shared
expert, and GPT-OSS's experts: the clamped SwiGLU with expert biases) runs one micro-batch on the CPU (ep=1, tp=1: every routed row stays here, so R = T·k
exactly whatever the balance). Every distinct storage an autograd node saves is counted once and
attributed to an item by how it was made; parameters, and the block input (the norm output: the
dense layer's ``mlp_norm_output``, counted by ``plait.plan.activations``), are left out. The
expert loop saves per-expert slices of one buffer (counted once, as one storage).
"""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
from torch.autograd.graph import saved_tensors_hooks  # noqa: E402

from plait.plan.moe.memory import moe_layer_saved_bytes  # noqa: E402
from plait.run.modules.moe import MoEFeedForward  # noqa: E402
from plait.spec.layout import Layout  # noqa: E402
from plait.spec.models import get_model  # noqa: E402

SEQ, MBS = 64, 2
TINY = get_model("tiny-moe")


def variant(**changes):
    return dataclasses.replace(TINY, moe=dataclasses.replace(TINY.moe, **changes))


SPECS = {"tiny-moe": TINY, "no-renormalization": variant(norm_topk=False), "no-aux-loss": variant(aux_loss_coef=0.0),
         "no-shared-expert": variant(n_shared=0),
         # GPT-OSS's experts: the clamped SwiGLU and the expert biases (tiny-moe's router and shape)
         "clamped-swiglu": variant(n_shared=0, activation="oai", expert_bias=True)}


def item_of(module: str, grad_fn: str, dtype: torch.dtype, shape: tuple, spec) -> str:
    """The planner item of one saved tensor (module: the innermost module of the MoE MLP saving it)."""
    moe = spec.moe
    if module == "shared":
        return "moe_shared_act_out" if grad_fn.startswith(("Silu", "Mul")) else "moe_shared_up"
    if module == "experts":
        if grad_fn.startswith(("Slice", "Split")):  # an expert's rows: one piece of the dispatched rows
            return "moe_dispatched"
        # made by the gated unit (silu; or the clamps, sigmoid, up + 1 and the products of GPT-OSS's);
        # else a gate or up projection (its GEMM, or its GEMM plus the expert bias)
        gated = ("Silu", "Mul", "Sigmoid", "Clamp", "AddToClamped")
        return "moe_act_out" if grad_fn.startswith(gated) else "moe_up"
    if dtype == torch.int64:
        return "moe_topk_indices" if len(shape) == 2 else "moe_token_indices"
    if grad_fn.startswith("Softmax"):
        return "moe_router_probs"
    if grad_fn.startswith(("Topk", "Sum")) and moe.norm_topk:
        return "moe_topk_norm"
    if shape == (moe.n_experts,):
        return "moe_aux_fraction"
    if dtype == torch.float32:
        return "moe_combine_weights"
    if dtype == torch.bfloat16 and len(shape) == 3:
        return "moe_expert_out"
    return f"other:{module}:{grad_fn}"


def made_by(t: torch.Tensor) -> str:
    """The name of the autograd node that made ``t`` ("" for a leaf); "AddToClamped" for an addition to a
    clamped tensor (GPT-OSS's up + 1), which an expert bias's addition (to a GEMM output) is not."""
    if t.grad_fn is None:
        return ""
    name = t.grad_fn.name()
    inputs = [node.name() for node, _ in t.grad_fn.next_functions if node is not None]
    return "AddToClamped" if name.startswith("Add") and any(n.startswith("Clamp") for n in inputs) else name


def measure(spec) -> dict[str, int]:
    """{item: bytes} the bf16 MoE MLP saves for one micro-batch of MBS × SEQ tokens."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        layer = MoEFeedForward(spec)
    finally:
        torch.set_default_dtype(previous)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in layer.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
    x = torch.randn(MBS, SEQ, spec.hidden, dtype=torch.bfloat16, generator=generator).requires_grad_()
    skip = {p.untyped_storage().data_ptr() for p in layer.parameters()} | {x.untyped_storage().data_ptr()}
    stack: list[str] = []
    def leave(module, args, output) -> None:
        stack.pop()

    for name, module in layer.named_children():
        module.register_forward_pre_hook(lambda m, a, name=name: stack.append(name))
        module.register_forward_hook(leave)
    counted: dict[int, str] = {}
    items: dict[str, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key not in skip and key not in counted and storage.nbytes():
            item = item_of(stack[-1] if stack else "", made_by(t), t.dtype, tuple(t.shape), spec)
            counted[key] = item
            items[item] = items.get(item, 0) + storage.nbytes()
        return t

    with saved_tensors_hooks(pack, lambda t: t):
        layer(x)
    return items


@pytest.mark.parametrize("name", list(SPECS))
def test_moe_block_saves_what_the_planner_counts(name):
    spec = SPECS[name]
    planned = {k: v for k, v in moe_layer_saved_bytes(spec, Layout(mbs=MBS), SEQ).items() if v}
    measured = measure(spec)
    assert measured == planned, f"{name}: measured {measured} vs planned {planned}"
