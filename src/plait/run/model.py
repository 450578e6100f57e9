"""The decoder-only transformer that plait trains, built from a ``ModelSpec``.

Two architectures, matching ``plait.spec.model`` parameter for parameter:
  * ``llama``: RMSNorm, rotary positions, grouped-query attention, SwiGLU MLP, no biases.
  * ``gpt``: LayerNorm, learned positions, multi-head attention and GELU MLP with biases.

Attention runs through ``F.scaled_dot_product_attention`` (FlashAttention kernels on GPU).
Q, K and V are separate linear layers so that column-parallel sharding splits whole heads
(and checkpoints hold ``wq``/``wk``/``wv``); ``Attention.fused_qkv`` (``plait train --fused-qkv``)
runs them as one GEMM over the three weights concatenated (``qkv_projection``).
With context parallelism (``plait.run.parallel.context.ring``) each block's ``Attention.kernel`` is a
cp kernel and the caller passes ``forward(tokens, positions)``: the global positions of the tokens
of each sequence the rank holds, at which RoPE angles and learned positions are taken. The model
itself knows nothing of how sequences are split.

The model is built on the meta device (``build_model``), parallelized, moved to its device with
``to_empty`` and only then initialized (``init_weights``): every parameter is drawn from a
generator seeded by (seed, parameter name), as a full tensor, and each rank keeps its shard.
The same seed therefore gives the same full weights whatever the layout.

Layers live in an ``nn.ModuleDict`` keyed "0".."L-1" so that pipeline stages, which delete the
layers they do not own, keep the parameter names of the full model. A stage without the
embedding (or the head) has ``tok_embeddings = None`` (``norm``/``output`` = None).
"""

from __future__ import annotations

import hashlib
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from plait.spec.model import ModelSpec

INIT_STD = 0.02  # standard deviation of every weight matrix (GPT-2 / Megatron convention)
ROPE_THETA = 10000.0
NORM_EPS = 1e-5
DROPOUT = 0.1  # used only when ModelSpec.dropout is set


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
    """Root-mean-square norm with a weight (Llama); ``fused`` False runs ``unfused_norm``."""

    def __init__(self, dim: int, eps: float = NORM_EPS):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))
        self.fused = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.fused:
            return unfused_norm(x, self.weight, None, self.eps, center=False)
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)


class LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` (GPT); ``fused`` False runs ``unfused_norm``."""

    fused = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.fused:
            return unfused_norm(x, self.weight, self.bias, self.eps, center=True)
        return super().forward(x)


def make_norm(spec: ModelSpec) -> nn.Module:
    return RMSNorm(spec.hidden) if spec.arch == "llama" else LayerNorm(spec.hidden, eps=NORM_EPS)


def rope_tables(head_dim: int, max_seq_len: int, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables of rotary embeddings, each (max_seq_len, head_dim // 2), fp32."""
    inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(max_seq_len, device=device, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[..., 2i], x[..., 2i+1]) of x (batch, seq, heads, head_dim)."""
    pairs = x.float().unflatten(-1, (-1, 2))
    real, imag = pairs[..., 0], pairs[..., 1]
    cos = cos[None, :, None, :]
    sin = sin[None, :, None, :]
    rotated = torch.stack((real * cos - imag * sin, real * sin + imag * cos), dim=-1)
    return rotated.flatten(-2).type_as(x)


def qkv_projection(x: torch.Tensor, wq: nn.Linear, wk: nn.Linear, wv: nn.Linear):
    """(q, k, v) = (wq(x), wk(x), wv(x)) as one GEMM: ``x @ [Wq; Wk; Wv]^T``, split by output width.

    The parameters stay the three separate ones (checkpoint keys and sharding unchanged); the
    concatenation copies the three weights once per forward (h·(h + 2·kv_hidden) elements), small
    against the GEMM's tokens·h·(h + 2·kv_hidden) multiply-adds, and its backward splits the
    weight gradient back into the three parameters' gradients.

    Under tensor parallelism the three weights are column-parallel DTensors (``Shard(0)``): each
    rank concatenates its own shards into [q_local; k_local; v_local] and runs the column-parallel
    GEMM on that (what ``ColwiseParallel`` does for each of them), so each rank's output columns
    are its own heads of q, k and v."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    weights = (wq.weight, wk.weight, wv.weight)
    biases = None if wq.bias is None else (wq.bias, wk.bias, wv.bias)
    if not isinstance(wq.weight, DTensor):
        bias = None if biases is None else torch.cat(biases)
        return F.linear(x, torch.cat(weights), bias).split([w.shape[0] for w in weights], dim=-1)
    mesh = wq.weight.device_mesh

    def local_cat(tensors):  # this rank's rows of each, stacked: a column-parallel weight of its own
        return DTensor.from_local(torch.cat([t.to_local() for t in tensors]), mesh, [Shard(0)], run_check=False)

    if not isinstance(x, DTensor):  # replicated activations (no sequence parallelism): as ColwiseParallel
        x = DTensor.from_local(x, mesh, [Replicate()], run_check=False)
    elif x.placements != (Replicate(),):
        x = x.redistribute(mesh, [Replicate()])
    out = F.linear(x, local_cat(weights), None if biases is None else local_cat(biases)).to_local()
    return out.split([w.to_local().shape[0] for w in weights], dim=-1)


def core_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float) -> torch.Tensor:
    """Causal attention of (batch, heads, seq, head_dim) tensors; K/V heads are repeated for GQA."""
    return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True,
                                          enable_gqa=k.shape[1] != q.shape[1])


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float) -> torch.Tensor:
    """The same as ``core_attention`` with the (seq × seq) probabilities materialized (attn=eager).

    Plain PyTorch attention as Hugging Face's and Megatron's unfused paths write it: the softmax
    in fp32 (for bf16 stability), cast back to the input dtype for the P·V GEMM.
    """
    if k.shape[1] != q.shape[1]:
        repeat = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    seq = q.shape[2]
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    mask = torch.ones(seq, seq, dtype=torch.bool, device=q.device).triu(1)
    probs = scores.masked_fill(mask, float("-inf")).softmax(dim=-1, dtype=torch.float32).to(q.dtype)
    probs = F.dropout(probs, p=dropout_p)
    return probs @ v


def apply_kernels(model: nn.Module, attn: str, norm: str, loss: str = "unfused") -> None:
    """Select the layout's kernels (``Layout.attn``, ``norm``, ``loss``) in a (stage) model, in place.

    ``attn``: ``flash`` and ``sdpa`` both call ``F.scaled_dot_product_attention`` and let its
    dispatcher choose (FlashAttention-2 on sm80+ CUDA GPUs in bf16/fp16 with head_dim <= 256,
    else the memory-efficient or math kernel; on the CPU its flash kernel, or the fp32 math
    fallback with dropout); ``eager`` runs ``eager_attention``. ``norm``: ``fused`` is
    ``F.rms_norm`` / ``nn.LayerNorm`` (one kernel on CUDA), ``unfused`` the op chain
    ``unfused_norm``. ``loss=fused``: the model returns the final hidden state instead of the
    logits and the chunked cross entropy (``plait.run.loss``) applies the LM head itself.
    """
    for module in model.modules():
        if isinstance(module, Attention):
            module.kernel = eager_attention if attn == "eager" else core_attention
        if isinstance(module, (RMSNorm, LayerNorm)):
            module.fused = norm == "fused"
        if isinstance(module, Transformer):
            module.returns_hidden = loss == "fused"


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        bias = spec.arch == "gpt"
        self.head_dim = spec.head_dim
        self.wq = nn.Linear(spec.hidden, spec.hidden, bias=bias)
        self.wk = nn.Linear(spec.hidden, spec.kv_hidden, bias=bias)
        self.wv = nn.Linear(spec.hidden, spec.kv_hidden, bias=bias)
        self.wo = nn.Linear(spec.hidden, spec.hidden, bias=bias)
        self.rotary = spec.arch == "llama"
        self.dropout_p = DROPOUT if spec.dropout else 0.0
        self.recompute_core = False  # selective checkpointing: recompute the attention core
        self.kernel = core_attention  # eager_attention for Layout.attn == "eager"
        self.fused_qkv = False  # one GEMM for Q, K and V (qkv_projection); RuntimeConfig.qkv == "fused"

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        # view(..., -1, head_dim): under tensor parallelism each rank holds a subset of heads
        if self.fused_qkv:
            q, k, v = qkv_projection(x, self.wq, self.wk, self.wv)
        else:
            q, k, v = self.wq(x), self.wk(x), self.wv(x)
        q, k, v = (t.view(batch, seq, -1, self.head_dim) for t in (q, k, v))
        if self.rotary:
            q, k = apply_rope(q, cos[:seq], sin[:seq]), apply_rope(k, cos[:seq], sin[:seq])
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        dropout_p = self.dropout_p if self.training else 0.0
        if self.recompute_core:
            out = checkpoint(self.kernel, q, k, v, dropout_p, use_reentrant=False)
        else:
            out = self.kernel(q, k, v, dropout_p)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


class FeedForward(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.gated = spec.arch == "llama"
        bias = not self.gated
        self.w1 = nn.Linear(spec.hidden, spec.ffn_hidden, bias=bias)  # gate (llama) / fc1 (gpt)
        self.w2 = nn.Linear(spec.ffn_hidden, spec.hidden, bias=bias)  # down / fc2
        self.w3 = nn.Linear(spec.hidden, spec.ffn_hidden, bias=False) if self.gated else None  # up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.w2(F.gelu(self.w1(x), approximate="tanh"))


class Block(nn.Module):
    """Pre-norm transformer block: x + attention(norm(x)), then + mlp(norm(·))."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.attention_norm = make_norm(spec)
        self.attention = Attention(spec)
        self.ffn_norm = make_norm(spec)
        self.feed_forward = FeedForward(spec)
        p = DROPOUT if spec.dropout else 0.0
        self.dropout = nn.Dropout(p) if p else nn.Identity()

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.dropout(self.attention(self.attention_norm(x), cos, sin))
        return h + self.dropout(self.feed_forward(self.ffn_norm(h)))


class Transformer(nn.Module):
    """Token ids (batch, seq) -> logits (batch, seq, vocab); a pipeline stage maps its part."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        self.tok_embeddings: nn.Module | None = nn.Embedding(spec.vocab, spec.hidden)
        self.pos_embeddings: nn.Module | None = (
            nn.Embedding(spec.max_seq_len, spec.hidden) if spec.arch == "gpt" else None)
        self.layers = nn.ModuleDict({str(i): Block(spec) for i in range(spec.n_layers)})
        self.norm: nn.Module | None = make_norm(spec)
        self.output: nn.Module | None = nn.Linear(spec.hidden, spec.vocab, bias=False)
        self.returns_hidden = False  # loss=fused: forward stops before the LM head (plait.run.loss)
        self.tie_embeddings()
        # RoPE tables are recomputed by init_weights (they cannot live on the meta device)
        cos, sin = rope_tables(spec.head_dim, spec.max_seq_len, "meta")
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def tie_embeddings(self) -> None:
        """Share the LM head's weight with the token embedding (tied models holding both, else no-op).

        Needed again after anything that replaces parameters module by module: TP sharding, and
        ``to_empty`` off the meta device, which gives each module a new Parameter of its own.
        """
        if self.spec.tied_embeddings and self.tok_embeddings is not None and self.output is not None:
            self.output.weight = self.tok_embeddings.weight

    def embed(self, tokens: torch.Tensor, positions: torch.Tensor | None) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        if self.pos_embeddings is not None:
            if positions is None:
                positions = torch.arange(tokens.shape[1], device=tokens.device)
            h = h + self.pos_embeddings(positions)
        return h

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """``x``: token ids (batch, seq), or a pipeline stage's input activations. ``positions``: the
        global positions (int64, (seq,)) of the tokens of each sequence, when they are not 0..seq-1
        (a context-parallel rank's share of the sequence)."""
        h = self.embed(x, positions) if self.tok_embeddings is not None else x
        cos, sin = self.rope_cos, self.rope_sin
        if positions is not None:
            cos, sin = cos[positions], sin[positions]
        for layer in self.layers.values():
            h = layer(h, cos, sin)
        if self.norm is not None:
            h = self.norm(h)
        if self.output is not None and not self.returns_hidden:
            h = self.output(h)
        return h


def build_model(spec: ModelSpec, device: torch.device | str = "meta") -> Transformer:
    """The full model with uninitialized weights (on the meta device by default)."""
    with torch.device(device):
        return Transformer(spec)


def count_parameters(model: nn.Module) -> int:
    """Elements of all parameters, a tied matrix counted once (works on the meta device)."""
    return sum(p.numel() for p in model.parameters())


def canonical_name(name: str) -> str:
    """A parameter's name in the plain model: strips wrapper prefixes (checkpoint, compile, FSDP)."""
    for prefix in ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.", "module."):
        name = name.replace(prefix, "")
    return name


def _seed_for(seed: int, name: str) -> int:
    digest = hashlib.blake2b(f"{seed}:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def _full_init(name: str, shape: torch.Size, spec: ModelSpec, seed: int, device: torch.device) -> torch.Tensor:
    """The full (unsharded) fp32 value of parameter ``name``: a pure function of (seed, name)."""
    leaf = name.rsplit(".", 1)[-1]
    if "norm" in name:
        return torch.ones(shape, device=device) if leaf == "weight" else torch.zeros(shape, device=device)
    if leaf == "bias":
        return torch.zeros(shape, device=device)
    std = INIT_STD
    if name.endswith(("attention.wo.weight", "feed_forward.w2.weight")):
        std = INIT_STD / math.sqrt(2 * spec.n_layers)  # residual projections (GPT-2 scaling)
    generator = torch.Generator(device=device)
    generator.manual_seed(_seed_for(seed, name))
    return torch.randn(shape, generator=generator, device=device) * std


@torch.no_grad()
def init_weights(model: nn.Module, spec: ModelSpec, seed: int, device: torch.device | str) -> None:
    """Give every parameter its deterministic value (see module docstring); recompute RoPE tables.

    Works on plain, DTensor (tensor-parallel) and FSDP-sharded parameters: each rank computes
    the full tensor and keeps its own shard, with no communication.
    """
    from torch.distributed.tensor import DTensor, distribute_tensor

    device = torch.device(device)
    for name, param in model.named_parameters():
        full = _full_init(canonical_name(name), param.shape, spec, seed, device)
        if isinstance(param, DTensor):
            local = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None).to_local()
            param.to_local().copy_(local)
        else:
            param.copy_(full)
    cos, sin = rope_tables(spec.head_dim, spec.max_seq_len, device)
    for module in model.modules():
        if isinstance(module, Transformer):
            module.rope_cos = cos
            module.rope_sin = sin
