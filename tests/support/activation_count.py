"""Measure the bytes one transformer layer of the runtime saves for its backward (tests/run/test_memory_truth.py).

``measure_layer(spec, layout, seq_len, mbs)`` builds a one-layer ``plait.run.model.Transformer`` in
bf16 on the CPU exactly as the runtime would for ``layout`` (eager or SDPA kernel, tensor/sequence
parallel via ``apply_tensor_parallel`` when ``layout.tp > 1``, the runtime's own
``apply_activation_checkpointing``), runs the block's forward for one micro-batch and counts what
autograd keeps, in two independent ways:

  * **saved**: a ``torch.autograd.graph.saved_tensors_hooks`` pack hook sees every tensor an
    autograd node saves. It counts the bytes of each distinct storage once (Q, K and V linears
    save the same input; a transposed view is the same memory), on this rank (a DTensor counts
    its local shard), excluding parameters (and their transposed views) and model buffers (the
    RoPE cos/sin tables, shared by all layers).
    Under non-reentrant checkpointing (``torch.utils.checkpoint``, ``use_reentrant=False``) the
    checkpoint pushes its own saved-tensor hooks inside the checkpointed region: the outer hook
    sees only what the checkpoint keeps, i.e. the region's tensor inputs that its
    ``_NoopSaveInputs`` node saves; the inner tensors are packed into placeholders and
    recomputed in the backward.
  * **live**: a ``TorchDispatchMode`` takes a weak reference to the storage of every tensor
    created during the forward; after it, with only the block output held, the storages still
    alive (minus the output's) are what the layer really keeps in memory. Any tensor held by
    something else than a saved-tensor slot (a checkpoint frame, a custom Function's ctx) would
    show here.

The results are plain data (picklable), so that ``measure_layer`` also runs as a DistPool task
on every rank (``tests/support/distpool.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math

import torch
from torch.autograd.graph import saved_tensors_hooks
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import (
    TorchDispatchMode,
    is_traceable_wrapper_subclass,
)
from torch.utils._pytree import tree_flatten

from plait.run.memory.recompute import apply_activation_checkpointing
from plait.run.model import apply_kernels, build_model, canonical_name, rope_tables
from plait.run.modules.mla import rotary_dim
from plait.spec.layout import Layout
from plait.spec.model import ModelSpec


@dataclasses.dataclass(frozen=True)
class Saved:
    """One tensor that a node saved, as the pack hook saw it (local shard of a DTensor)."""

    module: str  # innermost module running when it was saved ("" = the checkpoint wrapper)
    grad_fn: str  # the saved tensor's own grad_fn (what produced it; a DTensor's), "" for none
    shape: tuple
    dtype: str
    nbytes: int  # bytes of its storage
    kind: str  # "act" (counted), "dup" (storage already counted), "param", "buffer", "empty" (0 bytes)


def _leaves(t: torch.Tensor):
    """The plain tensors inside ``t``: itself, or the inner tensors of a DTensor / wrapper subclass."""
    if is_traceable_wrapper_subclass(t):
        attrs, _ = t.__tensor_flatten__()
        for attr in attrs:
            inner = getattr(t, attr)
            if isinstance(inner, torch.Tensor):  # DTensor also lists its device_mesh
                yield from _leaves(inner)
    else:
        yield t


def _ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class _Births(TorchDispatchMode):
    """Weak references to the storage of every tensor that an op creates (keyed by address)."""

    def __init__(self):
        super().__init__()
        self.born: dict[int, tuple[StorageWeakRef, int]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for value in tree_flatten(out)[0]:
            if isinstance(value, torch.Tensor):
                for leaf in _leaves(value):
                    storage = leaf.untyped_storage()
                    if storage.nbytes():
                        self.born[storage.data_ptr()] = (StorageWeakRef(storage), storage.nbytes())
        return out


@contextlib.contextmanager
def _observe_balanced_cache(cache):
    """Call ``cache(op, output)`` for every output that ``ckpt=balanced`` saves (MUST_SAVE) in the
    selective checkpoint's cache, which saved-tensor hooks do not see (``plait.run.memory.recompute``)."""
    from torch.utils.checkpoint import CheckpointPolicy

    from plait.run.memory import recompute as checkpointing

    original = checkpointing.balanced_policy

    def observing(ctx, op, *args, **kwargs):
        policy = original(ctx, op, *args, **kwargs)
        if policy == CheckpointPolicy.MUST_SAVE and not ctx.is_recompute:
            cache(str(op), ctx.op_output)
        return policy

    checkpointing.balanced_policy = observing
    try:
        yield
    finally:
        checkpointing.balanced_policy = original


