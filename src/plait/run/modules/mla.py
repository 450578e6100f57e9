"""Multi-head latent attention (DeepSeek-V2/V3; ``plait.spec.moe.parts.MLASpec``) for ``plait.run.model``.

Forward of ``LatentAttention`` on x (batch, seq, hidden), a heads, widths d_n (no RoPE), d_r (RoPE),
d_v (values), latent ranks r_q, r_kv (as transformers 5.24's ``DeepseekV3Attention``):
  1. queries: q = wq_b(q_norm(wq_a(x))) (r_q > 0), else wq(x); per head [q_nope (d_n), q_pe (d_r)].
  2. keys and values: wkv_a(x) = [c_kv (r_kv), k_pe (d_r)]; [k_nope (d_n), v (d_v)] per head =
     wkv_b(kv_norm(c_kv)); k_pe is ONE key part that every head shares.
  3. RoPE on q_pe and k_pe (``apply_rope``: adjacent pairs (x[2j], x[2j+1]) rotated by frequency j,
     the layout of DeepSeek's ``rope_interleave``; transformers writes each rotated vector in halves
     order, which permutes q and k alike: the same scores), at the tables the model builds for
     d_r (``rotary_dim``).
  4. causal attention of q = [q_nope, q_pe] and k = [k_nope, k_pe] (d_n + d_r wide) over v (d_v
     wide): the layout's kernel (SDPA takes a value width other than the query's) at the scale
     ``softmax_scale``; the heads' outputs (a·d_v) through wo. V is copied out of wkv_b's output
     first: the kernel saves V for its backward, and a view would keep the whole output (k_nope's
     a·d_n per token too) alive (``plait.plan.moe.memory.mla_items`` counts a·d_v).
The latent norms (q_norm, kv_norm) are RMSNorms with epsilon ``LATENT_NORM_EPS`` (1e-6, transformers'
and DeepSeek's, whatever the config's rms_norm_eps).

Tensor parallelism (``plait.run.parallel.tensor.mla_attention_plan``): wq_b (or wq) and wkv_b are
column-parallel by heads, wo row-parallel; wq_a, wkv_a and the two latent norms are replicated (every
tp rank computes them whole). Their gradients are whole on each rank: the column-parallel layers
all-reduce the gradient of their input, and the shared k_pe, used by this rank's heads only, has its
gradient all-reduced over tp (``tp_shared``).

Parameters (names in checkpoints, relative to the block's ``attention``): ``wq_a``, ``q_norm``,
``wq_b`` (or ``wq``), ``wkv_a``, ``kv_norm``, ``wkv_b``, ``wo``; no biases.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from plait.run.modules.layers import RMSNorm, apply_rope, core_attention
from plait.spec.model import ModelSpec

LATENT_NORM_EPS = 1e-6  # epsilon of q_a_layernorm and kv_a_layernorm (transformers' DeepseekV3RMSNorm default)
DROPOUT = 0.1  # as plait.run.model.DROPOUT, used only when ModelSpec.dropout is set


def rotary_dim(spec: ModelSpec) -> int:
    """Width (elements) each head's rotary tables cover: qk_rope_head_dim with MLA, else head_dim."""
    return spec.mla.qk_rope_head_dim if spec.mla is not None else spec.head_dim


def softmax_scale(spec: ModelSpec) -> float:
    """The score scale of an MLA model: ``attn_scale`` when set, else 1/sqrt(d_n + d_r), times
    mscale² for a scaled RoPE whose config sets ``mscale_all_dim`` (yarn: m = 0.1·mscale_all_dim·
    ln(factor) + 1 for factor > 1; transformers' ``yarn_apply_mscale``)."""
    if spec.attn_scale:
        return float(spec.attn_scale)
    scale = spec.mla.qk_head_dim ** -0.5
    options = dict(spec.rope_scaling)
    all_dim = options.get("mscale_all_dim")
    if options.get("rope_type", "default") != "default" and all_dim:
        factor = float(options["factor"])
        mscale = 0.1 * float(all_dim) * math.log(factor) + 1.0 if factor > 1 else 1.0
        scale *= mscale * mscale
    return scale


