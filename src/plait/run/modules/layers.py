"""The element-wise pieces of plait's transformer (``plait.run.model``): norms, rotary embeddings
(every rope_scaling type: ``rope_tables``) and the attention kernels with their options (sliding window, score soft-capping, scale).

Attention kernels are called as ``kernel(q, k, v, dropout_p, **options)`` on (batch, heads, seq,
head_dim) tensors; ``options`` (``Attention.kernel_options``) holds only what a model sets:
``window`` (W > 0: a query at position i sees keys i-W+1..i), ``softcap`` (c > 0: scores become
c·tanh(scores/c), Gemma-2), ``scale`` (the score scale, default 1/sqrt(head_dim)) and ``sinks``
(one logit per head, (heads,): a softmax column no value goes with, GPT-OSS). ``core_attention``
(attn=flash, sdpa) takes no soft-cap and no sinks; ``eager_attention`` and FlexAttention
(attn=flex, ``plait.run.modules.flex``) take all; the context-parallel kernels take them all but
under cp_impl=torch (``plait.spec.capabilities``, rule ``runtime-cp-attention-options``).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
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


class SplitRMSNorm(torch.autograd.Function):
    """RMSNorm over ``dim`` elements of which this rank holds the last axis of ``x`` and the matching
    slice of the weight (a column-parallel projection's output: OLMo-2's q/k norms under tensor
    parallelism). The forward all-reduces each token's fp32 sum of squares over ``group`` (one value
    per token, not the projection), the backward each token's dot product of the gradient with the
    input. Saved for the backward: ``x`` (its dtype) and the fp32 rstd per token, as the fused norm
    saves (``plait.plan.activations``: ``qk_norm_input``, ``qk_norm_stats``).

    With r = rsqrt(Σ x²/dim + eps) and w the scale (weight, or 1 + weight with ``offset``):
    y = x·r·w, dL/dw = Σ_tokens g·x·r, dL/dx = r·g·w - x·r³·(Σ_dim g·w·x)/dim."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float, offset: bool, dim: int, group):
        x32 = x.float()
        squares = x32.pow(2).sum(-1, keepdim=True)
        dist.all_reduce(squares, group=group)
        rstd = torch.rsqrt(squares / dim + eps)
        ctx.save_for_backward(x, weight, rstd)
        ctx.offset, ctx.dim, ctx.group = offset, dim, group
        if offset:
            return (x32 * rstd * (1.0 + weight.float())).type_as(x)
        return (x32 * rstd).type_as(x) * weight

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight, rstd = ctx.saved_tensors
        x32, g32 = x.float(), grad.float()
        scale = weight.float() + 1.0 if ctx.offset else weight.float()
        grad_weight = (g32 * x32 * rstd).flatten(0, -2).sum(0).to(weight.dtype)
        scaled = g32 * scale
        dot = (scaled * x32).sum(-1, keepdim=True)
        dist.all_reduce(dot, group=ctx.group)
        grad_x = rstd * scaled - x32 * rstd.pow(3) * (dot / ctx.dim)
        return grad_x.to(x.dtype), grad_weight, None, None, None, None


class RMSNorm(nn.Module):
    """Root-mean-square norm with a weight (Llama); ``fused`` False runs ``unfused_norm``.

    ``offset`` (Gemma): the output is scaled by (1 + weight) in fp32, the weight starting at 0.
    ``statistics_group``: set by tensor parallelism when the normalized axis is split over its ranks
    (``plait.run.parallel.tensor.SplitNorm``; the weight is then a ``Shard(0)`` DTensor): the
    statistics are summed over the group (``SplitRMSNorm``)."""

    def __init__(self, dim: int, eps: float = NORM_EPS, offset: bool = False):
        super().__init__()
        self.eps = eps
        self.offset = offset
        self.weight = nn.Parameter(torch.empty(dim))
        self.fused = True
        self.statistics_group = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.statistics_group is not None:
            return SplitRMSNorm.apply(x, self.weight.to_local(), self.eps, self.offset, self.weight.shape[0],
                                      self.statistics_group)
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