def build_layer(spec: ModelSpec, layout: Layout, seed: int = 0, dtype: torch.dtype = torch.bfloat16):
    """A one-layer model as the runtime builds it for ``layout``, ``dtype`` weights (default bf16:
    FSDP's param_dtype on a GPU; fp32 is what the runtime computes in on a CPU), on the CPU."""
    spec1 = dataclasses.replace(spec, n_layers=1)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        model = build_model(spec1)
    finally:
        torch.set_default_dtype(previous)
    apply_kernels(model, layout.attn, layout.norm)  # as plait.run.parallel.parallelize does
    if layout.tp > 1:
        from torch.distributed.device_mesh import init_device_mesh

        from plait.run.parallel.tensor import apply_tensor_parallel

        mesh = init_device_mesh("cpu", (layout.tp,), mesh_dim_names=("tp",))
        apply_tensor_parallel(model, mesh, layout.sequence_parallel)
    apply_activation_checkpointing([model], layout)
    model.to_empty(device="cpu")
    # Values do not change what is saved: random bf16 weights (cheaper than init_weights) and the
    # runtime's fp32 RoPE tables.
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            local = param.to_local() if hasattr(param, "to_local") else param
            local.copy_(torch.randn(local.shape, generator=generator) * 0.02)
    model.rope_cos, model.rope_sin = rope_tables(rotary_dim(spec), spec.max_seq_len, "cpu")  # MLA: d_rope wide
    model.train()
    return model


def measure_layer(spec: ModelSpec, layout: Layout, seq_len: int, mbs: int, seed: int = 0,
                  dtype: torch.dtype = torch.bfloat16) -> dict:
    """Saved and live bytes of one layer for one micro-batch of ``mbs`` sequences, on this rank,
    in ``dtype`` (weights and the layer input).

    Returns {"saved": bytes counted by the pack hook, "live": bytes alive after the forward,
    "records": [Saved, ...] in save order, "live_not_saved"/"saved_not_live": storage sizes that
    only one method saw}.
    """
    torch.manual_seed(seed)
    model = build_layer(spec, layout, seed, dtype)
    block = model.layers["0"]
    s_local = seq_len // layout.tp if layout.sequence_parallel else seq_len
    x0 = torch.randn(mbs, s_local, spec.hidden, dtype=dtype, requires_grad=True)

    def local_ptrs(tensors):
        return {_ptr(leaf) for t in tensors for leaf in _leaves(t)}

    params = local_ptrs(model.parameters())
    buffers = local_ptrs(model.buffers())
    stack: list[str] = []

    def enter(name):
        def hook(module, args):
            stack.append(name)
        return hook

    def leave(module, args, output):
        stack.pop()

    hooks = []
    for name, module in block.named_modules():
        name = canonical_name(name + ".").rstrip(".") if name else ""
        hooks += [module.register_forward_pre_hook(enter(name)), module.register_forward_hook(leave)]
    records: list[Saved] = []
    counted: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        grad_fn = t.grad_fn.name() if t.grad_fn is not None else ""
        for leaf in _leaves(t):
            key, nbytes = _ptr(leaf), leaf.untyped_storage().nbytes()
            if key in params:
                kind = "param"
            elif key in buffers:
                kind = "buffer"
            elif nbytes == 0:
                kind = "empty"
            elif key in counted:
                kind = "dup"
            else:
                kind = "act"
                counted[key] = nbytes
            records.append(Saved(stack[-1] if stack else "", grad_fn, tuple(leaf.shape), str(leaf.dtype).removeprefix("torch."), nbytes, kind))
        return t

    def cache(op, output) -> None:  # ckpt=balanced: an op output kept in the selective checkpoint's cache
        for value in tree_flatten(output)[0]:
            if isinstance(value, torch.Tensor):
                before = len(records)
                pack(value)
                records[before:] = [dataclasses.replace(r, grad_fn=f"cached:{op}") for r in records[before:]]

    births = _Births()
    with births, saved_tensors_hooks(pack, lambda t: t), _observe_balanced_cache(cache):
        x = x0.clone()  # the layer input, created under the mode: alive afterwards only if saved
        y = block(x, model.rope_cos, model.rope_sin)
    del x
    for h in hooks:
        h.remove()
    held = local_ptrs([y]) | params | buffers

    def alive() -> dict[int, int]:
        return {ptr: n for ptr, (ref, n) in births.born.items() if not ref.expired() and ptr not in held}

    live = alive()
    if set(live) - set(counted):  # garbage in a reference cycle? (a full collection is slow: only then)
        gc.collect()
        live = alive()
    result = {
        "saved": sum(counted.values()),
        "live": sum(live.values()),
        "records": records,
        "live_not_saved": sorted(n for p, n in live.items() if p not in counted),
        "saved_not_live": sorted(n for p, n in counted.items() if p not in live),
    }
    del y
    return result