def tp_shared(t: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``t`` unchanged; when ``weight`` is a tensor-parallel DTensor, ``t``'s gradient is summed over
    its tp ranks in the backward (each rank's heads give only their share of it)."""
    from torch.distributed.tensor import DTensor, Partial, Replicate

    if not isinstance(weight, DTensor):
        return t
    mesh = weight.device_mesh
    return DTensor.from_local(t, mesh, [Replicate()], run_check=False).to_local(grad_placements=[Partial()])


class LatentAttention(nn.Module):
    """Multi-head latent attention of one block (module docstring); the same interface as
    ``plait.run.model.Attention``: ``forward(x, cos, sin, documents=None)``, ``kernel``,
    ``kernel_options``, ``recompute_core``."""

    def __init__(self, spec: ModelSpec, index: int = 0):
        super().__init__()
        mla, h, a = spec.mla, spec.hidden, spec.n_heads
        self.nope, self.rope, self.v_dim, self.kv_rank = (mla.qk_nope_head_dim, mla.qk_rope_head_dim,
                                                         mla.v_head_dim, mla.kv_lora_rank)
        if mla.q_lora_rank:
            self.wq_a = nn.Linear(h, mla.q_lora_rank, bias=False)
            self.q_norm = RMSNorm(mla.q_lora_rank, LATENT_NORM_EPS)
            self.wq_b = nn.Linear(mla.q_lora_rank, a * mla.qk_head_dim, bias=False)
        else:
            self.wq = nn.Linear(h, a * mla.qk_head_dim, bias=False)
        self.wkv_a = nn.Linear(h, mla.kv_lora_rank + mla.qk_rope_head_dim, bias=False)
        self.kv_norm = RMSNorm(mla.kv_lora_rank, LATENT_NORM_EPS)
        self.wkv_b = nn.Linear(mla.kv_lora_rank, a * (mla.qk_nope_head_dim + mla.v_head_dim), bias=False)
        self.wo = nn.Linear(a * mla.v_head_dim, h, bias=False)
        options: dict = {"scale": softmax_scale(spec)}
        if spec.is_local_layer(index):
            options["window"] = spec.sliding_window
        self.kernel_options = options  # keyword arguments of the kernel (plait.run.modules.layers)
        self.dropout_p = DROPOUT if spec.dropout else 0.0
        self.recompute_core = False  # selective checkpointing: recompute the attention core
        self.kernel = core_attention  # eager_attention for Layout.attn == "eager"
        self.fused_qkv = False  # no Q/K/V GEMMs to fuse: set by the runtime, unused here

    def queries(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, seq, heads of this rank · (d_n + d_r))."""
        if hasattr(self, "wq_b"):
            return self.wq_b(self.q_norm(self.wq_a(x)))
        return self.wq(x)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                documents: torch.Tensor | None = None) -> torch.Tensor:
        """``documents``: the rows' document ids (batch, whole seq), with --doc-mask."""
        batch, seq, _ = x.shape
        q = self.queries(x).view(batch, seq, -1, self.nope + self.rope)  # this rank's heads under tp
        latent, k_pe = self.wkv_a(x).split([self.kv_rank, self.rope], dim=-1)
        kv = self.wkv_b(self.kv_norm(latent)).view(batch, seq, -1, self.nope + self.v_dim)
        k_pe = tp_shared(k_pe, self.wkv_b.weight).view(batch, seq, 1, self.rope)
        cos, sin = cos[..., :seq, :], sin[..., :seq, :]
        q_nope, q_pe = q.split([self.nope, self.rope], dim=-1)
        k_nope, v = kv.split([self.nope, self.v_dim], dim=-1)
        v = v.contiguous()  # the kernel saves V: a view would keep all of wkv_b's output (k_nope too) alive
        q = torch.cat((q_nope, apply_rope(q_pe, cos, sin)), dim=-1)
        k = torch.cat((k_nope, apply_rope(k_pe, cos, sin).expand(-1, -1, k_nope.shape[2], -1)), dim=-1)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        dropout_p = self.dropout_p if self.training else 0.0
        options = self.kernel_options if documents is None else {**self.kernel_options, "documents": documents}
        kernel = functools.partial(self.kernel, **options)
        out = checkpoint(kernel, q, k, v, dropout_p, use_reentrant=False) if self.recompute_core \
            else kernel(q, k, v, dropout_p)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))
