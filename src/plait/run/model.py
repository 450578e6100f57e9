"""The decoder-only transformer that plait trains, built from a ``ModelSpec``.

Two architectures, matching ``plait.spec.model`` parameter for parameter:
  * ``llama``: RMSNorm, rotary positions, grouped-query attention, SwiGLU MLP, no biases.
  * ``gpt``: LayerNorm, learned positions, multi-head attention and GELU MLP with biases.
and the features a Hugging Face config can name (``ModelSpec``'s docstring): head_dim, biases, q/k norms,
post- and sandwich norms, sliding-window layers (a boolean mask to SDPA), soft-capped attention scores
(eager attention) and logits, Gemma's norm offset and embedding scale, RoPE theta and scaling. Norms, RoPE
and the attention kernels: ``plait.run.modules.layers``; MLA (DeepSeek-V2/V3): ``plait.run.modules.mla``.

Attention runs through ``F.scaled_dot_product_attention`` (FlashAttention kernels on GPU).
Q, K and V are separate linear layers so that column-parallel sharding splits whole heads
(and checkpoints hold ``wq``/``wk``/``wv``); ``Attention.fused_qkv`` (``plait train --fused-qkv``)
runs them as one GEMM over the three weights concatenated (``qkv_projection``).
With context parallelism (``plait.run.parallel.context.ring``) each block's ``Attention.kernel`` is a
cp kernel and the caller passes ``forward(tokens, positions)``: the global positions of the tokens
of each sequence the rank holds, at which RoPE angles and learned positions are taken; the cp code
sets ``Transformer.sequence_parts`` (the ranks sharing a sequence), so that the model knows the whole
sequence's length, and nothing else of how sequences are split.

RoPE tables (``Transformer.rope_for``) cover max(seq_len, max_position_embeddings) positions for the
sequence length trained: a RoPE model trains past its config's max_position_embeddings, and the
scalings that depend on the sequence length (dynamic, longrope) get their tables for it.

The model is built on the meta device (``build_model``), parallelized, moved to its device with
``to_empty`` and only then initialized (``init_weights``): every parameter is drawn from a
generator seeded by (seed, parameter name), as a full tensor, and each rank keeps its shard.
The same seed therefore gives the same full weights whatever the layout.

Layers live in an ``nn.ModuleDict`` keyed "0".."L-1" so that pipeline stages, which delete the
layers they do not own, keep the parameter names of the full model. A stage without the
embedding (or the head) has ``tok_embeddings = None`` (``norm``/``output`` = None).
"""

from __future__ import annotations

import functools
import hashlib
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from plait.run.modules.layers import (
    LayerNorm,
    RMSNorm,
    activation_function,
    apply_rope,
    core_attention,
    eager_attention,
    make_norm,
    rope_depends_on_length,
    rope_tables,
)
from plait.run.modules.documents import document_positions
from plait.run.modules.flex import flex_attention_kernel
from plait.run.modules.mla import LatentAttention, rotary_dim
from plait.run.modules.moe import MoEFeedForward
from plait.spec.model import ModelSpec
from plait.spec.moe.parts import is_moe_layer

INIT_STD = 0.02  # standard deviation of every weight matrix (GPT-2 / Megatron convention)
DROPOUT = 0.1  # used only when ModelSpec.dropout is set


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


def apply_kernels(model: nn.Module, attn: str, norm: str, loss: str = "unfused") -> None:
    """Select the layout's kernels (``Layout.attn``, ``norm``, ``loss``) in a (stage) model, in place.

    ``attn``: ``flash`` and ``sdpa`` both call ``F.scaled_dot_product_attention`` and let its
    dispatcher choose (FlashAttention-2 on sm80+ CUDA GPUs in bf16/fp16 with head_dim <= 256,
    else the memory-efficient or math kernel; on the CPU its flash kernel, or the fp32 math
    fallback with dropout); ``flex`` runs FlexAttention (``plait.run.modules.flex``: soft-caps,
    windows, sinks and documents in one fused kernel, with its fallbacks); ``eager`` runs
    ``eager_attention``. ``norm``: ``fused`` is
    ``F.rms_norm`` / ``nn.LayerNorm`` (one kernel on CUDA), ``unfused`` the op chain
    ``unfused_norm``. ``loss=fused``: the model returns the final hidden state instead of the
    logits and the chunked cross entropy (``plait.run.loss``) applies the LM head itself.
    """
    for module in model.modules():
        if isinstance(module, (Attention, LatentAttention)):
            module.kernel = ATTENTION_KERNELS.get(attn, core_attention)
        if isinstance(module, (RMSNorm, LayerNorm)):
            module.fused = norm == "fused"
        if isinstance(module, Transformer):
            module.returns_hidden = loss == "fused"


