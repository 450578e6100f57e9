"""The element-wise pieces of plait's transformer (``plait.run.model``): norms, rotary embeddings
and the attention kernels with their options (sliding window, score soft-capping, scale).

Attention kernels are called as ``kernel(q, k, v, dropout_p, **options)`` on (batch, heads, seq,
head_dim) tensors; ``options`` (``Attention.kernel_options``) holds only what a model sets:
``window`` (W > 0: a query at position i sees keys i-W+1..i), ``softcap`` (c > 0: scores become
c·tanh(scores/c), Gemma-2) and ``scale`` (the score scale, default 1/sqrt(head_dim)). Context-
parallel kernels take none of them: ``plait.spec.capabilities`` refuses those layouts.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from plait.errors import PlaitError
from plait.run.modules.documents import flex_document_attention, flex_runs, row_mask
from plait.spec.capabilities import RUNTIME_ROPE_SCALINGS
from plait.spec.model import ModelSpec

ROPE_THETA = 10000.0  # RoPE base of the presets (ModelSpec.rope_theta)
NORM_EPS = 1e-5  # norm epsilon of the presets (ModelSpec.norm_eps)
ROPE_SCALINGS = RUNTIME_ROPE_SCALINGS  # rope_scaling types the runtime applies


def unfused_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float,
                 center: bool) -> torch.Tensor:
    """RMSNorm (``center=False``) or LayerNorm as the eager chain of ops (``Layout.norm=unfused``).

    In fp32: [x - mean(x)], rstd = rsqrt(mean(x²) + eps), (x·rstd) cast back to x's dtype, times
    the weight [+ bias]. Autograd saves the fp32 (centred) input, the fp32 rstd per token and the
    normalized value in x's dtype (``plait.plan.activations``), on every device.
    """
    x32 = x.float()
    if center:
        x32 = x32 - x32.mean(-1, keepdim=True)
    rstd = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    out = (x32 * rstd).type_as(x) * weight
    return out + bias if bias is not None else out


class RMSNorm(nn.Module):
    """Root-mean-square norm with a weight (Llama); ``fused`` False runs ``unfused_norm``.

    ``offset`` (Gemma): the output is scaled by (1 + weight) in fp32, the weight starting at 0."""

    def __init__(self, dim: int, eps: float = NORM_EPS, offset: bool = False):
        super().__init__()
        self.eps = eps
        self.offset = offset
        self.weight = nn.Parameter(torch.empty(dim))
        self.fused = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.offset:
            return (F.rms_norm(x.float(), (x.shape[-1],), None, self.eps) * (1.0 + self.weight.float())).type_as(x)
        if not self.fused:
            return unfused_norm(x, self.weight, None, self.eps, center=False)
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.weight) if self.offset else nn.init.ones_(self.weight)


class LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` (GPT); ``fused`` False runs ``unfused_norm``."""

    fused = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.fused:
            return unfused_norm(x, self.weight, self.bias, self.eps, center=True)
        return super().forward(x)


def make_norm(spec: ModelSpec, dim: int | None = None) -> nn.Module:
    """The model's norm over ``dim`` elements (default: hidden)."""
    dim = spec.hidden if dim is None else dim
    if spec.arch == "llama":
        return RMSNorm(dim, spec.norm_eps, spec.norm_offset)
    return LayerNorm(dim, eps=spec.norm_eps)