# ------------------------------------------------------------------ attribution to planner items
QKV = "q+kv"  # the planner's q, kv and attn_kv_repeat, merged (their shapes coincide for MHA)


def classify(records: list[Saved], spec: ModelSpec, layout: Layout, seq_len: int, mbs: int) -> dict[str, int]:
    """Bytes of the counted ("act") records by ``plait.plan.activations`` item name.

    The rule is by the module that saved the tensor, then dtype and shape:
      block wrapper ("", full checkpoint)   -> attn_norm_input (the checkpoint's input)
      block ("", ckpt=mlp's checkpoint)     -> mlp_norm_input (the MLP half's input)
      attention_norm / ffn_norm             -> attn/mlp_norm_input (compute dtype, width h),
      (and attention_post_norm / ffn_post_norm: the same items, or attn/mlp_post_norm_input with
      sandwich norms)
                                               norm_stats (one value per token),
                                               cpu_rmsnorm_fp32 (fp32, width h: CPU composite RMSNorm);
                                               norm=unfused: attn/mlp_norm_fp32_input (fp32, width h),
                                               attn/mlp_norm_normalized (compute dtype, width h)
      attention.q_norm / k_norm             -> qk_norm_input, qk_norm_stats, cpu_rmsnorm_fp32 (as above)
      MLA: attention.q_norm / kv_norm       -> mla_latents (bf16: a fused kernel's input), mla_norm_stats,
                                               cpu_rmsnorm_fp32 (the CPU composite's fp32 copies)
           attention.wq_a / wkv_a           -> attn_norm_output; attention.wq_b / wkv_b -> mla_latents
      attention.wq/wk/wv, feed_forward.w1/w3 -> attn_norm_output, mlp_norm_output (GEMM inputs)
      attention.wo, feed_forward.w2          -> attn_out, mlp_act_out
      attention (kernel, RoPE, checkpoint)   -> attn_causal_mask (bool), attn_window_mask ((s, s), SDPA's
                                               additive mask), attn_lse (fp32),
                                               attn_scores / attn_probs / attn_dropout_mask / attn_dropout_out
                                               (the s×s tensors), attn_out (SDPA's output), q+kv
      feed_forward                           -> mlp_act_out (silu / gelu output), mlp_up
      dropout (1st, 2nd call)                -> attn_resid_dropout_mask, mlp_dropout_mask
      cached by ckpt=balanced (GEMM outputs)  -> q+kv, attn_proj_out, mlp_up, mlp_down_out; the
                                               attention kernel's output and log-sum-exp; MLA's
                                               down-projections mla_latents, up-projections q+kv
    Anything else is reported as "other:<module>" (and fails the comparison). The s×s tensors are
    told from Q, K, V by their element count (they coincide only if seq_len == head_dim).
    """
    s_q = seq_len // layout.cp
    scores_numel = mbs * (spec.n_heads // layout.tp) * s_q * seq_len
    items: dict[str, int] = {}
    dropout_calls = 0

    def add(item: str, n: int) -> None:
        items[item] = items.get(item, 0) + n

    cached = {"attention.wq": QKV, "attention.wk": QKV, "attention.wv": QKV, "attention.wo": "attn_proj_out",
              "feed_forward.w1": "mlp_up", "feed_forward.w3": "mlp_up", "feed_forward.w2": "mlp_down_out",
              "attention.wq_a": "mla_latents", "attention.wkv_a": "mla_latents",  # MLA's latent GEMMs
              "attention.wq_b": QKV, "attention.wkv_b": QKV}
    for r in records:
        if r.kind != "act":
            continue
        m, last = r.module, r.shape[-1] if r.shape else 1
        if r.grad_fn.startswith("cached:"):  # ckpt=balanced: GEMM and attention-kernel outputs
            if m == "attention":
                add("attn_lse" if r.dtype == "float32" else "attn_out", r.nbytes)
            else:
                add(cached.get(m, f"other:{m}"), r.nbytes)
        elif m == "":  # the checkpoint's input: the layer's (full) or the MLP half's (mlp)
            add("mlp_norm_input" if layout.ckpt == "mlp" else "attn_norm_input", r.nbytes)
        elif m in ("attention_norm", "ffn_norm", "attention_post_norm", "ffn_post_norm"):
            part = "attn" if m.startswith("attention") else "mlp"
            if m.endswith("post_norm") and spec.norm_position == "sandwich":  # Gemma-2: its own items
                part += "_post"
            if last == 1 or len(r.shape) < 2:
                add("norm_stats", r.nbytes)
            elif layout.norm == "unfused":  # the op chain: fp32 (centred) input, normalized value
                add(f"{part}_norm_fp32_input" if r.dtype == "float32" else f"{part}_norm_normalized", r.nbytes)
            elif r.dtype == "bfloat16":
                add(f"{part}_norm_input", r.nbytes)
            else:
                add("cpu_rmsnorm_fp32", r.nbytes)
        elif spec.mla is not None and m in ("attention.q_norm", "attention.kv_norm"):  # MLA's latent norms
            if last == 1:
                add("mla_norm_stats", r.nbytes)
            else:  # a fused kernel's bf16 input (the latent), or the CPU composite's fp32 copies
                add("mla_latents" if r.dtype == "bfloat16" else "cpu_rmsnorm_fp32", r.nbytes)
        elif m in ("attention.wq_a", "attention.wkv_a"):  # MLA's down-projections: the norm output
            add("attn_norm_output", r.nbytes)
        elif m in ("attention.wq_b", "attention.wkv_b"):  # MLA's up-projections: the normalized latents
            add("mla_latents", r.nbytes)
        elif m in ("attention.q_norm", "attention.k_norm"):  # qk_norm: as the block's RMSNorms
            if last == 1:
                add("qk_norm_stats", r.nbytes)
            else:
                add("qk_norm_input" if r.dtype == "bfloat16" else "cpu_rmsnorm_fp32", r.nbytes)
        elif m in ("attention.wq", "attention.wk", "attention.wv"):
            add("attn_norm_output", r.nbytes)
        elif m in ("feed_forward.w1", "feed_forward.w3"):
            add("mlp_norm_output", r.nbytes)
        elif m == "attention.wo":
            add("attn_out", r.nbytes)
        elif m == "feed_forward.w2":
            add("mlp_act_out", r.nbytes)
        elif m == "feed_forward":
            add("mlp_act_out" if r.grad_fn.startswith(("Silu", "Gelu")) else "mlp_up", r.nbytes)
        elif m == "dropout":
            add("attn_resid_dropout_mask" if dropout_calls == 0 else "mlp_dropout_mask", r.nbytes)
            dropout_calls += 1
        elif m == "attention":
            if r.dtype == "bool":
                add("attn_causal_mask", r.nbytes)
            elif r.grad_fn == "" and r.shape == (s_q, seq_len):  # SDPA's additive sliding-window mask
                add("attn_window_mask", r.nbytes)
            elif math.prod(r.shape) == scores_numel:
                if r.grad_fn.startswith("Softmax"):
                    add("attn_scores", r.nbytes)
                elif r.grad_fn == "":
                    add("attn_dropout_mask", r.nbytes)
                else:  # what P·V saves: the bf16 copy of the fp32 softmax, or the dropout output
                    add("attn_dropout_out" if spec.dropout else "attn_probs", r.nbytes)
            elif r.dtype == "float32":
                add("attn_lse", r.nbytes)
            elif r.grad_fn.startswith("ScaledDotProduct"):
                add("attn_out", r.nbytes)
            else:
                add(QKV, r.nbytes)
        else:
            add(f"other:{m}", r.nbytes)
    return items



def measure_layers(cases: list[tuple]) -> list[dict]:
    """``measure_layer(*case)`` for each case: many configurations in one DistPool round trip."""
    return [measure_layer(*case) for case in cases]


def measure_offloaded_layer(spec: ModelSpec, layout: Layout, seq_len: int, mbs: int, seed: int = 0) -> dict:
    """Bytes the runtime's activation offloader (``plait.run.memory.offload``, cpu target) moves out and back
    for one bf16 layer and micro-batch, built as ``measure_layer`` builds it; forward and backward."""
    from plait.run.memory.offload import ActivationOffloader

    torch.manual_seed(seed)
    model = build_layer(spec, layout, seed)
    block = model.layers["0"]
    offloader = ActivationOffloader("cpu", torch.device("cpu"), resident=lambda: list(model.buffers()))
    offloader.attach(block)
    s_local = seq_len // layout.tp if layout.sequence_parallel else seq_len
    x = torch.randn(mbs, s_local, spec.hidden, dtype=torch.bfloat16, requires_grad=True)
    y = block(x.clone(), model.rope_cos, model.rope_sin)
    y.float().square().mean().backward()
    stats = offloader.step_stats()
    offloader.close()
    return {"bytes_out": stats.bytes_out, "bytes_in": stats.bytes_in, "tensors": stats.tensors,
            "deduplicated": stats.deduplicated}