ATTENTION_KERNELS = {"flash": core_attention, "sdpa": core_attention, "flex": flex_attention_kernel,
                     "eager": eager_attention}  # Layout.attn → Attention.kernel


class Attention(nn.Module):
    """Q, K, V projections (+ q/k norms), RoPE, the attention kernel and the output projection of
    layer ``index`` (which decides whether it attends through the sliding window); ``sinks``
    (ModelSpec.sinks): one sink logit per query head, sharded with the heads under tensor
    parallelism (``plait.run.parallel.tensor``)."""

    def __init__(self, spec: ModelSpec, index: int = 0):
        super().__init__()
        self.head_dim = spec.head_dim
        self.wq = nn.Linear(spec.hidden, spec.q_hidden, bias=spec.qkv_bias)
        self.wk = nn.Linear(spec.hidden, spec.kv_hidden, bias=spec.qkv_bias)
        self.wv = nn.Linear(spec.hidden, spec.kv_hidden, bias=spec.qkv_bias)
        self.wo = nn.Linear(spec.q_hidden, spec.hidden, bias=spec.attn_out_bias)
        # qk_norm "head": one norm over head_dim shared by the heads; "full": over the whole projection
        self.qk_norm = spec.qk_norm
        self.q_norm = make_norm(spec, spec.head_dim if spec.qk_norm == "head" else spec.q_hidden) \
            if spec.qk_norm != "none" else None
        self.k_norm = make_norm(spec, spec.head_dim if spec.qk_norm == "head" else spec.kv_hidden) \
            if spec.qk_norm != "none" else None
        options = {}
        if spec.is_local_layer(index):
            options["window"] = spec.sliding_window
        if spec.attn_scale:
            options["scale"] = spec.attn_scale
        if spec.attn_softcap:
            options["softcap"] = spec.attn_softcap
        self.kernel_options = options  # keyword arguments of the kernel (plait.run.modules.layers)
        self.sinks = nn.Parameter(torch.empty(spec.n_heads)) if spec.sinks else None
        self.rotary = spec.arch == "llama"
        self.dropout_p = DROPOUT if spec.dropout else 0.0
        self.recompute_core = False  # selective checkpointing: recompute the attention core
        # Layout.attn's kernel (apply_kernels); until then SDPA, or FlexAttention where SDPA cannot
        # take the model's soft-cap or sinks (plait generate, which applies no layout)
        self.kernel = flex_attention_kernel if spec.attn_softcap or spec.sinks else core_attention
        self.fused_qkv = False  # one GEMM for Q, K and V (qkv_projection); RuntimeConfig.qkv == "fused"

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                documents: torch.Tensor | None = None) -> torch.Tensor:
        """``documents``: the rows' document ids (batch, whole seq), with --doc-mask (``Transformer.forward``)."""
        batch, seq, _ = x.shape
        # view(..., -1, head_dim): under tensor parallelism each rank holds a subset of heads
        if self.fused_qkv:
            q, k, v = qkv_projection(x, self.wq, self.wk, self.wv)
        else:
            q, k, v = self.wq(x), self.wk(x), self.wv(x)
        if self.qk_norm == "full":
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = (t.view(batch, seq, -1, self.head_dim) for t in (q, k, v))
        if self.qk_norm == "head":
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rotary:
            cos, sin = cos[..., :seq, :], sin[..., :seq, :]  # tables (seq, d/2) or, per row, (batch, seq, d/2)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        dropout_p = self.dropout_p if self.training else 0.0
        options = self.kernel_options if documents is None else {**self.kernel_options, "documents": documents}
        if self.sinks is not None:  # this rank's heads' sinks (a tensor-parallel DTensor holds them sharded)
            sinks = self.sinks.to_local() if hasattr(self.sinks, "to_local") else self.sinks
            options = {**options, "sinks": sinks}
        kernel = functools.partial(self.kernel, **options) if options else self.kernel
        if self.recompute_core:
            out = checkpoint(kernel, q, k, v, dropout_p, use_reentrant=False)
        else:
            out = kernel(q, k, v, dropout_p)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