def rope_inverse_frequencies(head_dim: int, device, theta: float = ROPE_THETA, scaling: tuple = ()) -> torch.Tensor:
    """Rotary frequencies (head_dim // 2,), fp32, with ``scaling`` (ModelSpec.rope_scaling) applied:
    ``linear`` divides every frequency by ``factor``; ``llama3`` divides the low frequencies
    (wavelength > original_max_position_embeddings / low_freq_factor) by ``factor``, keeps the high
    ones (wavelength < .../high_freq_factor) and interpolates smoothly between."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    options = dict(scaling)
    kind = options.get("rope_type", "default")
    if not options or kind == "default":
        return inv_freq
    if kind not in ROPE_SCALINGS:
        raise PlaitError(f"rope_scaling type {kind!r} is not run by plait's runtime (it runs {', '.join(ROPE_SCALINGS)}); "
                         "plan with it, or train with a config without it")
    factor = float(options["factor"])
    if kind == "linear":
        return inv_freq / factor
    low, high = float(options["low_freq_factor"]), float(options["high_freq_factor"])
    original = float(options["original_max_position_embeddings"])
    wavelength = 2 * math.pi / inv_freq
    smooth = (original / wavelength - low) / (high - low)
    scaled = torch.where(wavelength > original / low, inv_freq / factor, inv_freq)
    middle = (wavelength <= original / low) & (wavelength >= original / high)
    return torch.where(middle, (1 - smooth) * inv_freq / factor + smooth * inv_freq, scaled)


def rope_tables(head_dim: int, max_seq_len: int, device: torch.device | str, theta: float = ROPE_THETA,
                scaling: tuple = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables of rotary embeddings, each (max_seq_len, head_dim // 2), fp32."""
    inv_freq = rope_inverse_frequencies(head_dim, device, theta, scaling)
    angles = torch.outer(torch.arange(max_seq_len, device=device, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[..., 2i], x[..., 2i+1]) of x (batch, seq, heads, head_dim); ``cos``/``sin`` are
    (seq, head_dim // 2) tables, or (batch, seq, head_dim // 2) when each row has its own positions
    (packed documents, ``plait.run.modules.documents``)."""
    pairs = x.float().unflatten(-1, (-1, 2))
    real, imag = pairs[..., 0], pairs[..., 1]
    cos = (cos if cos.dim() == 3 else cos[None])[:, :, None, :]
    sin = (sin if sin.dim() == 3 else sin[None])[:, :, None, :]
    rotated = torch.stack((real * cos - imag * sin, real * sin + imag * cos), dim=-1)
    return rotated.flatten(-2).type_as(x)


def attention_mask(seq: int, window: int, device) -> torch.Tensor:
    """(seq, seq) bool, True where query i may see key j: j <= i and i - j < window (0: no window)."""
    i = torch.arange(seq, device=device)[:, None]
    j = torch.arange(seq, device=device)[None, :]
    allowed = j <= i
    return allowed & (i - j < window) if window else allowed


def core_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float, *, window: int = 0,
                   scale: float | None = None, softcap: float = 0.0,
                   documents: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of (batch, heads, seq, head_dim) tensors; K/V heads are repeated for GQA.

    A sliding window passes its boolean mask to SDPA (the memory-efficient or math kernel: the
    flash kernel takes no mask). Soft-capped scores need the eager kernel (``attn=eager``).
    ``documents`` (batch, seq): within-document attention, by FlexAttention's block mask on CUDA
    without dropout, else SDPA with the boolean mask (``plait.run.modules.documents``)."""
    if softcap:
        raise PlaitError("attention soft-capping (Gemma-2's attn_logit_softcapping) runs only with eager "
                         "attention: use attn=eager")
    if documents is not None and flex_runs(q, dropout_p):
        return flex_document_attention(q, k, v, documents, window, scale)
    if documents is not None:
        mask = row_mask(documents, window)
    else:
        mask = attention_mask(q.shape[2], window, q.device) if window else None
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=mask is None,
                                          scale=scale, enable_gqa=k.shape[1] != q.shape[1])


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float, *, window: int = 0,
                    scale: float | None = None, softcap: float = 0.0,
                    documents: torch.Tensor | None = None) -> torch.Tensor:
    """The same as ``core_attention`` with the (seq × seq) probabilities materialized (attn=eager).

    Plain PyTorch attention as Hugging Face's and Megatron's unfused paths write it: the softmax
    in fp32 (for bf16 stability), cast back to the input dtype for the P·V GEMM; soft-capping
    (c·tanh(scores/c)) before the mask.
    """
    if k.shape[1] != q.shape[1]:
        repeat = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    seq = q.shape[2]
    scores = q @ k.transpose(-2, -1)
    scores = scores / math.sqrt(q.shape[-1]) if scale is None else scores * scale
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    mask = ~(attention_mask(seq, window, q.device) if documents is None else row_mask(documents, window))
    probs = scores.masked_fill(mask, float("-inf")).softmax(dim=-1, dtype=torch.float32).to(q.dtype)
    probs = F.dropout(probs, p=dropout_p)
    return probs @ v


def activation_function(name: str):
    """The MLP activation of ``ModelSpec.activation``."""
    if name == "silu":
        return F.silu
    if name == "gelu_tanh":
        return lambda x: F.gelu(x, approximate="tanh")
    return F.gelu