def rope_inverse_frequencies(head_dim: int, device, theta: float = ROPE_THETA, scaling: tuple = (), *,
                             seq_len: int | None = None, max_positions: int | None = None) -> torch.Tensor:
    """Rotary frequencies (head_dim // 2,) in radians per position, fp32, with ``scaling``
    (ModelSpec.rope_scaling) applied for sequences of ``seq_len`` tokens; ``max_positions`` is the
    config's max_position_embeddings (ModelSpec.max_seq_len). ``seq_len`` None: the frequencies
    transformers builds before it sees a sequence (dynamic's at max_positions, longrope's short ones).

    The types follow transformers 5.24 (``transformers.modeling_rope_utils``, written here from
    its formulas, not copied):
      * ``linear``: every frequency divided by ``factor``.
      * ``dynamic`` (NTK): for S = max(seq_len, max_positions) tokens the base becomes
        theta·(factor·S/max_positions - (factor - 1))^(d/(d-2)), d = head_dim; S <= max_positions
        leaves plain RoPE (transformers recomputes per forward from the longest position seen).
      * ``llama3``: the low frequencies (wavelength > original/low_freq_factor) divided by
        ``factor``, the high ones (wavelength < original/high_freq_factor) kept, a smooth
        interpolation between (original = original_max_position_embeddings).
      * ``yarn``: interpolated (divided by ``factor``) and extrapolated (plain) frequencies blended by
        a ramp over the pair index i, 0 below the pair turning ``beta_fast`` (default 32) times over
        the original length and 1 above the pair turning ``beta_slow`` (default 1) times:
        d·ln(original/(2π·rotations))/(2·ln theta), floored/ceiled unless ``truncate`` is false.
      * ``longrope``: frequency i divided by ``long_factor[i]`` when seq_len > original, else by
        ``short_factor[i]``.
    The cos/sin scale of yarn and longrope is ``rope_attention_factor``.
    """
    exponents = torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim
    inv_freq = 1.0 / (theta ** exponents)
    options = dict(scaling)
    kind = options.get("rope_type", "default")
    if kind == "default":
        return inv_freq
    if kind not in ROPE_SCALINGS:
        raise PlaitError(f"rope_scaling type {kind!r} is not one of default, {', '.join(ROPE_SCALINGS)}")
    positions = max_positions if max_positions is not None else seq_len
    if kind == "linear":
        return inv_freq / float(options["factor"])
    if kind == "dynamic":
        factor, length = float(options["factor"]), max(seq_len or positions, positions)
        base = theta * (factor * length / positions - (factor - 1)) ** (head_dim / (head_dim - 2))
        return 1.0 / (base ** exponents)
    original = float(options["original_max_position_embeddings"])
    if kind == "longrope":
        chosen = options["long_factor"] if seq_len and seq_len > original else options["short_factor"]
        return 1.0 / (torch.tensor(chosen, dtype=torch.float32, device=device) * theta ** exponents)
    factor = float(options["factor"])
    if kind == "yarn":
        return _yarn_frequencies(inv_freq, head_dim, theta, factor, original, options)
    low, high = float(options["low_freq_factor"]), float(options["high_freq_factor"])
    wavelength = 2 * math.pi / inv_freq
    smooth = (original / wavelength - low) / (high - low)
    scaled = torch.where(wavelength > original / low, inv_freq / factor, inv_freq)
    middle = (wavelength <= original / low) & (wavelength >= original / high)
    return torch.where(middle, (1 - smooth) * inv_freq / factor + smooth * inv_freq, scaled)