class FeedForward(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.gated = spec.gated
        bias = spec.mlp_bias
        self.w1 = nn.Linear(spec.hidden, spec.ffn_hidden, bias=bias)  # gate (llama) / fc1 (gpt)
        self.w2 = nn.Linear(spec.ffn_hidden, spec.hidden, bias=bias)  # down / fc2
        self.w3 = nn.Linear(spec.hidden, spec.ffn_hidden, bias=bias) if self.gated else None  # up
        self.act = activation_function(spec.activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            return self.w2(self.act(self.w1(x)) * self.w3(x))
        return self.w2(self.act(self.w1(x)))


class Block(nn.Module):
    """Transformer block ``index``. Pre-norm (``ModelSpec.norm_position`` "pre"): x + attention(norm(x)),
    then + mlp(norm(·)); "post" (OLMo-2): x + norm(attention(x)), then + norm(mlp(·)); "sandwich"
    (Gemma-2): x + norm(attention(norm(x))), then + norm(mlp(norm(·)))."""

    def __init__(self, spec: ModelSpec, index: int = 0):
        super().__init__()
        pre = spec.norm_position in ("pre", "sandwich")
        post = spec.norm_position in ("post", "sandwich")
        self.attention_norm = make_norm(spec) if pre else nn.Identity()
        # multi-head latent attention (DeepSeek-V2/V3): plait.run.modules.mla
        self.attention = LatentAttention(spec, index) if spec.mla is not None else Attention(spec, index)
        self.attention_post_norm = make_norm(spec) if post else None
        self.ffn_norm = make_norm(spec) if pre else nn.Identity()
        # an MoE layer's MLP is routed experts (+ shared experts): plait.run.modules.moe
        self.feed_forward = MoEFeedForward(spec, index) if is_moe_layer(spec, index) else FeedForward(spec)
        self.ffn_post_norm = make_norm(spec) if post else None
        self.dropout = nn.Dropout(DROPOUT) if spec.dropout else nn.Identity()
        self.recompute_mlp = False  # ckpt=mlp: the MLP half runs in a checkpoint

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                documents: torch.Tensor | None = None) -> torch.Tensor:
        # documents as a keyword: tensor parallelism's input plan of the attention names its 3 positional inputs
        a = self.attention(self.attention_norm(x), cos, sin) if documents is None else \
            self.attention(self.attention_norm(x), cos, sin, documents=documents)
        if self.attention_post_norm is not None:
            a = self.attention_post_norm(a)
        h = x + self.dropout(a)
        m = checkpoint(self.mlp_half, h, use_reentrant=False) if self.recompute_mlp else self.mlp_half(h)
        return h + self.dropout(m)

    def mlp_half(self, h: torch.Tensor) -> torch.Tensor:
        """norm, MLP (or MoE block), post norm: what ``ckpt=mlp`` recomputes (``plait.run.memory.recompute``)."""
        m = self.feed_forward(self.ffn_norm(h))
        return m if self.ffn_post_norm is None else self.ffn_post_norm(m)


class Transformer(nn.Module):
    """Token ids (batch, seq) -> logits (batch, seq, vocab); a pipeline stage maps its part."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        self.tok_embeddings: nn.Module | None = nn.Embedding(spec.vocab, spec.hidden)
        self.pos_embeddings: nn.Module | None = (
            nn.Embedding(spec.max_seq_len, spec.hidden) if spec.arch == "gpt" else None)
        self.layers = nn.ModuleDict({str(i): Block(spec, i) for i in range(spec.n_layers)})
        self.norm: nn.Module | None = make_norm(spec)
        self.output: nn.Module | None = nn.Linear(spec.hidden, spec.vocab, bias=False)
        self.returns_hidden = False  # loss=fused: forward stops before the LM head (plait.run.loss)
        self.tie_embeddings()
        # RoPE tables are recomputed by init_weights (they cannot live on the meta device)
        cos, sin = rope_tables(rotary_dim(spec), spec.max_seq_len, "meta", spec.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.rope_seq_len = spec.max_seq_len  # the sequence length (tokens) the RoPE tables were built for
        self.sequence_parts = 1  # ranks holding a share of each sequence (context parallelism sets it)

    def rope_for(self, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The (cos, sin) tables for sequences of ``seq`` tokens: the buffers, rebuilt (on their device)
        when ``seq`` has more positions than they do, or the scaling depends on the length (dynamic,
        longrope: ``plait.run.modules.layers.rope_tables`` for ``seq_len=seq``). A run trains one
        length, so they are rebuilt at most once; learned positions (gpt) have no tables to extend."""
        spec = self.spec
        stale = seq > self.rope_cos.shape[0] or rope_depends_on_length(spec.rope_scaling)
        if seq != self.rope_seq_len and stale and not spec.learned_positions:
            self.rope_cos, self.rope_sin = rope_tables(
                rotary_dim(spec), max(seq, spec.max_seq_len), self.rope_cos.device, spec.rope_theta, spec.rope_scaling,
                seq_len=seq, max_positions=spec.max_seq_len)
            self.rope_seq_len = seq
        return self.rope_cos, self.rope_sin

    def tie_embeddings(self) -> None:
        """Share the LM head's weight with the token embedding (tied models holding both, else no-op).

        Needed again after anything that replaces parameters module by module: TP sharding, and
        ``to_empty`` off the meta device, which gives each module a new Parameter of its own.
        """
        if self.spec.tied_embeddings and self.tok_embeddings is not None and self.output is not None:
            self.output.weight = self.tok_embeddings.weight

    def embed(self, tokens: torch.Tensor, positions: torch.Tensor | None) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        if self.spec.embed_scale != 1.0:  # Gemma: times sqrt(hidden), rounded to the activations' dtype
            h = h * torch.tensor(self.spec.embed_scale, dtype=h.dtype).item()
        if self.pos_embeddings is not None:
            if positions is None:
                positions = torch.arange(tokens.shape[1], device=tokens.device)
            if positions.dim() == 2:  # per row (packed documents): looked up sequence-major, so that sequence
                # parallelism's plan of the table's output (Shard(0)) splits the sequence, not the batch
                h = h + self.pos_embeddings(positions.t()).transpose(0, 1)
            else:
                h = h + self.pos_embeddings(positions)
        return h

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None,
                documents: torch.Tensor | None = None) -> torch.Tensor:
        """``x``: token ids (batch, seq), or a pipeline stage's input activations. ``positions``: the
        global positions (int64, (seq,)) of the tokens of each sequence, when they are not 0..seq-1
        (a context-parallel rank's share of the sequence). ``documents`` (--doc-mask): the document
        ids (int64, (batch, whole seq)) of the rows (``plait.run.modules.documents``): attention
        stays within each document and positions (RoPE angles, learned positions) restart at 0 in
        every document."""
        if documents is not None:  # per-row positions within the documents, at this rank's tokens
            within = document_positions(documents)
            positions = within if positions is None else within[:, positions]
        h = self.embed(x, positions) if self.tok_embeddings is not None else x
        cos, sin = self.rope_for(x.shape[1] * self.sequence_parts)
        if positions is not None:
            cos, sin = cos[positions], sin[positions]
        for layer in self.layers.values():
            h = layer(h, cos, sin) if documents is None else layer(h, cos, sin, documents)
        if self.norm is not None:
            h = self.norm(h)
        if self.output is not None and not self.returns_hidden:
            h = self.output(h)
            if self.spec.logit_softcap:  # Gemma-2: logits become c·tanh(z/c)
                h = torch.tanh(h / self.spec.logit_softcap) * self.spec.logit_softcap
        return h


