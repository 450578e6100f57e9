"""ModelSpec: a decoder-only transformer as plain data, with exact parameter and FLOP counts.

Two architectures:
  * ``llama``: RMSNorm (weight only), SwiGLU MLP (gate, up, down; no biases), rotary positions
    (no parameters), grouped-query attention (``n_kv_heads`` <= ``n_heads``), no biases.
  * ``gpt``: LayerNorm (weight and bias), GELU MLP (fc1, fc2 with biases), learned position
    embeddings of ``max_seq_len`` rows, biases on every linear layer, multi-head attention.

FLOP conventions (one definition everywhere in plait):
  * A matmul of an (m x k) by a (k x n) matrix costs 2·m·k·n FLOPs. Biases, norms, softmax
    and other element-wise work are not counted.
  * Backward costs twice the forward (gradient w.r.t. inputs and w.r.t. weights).
  * Attention scores (Q·Kᵀ) and values (P·V) cost 2·2·s·d per token and layer in the forward
    when every query sees every key (d = n_heads·head_dim). With a causal mask a query at
    position i sees i+1 keys, so the exact count over a sequence is s(s+1)/2 of the s² pairs.
    **Model FLOPs count the causal mask explicitly**: the attention term is multiplied by
    (s+1)/(2s). ``causal=False`` gives the full-square count that Megatron-LM, torchtitan and
    MosaicML use in their own MFU figures (the validator converts between the two).
  * Model FLOPs exclude recomputation; hardware FLOPs (``plait.plan.flops``) include it.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from plait.errors import PlaitError
from plait.spec.moe import counts as moe_counts
from plait.spec.moe.parts import AttentionExtras, MLASpec, MoESpec, attention_head_dim, coerce_parts, is_extended
from plait.spec.serialize import dataclass_from_dict, parse_json

ARCHS = ("llama", "gpt")
MAX_DIMENSION = 2**31  # largest layer count, width, head count, vocabulary or context a ModelSpec takes


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer. All sizes are element counts (not bytes)."""

    name: str
    arch: str  # "llama" or "gpt"
    n_layers: int
    hidden: int
    ffn_hidden: int
    n_heads: int
    n_kv_heads: int
    vocab: int
    max_seq_len: int = 2048  # rows of the learned position table (gpt); RoPE context (llama)
    tied_embeddings: bool = False  # LM head shares the token-embedding matrix
    dropout: bool = False  # dropout layers present (their 1-byte masks are saved activations)
    # optional parts (plait.spec.moe.parts; counted by plait.spec.moe.counts); None: absent
    moe: MoESpec | None = None  # routed/shared experts
    mla: MLASpec | None = None  # multi-head latent attention (DeepSeek-V2/V3)
    attn_extras: AttentionExtras | None = None  # head_dim, Q/K/V biases, qk-norm, sliding window, sinks

    def __post_init__(self) -> None:
        problems = []
        if self.arch not in ARCHS:
            problems.append(f"arch={self.arch!r} is not one of {', '.join(ARCHS)}")
        for field in ("n_layers", "hidden", "ffn_hidden", "n_heads", "n_kv_heads", "vocab", "max_seq_len"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                problems.append(f"{field}={value!r} must be a positive integer")
            elif value > MAX_DIMENSION:  # larger sizes overflow the planner's float arithmetic
                problems.append(f"{field}={value} is more than {MAX_DIMENSION} (2^31)")
        if not problems:
            problems += coerce_parts(self)
        if not problems:
            if self.hidden % self.n_heads and attention_head_dim(self) == self.hidden // self.n_heads:
                problems.append(f"n_heads={self.n_heads} does not divide hidden={self.hidden}")
            if self.n_heads % self.n_kv_heads:
                problems.append(f"n_kv_heads={self.n_kv_heads} does not divide n_heads={self.n_heads}")
        if problems:
            raise PlaitError(f"model {self.name!r}: " + "; ".join(problems))

    # ----------------------------------------------------------------- shapes
    @property
    def head_dim(self) -> int:
        return self.hidden // self.n_heads if self.attn_extras is None else attention_head_dim(self)

    @property
    def kv_hidden(self) -> int:
        """Width of the K (and of the V) projection: n_kv_heads · head_dim."""
        return self.n_kv_heads * self.head_dim

    # ------------------------------------------------------- parameter counts
    def layer_matmul_params(self) -> int:
        """Weights of one block that take part in matmuls (no biases, no norms). With experts: the
        weights one token uses, averaged over the layers (``plait.spec.moe.counts``)."""
        if is_extended(self):
            return moe_counts.blocks_active_matmul(self) / self.n_layers
        h, f, kv = self.hidden, self.ffn_hidden, self.kv_hidden
        attention = h * h + 2 * h * kv + h * h  # Q, K, V, output projection
        mlp = 3 * h * f if self.arch == "llama" else 2 * h * f  # SwiGLU has gate, up, down
        return attention + mlp

    def layer_params(self) -> int:
        """All parameters of one transformer block (with experts, MLA or extras: the mean over layers)."""
        if is_extended(self):
            return moe_counts.blocks_params(self) / self.n_layers
        h, f, kv = self.hidden, self.ffn_hidden, self.kv_hidden
        if self.arch == "llama":
            return self.layer_matmul_params() + 2 * h  # two RMSNorm weights
        biases = (h + 2 * kv) + h + f + h  # qkv, proj, fc1, fc2
        norms = 2 * 2 * h  # two LayerNorms with weight and bias
        return self.layer_matmul_params() + biases + norms

    def final_norm_params(self) -> int:
        return self.hidden if self.arch == "llama" else 2 * self.hidden

    def embedding_params(self) -> int:
        """Token embedding (and, for gpt, learned positions); the LM head if it is not tied."""
        token = self.vocab * self.hidden
        positions = self.max_seq_len * self.hidden if self.arch == "gpt" else 0
        head = 0 if self.tied_embeddings else self.vocab * self.hidden
        return token + positions + head

    def non_embedding_params(self) -> int:
        if is_extended(self):
            return moe_counts.blocks_params(self) + self.final_norm_params()
        return self.n_layers * self.layer_params() + self.final_norm_params()

    def total_params(self) -> int:
        """Exact number of parameters of the model (counts a tied matrix once)."""
        return self.non_embedding_params() + self.embedding_params()

    def active_params(self) -> int:
        """Parameters one token uses: total less the routed experts it skips (= total when dense)."""
        return moe_counts.active_params(self)

    def matmul_params(self) -> int:
        """Weights used in matmuls for every token: all blocks plus the LM head (active ones with experts)."""
        if is_extended(self):
            return moe_counts.blocks_active_matmul(self) + self.vocab * self.hidden
        return self.n_layers * self.layer_matmul_params() + self.vocab * self.hidden

    # ------------------------------------------------------------------ FLOPs
    def attention_flops_per_token(self, seq_len: int, causal: bool = True) -> float:
        """Forward FLOPs of Q·Kᵀ and P·V per token, summed over layers (see module doc)."""
        if is_extended(self):
            return moe_counts.attention_flops_per_token(self, seq_len, causal)
        full = 4.0 * seq_len * self.n_heads * self.head_dim * self.n_layers
        return full * (seq_len + 1) / (2.0 * seq_len) if causal else full

    def forward_flops_per_token(self, seq_len: int, causal: bool = True) -> float:
        """Forward matmul FLOPs per token: 2·(matmul weights) + attention."""
        return 2.0 * self.matmul_params() + self.attention_flops_per_token(seq_len, causal)

    def model_flops_per_token(self, seq_len: int, causal: bool = True) -> float:
        """Model FLOPs per trained token (forward + backward, no recomputation): 3 × forward."""
        return 3.0 * self.forward_flops_per_token(seq_len, causal)

    # --------------------------------------------------------- serialization
    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ModelSpec:
        return dataclass_from_dict(cls, data, "model")

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text: str) -> ModelSpec:
        return cls.from_dict(parse_json(text))