def _yarn_frequencies(inv_freq: torch.Tensor, head_dim: int, theta: float, factor: float, original: float,
                      options: dict) -> torch.Tensor:
    """YaRN's blend of plain and interpolated frequencies (``rope_inverse_frequencies``)."""
    def pair_turning(rotations: float) -> float:  # the (fractional) pair index turning ``rotations`` times
        return head_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = pair_turning(options.get("beta_fast") or 32), pair_turning(options.get("beta_slow") or 1)
    if options.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # as transformers: no division by zero
    pair = torch.arange(head_dim // 2, device=inv_freq.device, dtype=torch.float32)
    interpolated = ((pair - low) / (high - low)).clamp(0, 1)  # 0: keep the frequency, 1: divide it by factor
    return inv_freq / factor * interpolated + inv_freq * (1 - interpolated)


def rope_attention_factor(scaling: tuple, max_positions: int) -> float:
    """The factor yarn and longrope multiply cos and sin by (so q·k by its square); 1 for the rest.

    yarn: ``attention_factor`` when given, else m(factor, mscale) / m(factor, mscale_all_dim) when
    both are set, else m(factor, 1), with m(s, k) = 0.1·k·ln(s) + 1 (1 for s <= 1). longrope:
    ``attention_factor`` when given, else sqrt(1 + ln(factor)/ln(original)) for factor > 1, factor
    defaulting to max_positions / original (transformers 5.24, ``modeling_rope_utils``)."""
    options = dict(scaling)
    kind = options.get("rope_type", "default")
    if kind not in ("yarn", "longrope"):
        return 1.0
    if options.get("attention_factor") is not None:
        return float(options["attention_factor"])
    original = float(options["original_max_position_embeddings"])
    factor = float(options.get("factor") or max_positions / original)
    if kind == "longrope":
        return math.sqrt(1 + math.log(factor) / math.log(original)) if factor > 1 else 1.0

    def m(scale: float, k: float = 1.0) -> float:
        return 0.1 * k * math.log(scale) + 1.0 if scale > 1 else 1.0

    mscale, all_dim = options.get("mscale"), options.get("mscale_all_dim")
    return m(factor, mscale) / m(factor, all_dim) if mscale and all_dim else m(factor)


def rope_depends_on_length(scaling: tuple) -> bool:
    """Whether the tables change with the sequence length (dynamic and longrope do)."""
    return dict(scaling).get("rope_type", "default") in ("dynamic", "longrope")


def rope_tables(head_dim: int, max_seq_len: int, device: torch.device | str, theta: float = ROPE_THETA,
                scaling: tuple = (), *, seq_len: int | None = None,
                max_positions: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables of rotary embeddings for positions 0..max_seq_len-1, each (max_seq_len,
    head_dim // 2), fp32, times ``rope_attention_factor``; ``seq_len`` and ``max_positions`` (default
    ``max_seq_len``) as in ``rope_inverse_frequencies``."""
    positions = max_seq_len if max_positions is None else max_positions
    inv_freq = rope_inverse_frequencies(head_dim, device, theta, scaling, seq_len=seq_len, max_positions=positions)
    angles = torch.outer(torch.arange(max_seq_len, device=device, dtype=torch.float32), inv_freq)
    factor = rope_attention_factor(scaling, positions)
    if factor == 1.0:
        return angles.cos(), angles.sin()
    return angles.cos() * factor, angles.sin() * factor


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
                   scale: float | None = None, softcap: float = 0.0, sinks: torch.Tensor | None = None,
                   documents: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of (batch, heads, seq, head_dim) tensors; K/V heads are repeated for GQA.

    A sliding window passes its boolean mask to SDPA (the memory-efficient or math kernel: the
    flash kernel takes no mask). Soft-capped scores and sinks need FlexAttention or the eager
    kernel (``attn=flex`` or ``eager``; rule ``runtime-attn-softcap``).
    ``documents`` (batch, seq): within-document attention, by FlexAttention's block mask on CUDA
    without dropout, else SDPA with the boolean mask (``plait.run.modules.documents``)."""
    if softcap or sinks is not None:
        raise PlaitError("attention soft-capping (Gemma-2's attn_logit_softcapping) and attention sinks run only "
                         "with FlexAttention or eager attention: use attn=flex or attn=eager")
    if documents is not None and flex_runs(q, dropout_p):
        return flex_document_attention(q, k, v, documents, window, scale)
    if documents is not None:
        mask = row_mask(documents, window)
    else:
        mask = attention_mask(q.shape[2], window, q.device) if window else None
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=mask is None,
                                          scale=scale, enable_gqa=k.shape[1] != q.shape[1])


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float, *, window: int = 0,
                    scale: float | None = None, softcap: float = 0.0, sinks: torch.Tensor | None = None,
                    documents: torch.Tensor | None = None) -> torch.Tensor:
    """The same as ``core_attention`` with the (seq × seq) probabilities materialized (attn=eager).

    Plain PyTorch attention as Hugging Face's and Megatron's unfused paths write it: the softmax
    in fp32 (for bf16 stability), cast back to the input dtype for the P·V GEMM; soft-capping
    (c·tanh(scores/c)) before the mask; ``sinks`` (heads,) a last score column, dropped after the
    softmax (GPT-OSS's eager path).
    """
    mask = attention_mask(q.shape[2], window, q.device) if documents is None else row_mask(documents, window)
    return masked_eager_attention(q, k, v, mask, dropout_p, scale=scale, softcap=softcap, sinks=sinks)


def masked_eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor,
                           dropout_p: float = 0.0, *, scale: float | None = None, softcap: float = 0.0,
                           sinks: torch.Tensor | None = None) -> torch.Tensor:
    """``eager_attention`` with its mask given: ``allowed`` bool, broadcastable to (batch, heads,
    queries, keys), True where a query may see a key (the context-parallel kernels' masks by
    global position). K/V heads are repeated for GQA."""
    if k.shape[1] != q.shape[1]:
        repeat = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    scores = q @ k.transpose(-2, -1)
    scores = scores / math.sqrt(q.shape[-1]) if scale is None else scores * scale
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~allowed, float("-inf"))
    if sinks is not None:
        column = sinks.to(scores.dtype)[None, :, None, None].expand(*scores.shape[:-1], 1)
        probs = torch.cat((scores, column), dim=-1).softmax(dim=-1, dtype=torch.float32)[..., :-1].to(q.dtype)
    else:
        probs = scores.softmax(dim=-1, dtype=torch.float32).to(q.dtype)
    probs = F.dropout(probs, p=dropout_p)
    return probs @ v


def activation_function(name: str):
    """The MLP activation of ``ModelSpec.activation``."""
    if name == "silu":
        return F.silu
    if name == "gelu_tanh":
        return lambda x: F.gelu(x, approximate="tanh")
    return F.gelu