def build_model(spec: ModelSpec, device: torch.device | str = "meta") -> Transformer:
    """The full model with uninitialized weights (on the meta device by default)."""
    with torch.device(device):
        return Transformer(spec)


def count_parameters(model: nn.Module) -> int:
    """Elements of all parameters, a tied matrix counted once (works on the meta device)."""
    return sum(p.numel() for p in model.parameters())


def kept_buffers(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """(plain-model name, tensor) of the buffers a checkpoint keeps with the parameters: the sigmoid
    routers' balancing biases (``score_bias``)."""
    return [(canonical_name(name), b) for name, b in module.named_buffers() if name.endswith("score_bias")]


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
        ones = leaf == "weight" and not (spec.norm_offset and spec.arch == "llama")  # Gemma: 1 + weight, from 0
        return torch.ones(shape, device=device) if ones else torch.zeros(shape, device=device)
    if leaf == "bias" or leaf.endswith("_bias"):  # linear and expert biases (experts.w1_bias ...)
        return torch.zeros(shape, device=device)
    std = INIT_STD
    if name.endswith(("attention.wo.weight", "feed_forward.w2.weight", "experts.w2", "shared.w2.weight")):
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
    cos, sin = rope_tables(rotary_dim(spec), spec.max_seq_len, device, spec.rope_theta, spec.rope_scaling,
                           max_positions=spec.max_seq_len)
    for module in model.modules():
        if isinstance(module, MoEFeedForward):
            module.reset_buffers()
        if isinstance(module, Transformer):
            module.rope_cos = cos
            module.rope_sin = sin
            module.rope_seq_len = spec.max_seq_len
