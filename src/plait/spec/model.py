"""ModelSpec: a decoder-only transformer as plain data, with exact parameter and FLOP counts.

Two architectures:
  * ``llama``: RMSNorm (weight only), gated MLP (gate, up, down; SwiGLU unless ``activation``
    says otherwise), rotary positions (no parameters), grouped-query attention
    (``n_kv_heads`` <= ``n_heads``), no biases unless ``qkv_bias``/``attn_out_bias``/``mlp_bias``.
  * ``gpt``: LayerNorm (weight and bias), GELU MLP (fc1, fc2 with biases), learned position
    embeddings of ``max_seq_len`` rows, biases on every linear layer, multi-head attention.

Features read from Hugging Face configs (``plait.spec.hf_config``; every default keeps the plain
architectures above, and ``to_dict`` leaves out fields at their default so older model JSON and
presets read and write unchanged):
  * ``head_dim``: width of one head when it is not hidden / n_heads (Qwen3, Gemma-2). Q and the
    attention output are ``q_hidden`` = n_heads·head_dim wide, K and V ``kv_hidden`` =
    n_kv_heads·head_dim: it changes the Q/K/V/O weights, attention FLOPs and the K/V activations.
  * biases: ``qkv_bias`` (Qwen2), ``attn_out_bias``, ``mlp_bias`` (on gate, up and down).
  * ``qk_norm``: an RMSNorm on queries and keys after their projections, before RoPE:
    ``"head"`` normalizes each head over head_dim with one weight of head_dim elements shared by
    all heads (Qwen3); ``"full"`` normalizes the whole projection, with a weight of q_hidden
    (queries) and kv_hidden (keys) elements (OLMo-2).
  * ``norm_position``: ``"pre"`` (norm before each sub-block), ``"post"`` (OLMo-2: the norm is
    applied to the sub-block's output before the residual add, no norm before it), ``"sandwich"``
    (Gemma-2: both, four norms per layer).
  * ``sliding_window`` W > 0: a query at position i sees the keys max(0, i-W+1)..i
    (min(i+1, W) keys) in the layers ``local_layers`` names: ``"all"``, or ``"even"`` (layers 0,
    2, 4, ...: Gemma-2, whose odd layers are global).
  * ``attn_softcap``/``logit_softcap`` c > 0 (Gemma-2): scores (logits) become c·tanh(x/c).
    Element-wise: no matmul FLOPs; the runtime needs eager attention for ``attn_softcap``.
  * ``activation`` of the MLP ("silu", "gelu_tanh", "gelu"; "" is the architecture's: silu for
    llama, gelu_tanh for gpt); ``norm_offset`` (Gemma: RMSNorm scales by 1 + weight, weights
    start at 0); ``embed_scale`` (Gemma: embeddings times sqrt(hidden)); ``attn_scale`` (the
    score scale; 0 is 1/sqrt(head_dim)); ``rope_theta``, ``norm_eps``. None of these change
    parameters, FLOPs or saved activations.
  * ``rope_scaling``: recorded as (key, value) pairs (``plait.spec.hf.families.hf_rope_scaling``'s
    form, checked by ``rope_scaling_problems``); changes no parameters, FLOPs or memory (it only
    stretches the rotary frequencies). The runtime applies every type: default, linear, dynamic,
    llama3, yarn, longrope (``plait.run.modules.layers.rope_tables``).
  * ``max_seq_len`` is the config's ``max_position_embeddings``: a hard limit only for learned
    positions (``learned_positions``, arch=gpt); a RoPE model trains at any length, past it with a
    warning (``plait.spec.validate.past_positions_warning``).
  * ``family``: the Hugging Face ``model_type`` the spec was read from (its weight names).
  * ``sinks`` (GPT-OSS): one learned sink logit per head, a softmax column no value goes with:
    n_heads parameters per layer; its FLOPs (one more score per query) and memory are negligible
    and not counted.

Optional parts (``plait.spec.moe.parts``; None: absent), counted by ``plait.spec.moe.counts``:
``moe`` (routed and shared experts: ``total_params`` counts every expert, ``active_params`` and
the FLOPs only those a token uses) and ``mla`` (DeepSeek's multi-head latent attention).

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
from plait.spec.hf.families import rope_scaling_problems
from plait.spec.moe import counts as moe_counts
from plait.spec.moe.parts import MLASpec, MoESpec, coerce_parts
from plait.spec.serialize import dataclass_from_dict, parse_json

ARCHS = ("llama", "gpt")
QK_NORMS = ("none", "head", "full")
NORM_POSITIONS = ("pre", "post", "sandwich")
LOCAL_LAYERS = ("all", "even")
ACTIVATIONS = ("silu", "gelu_tanh", "gelu")

MAX_DIMENSION = 2**31  # largest width, head count, vocabulary or context a ModelSpec takes
MAX_LAYERS = 10_000  # largest layer count: the planner builds lists over a stage's layers (as hf_config's cap)


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
    max_seq_len: int = 2048  # rows of the learned position table (gpt); config's RoPE context, not a limit (llama)
    tied_embeddings: bool = False  # LM head shares the token-embedding matrix
    dropout: bool = False  # dropout layers present (their 1-byte masks are saved activations)
    # ---- features of Hugging Face models (module docstring); defaults are the plain architectures
    head_dim: int | None = None  # elements per attention head; None: hidden // n_heads
    qkv_bias: bool | None = None  # biases on Q, K, V; None: the architecture's (gpt yes, llama no)
    attn_out_bias: bool | None = None  # bias on the attention output projection; None: as above
    mlp_bias: bool | None = None  # biases on the MLP projections; None: as above
    qk_norm: str = "none"  # "none", "head" (RMSNorm per head, Qwen3), "full" (whole projection, OLMo-2)
    norm_position: str = "pre"  # "pre", "post" (OLMo-2), "sandwich" (pre and post, Gemma-2)
    sliding_window: int = 0  # keys a query sees in a local layer (itself included); 0: no window
    local_layers: str = "all"  # layers with the window: "all" or "even" (0, 2, ...: Gemma-2)
    attn_softcap: float = 0.0  # attention scores become c·tanh(s/c); 0: off (Gemma-2: 50)
    logit_softcap: float = 0.0  # output logits become c·tanh(z/c); 0: off (Gemma-2: 30)
    activation: str | None = None  # MLP activation; None: silu (llama), gelu_tanh (gpt)
    norm_offset: bool = False  # RMSNorm scales by (1 + weight), weights initialized to 0 (Gemma)
    embed_scale: float = 1.0  # token embeddings are multiplied by this (Gemma: sqrt(hidden))
    attn_scale: float = 0.0  # attention score scale; 0: 1/sqrt(head_dim)
    rope_theta: float = 10000.0  # RoPE base (llama)
    rope_scaling: tuple = ()  # (key, value) pairs of the config's rope_scaling, sorted; recorded only
    norm_eps: float = 1e-5  # epsilon of every norm
    family: str = ""  # Hugging Face model_type read from ("" for presets and plait model JSON)
    sinks: bool = False  # one learned attention-sink logit per head (GPT-OSS): n_heads parameters a layer
    # ---- optional parts (plait.spec.moe.parts; counted by plait.spec.moe.counts); None: absent
    moe: MoESpec | None = None  # routed/shared experts
    mla: MLASpec | None = None  # multi-head latent attention (DeepSeek-V2/V3)

    def __post_init__(self) -> None:
        gpt = self.arch == "gpt"
        for field in ("qkv_bias", "attn_out_bias", "mlp_bias"):
            if getattr(self, field) is None:
                object.__setattr__(self, field, gpt)
        if self.activation is None:
            object.__setattr__(self, "activation", "gelu_tanh" if gpt else "silu")
        if isinstance(self.rope_scaling, dict):  # as in config.json and in ModelSpec.to_dict
            object.__setattr__(self, "rope_scaling", rope_scaling_pairs(self.rope_scaling))
        elif isinstance(self.rope_scaling, list):  # pairs as JSON lists (dataclasses.asdict of a spec)
            try:
                object.__setattr__(self, "rope_scaling", rope_scaling_pairs(dict(self.rope_scaling)))
            except (TypeError, ValueError):
                raise PlaitError(f"model {self.name!r}: rope_scaling must be an object of settings") from None
        problems = [] if isinstance(self.name, str) else [f"name={self.name!r} must be a string"]
        if self.head_dim is None:
            if isinstance(self.hidden, int) and isinstance(self.n_heads, int) and self.n_heads > 0:
                if self.hidden % self.n_heads:
                    problems.append(f"n_heads={self.n_heads} does not divide hidden={self.hidden}")
                object.__setattr__(self, "head_dim", self.hidden // self.n_heads)
            else:
                object.__setattr__(self, "head_dim", 1)
        if self.arch not in ARCHS:
            problems.append(f"arch={self.arch!r} is not one of {', '.join(ARCHS)}")
        for field in ("n_layers", "hidden", "ffn_hidden", "n_heads", "n_kv_heads", "vocab", "max_seq_len",
                      "head_dim"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                problems.append(f"{field}={value!r} must be a positive integer")
            elif value > MAX_DIMENSION:  # larger sizes overflow the planner's float arithmetic
                problems.append(f"{field}={value} is more than {MAX_DIMENSION} (2^31)")
            elif field == "n_layers" and value > MAX_LAYERS:  # a list of 3e8 layers took minutes and 2.5 GB
                problems.append(f"n_layers={value} is more than {MAX_LAYERS:,}")
        if not problems:
            problems += coerce_parts(self)
        if not problems:
            if self.n_heads % self.n_kv_heads:
                problems.append(f"n_kv_heads={self.n_kv_heads} does not divide n_heads={self.n_heads}")
        problems += self._feature_problems()
        if problems:
            raise PlaitError(f"model {self.name!r}: " + "; ".join(problems))

    def _feature_problems(self) -> list[str]:
        """What is wrong with the Hugging Face feature fields (module docstring)."""
        problems = []
        for field, allowed in (("qk_norm", QK_NORMS), ("norm_position", NORM_POSITIONS),
                               ("local_layers", LOCAL_LAYERS), ("activation", ACTIVATIONS)):
            if getattr(self, field) not in allowed:
                problems.append(f"{field}={getattr(self, field)!r} is not one of {', '.join(allowed)}")
        for field in ("qkv_bias", "attn_out_bias", "mlp_bias", "norm_offset", "tied_embeddings", "dropout", "sinks"):
            if not isinstance(getattr(self, field), bool):
                problems.append(f"{field}={getattr(self, field)!r} must be true or false")
        if not isinstance(self.sliding_window, int) or isinstance(self.sliding_window, bool) \
                or not 0 <= self.sliding_window <= MAX_DIMENSION:
            problems.append(f"sliding_window={self.sliding_window!r} must be an integer >= 0 (0: no window)")
        for field in ("attn_softcap", "logit_softcap", "attn_scale", "norm_eps"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
                problems.append(f"{field}={value!r} must be a finite number >= 0")
        for field in ("embed_scale", "rope_theta"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                problems.append(f"{field}={value!r} must be a finite number > 0")
        if self.arch == "gpt":
            llama_only = [f for f, default in (("qk_norm", "none"), ("norm_position", "pre"), ("norm_offset", False),
                                               ("rope_scaling", ())) if getattr(self, f) != default]
            if llama_only:
                problems.append(f"{', '.join(llama_only)} apply to arch=llama (RMSNorm, RoPE) only")
        elif isinstance(self.rope_scaling, tuple) and isinstance(self.head_dim, int):
            rotary = self.mla.qk_rope_head_dim if isinstance(self.mla, MLASpec) else self.head_dim
            problems += rope_scaling_problems(dict(self.rope_scaling), rotary)
        return problems

    # ----------------------------------------------------------------- shapes
    @property
    def q_hidden(self) -> int:
        """Width of the Q projection and of the attention output: n_heads · head_dim."""
        return self.n_heads * self.head_dim

    @property
    def kv_hidden(self) -> int:
        """Width of the K (and of the V) projection: n_kv_heads · head_dim."""
        return self.n_kv_heads * self.head_dim

    @property
    def learned_positions(self) -> bool:
        """Positions are a learned table of ``max_seq_len`` rows (gpt): no sequence may be longer.
        RoPE (llama) rotates by the position and runs at any length."""
        return self.arch == "gpt"

    @property
    def gated(self) -> bool:
        """The MLP has a gate projection (llama: gate, up, down) rather than fc1, fc2 (gpt)."""
        return self.arch == "llama"

    def is_local_layer(self, layer: int) -> bool:
        """Whether layer ``layer`` (0-based) attends through the sliding window."""
        if not self.sliding_window:
            return False
        return self.local_layers == "all" or layer % 2 == 0

    def local_layer_count(self) -> int:
        if not self.sliding_window:  # the common case, asked for in the planner's inner loop
            return 0
        return sum(self.is_local_layer(i) for i in range(self.n_layers))

    # ------------------------------------------------------- parameter counts
    def layer_matmul_params(self) -> int:
        """Weights of one block that take part in matmuls (no biases, no norms). With experts or
        MLA: the weights one token uses, averaged over the layers (``plait.spec.moe.counts``)."""
        if self.moe is not None or self.mla is not None:  # plait.spec.moe.parts.is_extended, inlined (hot)
            return moe_counts.blocks_active_matmul(self) / self.n_layers
        h, f, q, kv = self.hidden, self.ffn_hidden, self.q_hidden, self.kv_hidden
        attention = h * q + 2 * h * kv + q * h  # Q, K, V, output projection
        mlp = 3 * h * f if self.gated else 2 * h * f  # a gated MLP has gate, up, down
        return attention + mlp

    def layer_bias_params(self) -> int:
        """Bias elements of one block."""
        return self.attention_bias_params() + self.mlp_bias_params()

    def attention_bias_params(self) -> int:
        """Bias elements of one block's Q, K, V and output projections."""
        qkv = self.q_hidden + 2 * self.kv_hidden if self.qkv_bias else 0
        return qkv + (self.hidden if self.attn_out_bias else 0)

    def mlp_bias_params(self) -> int:
        """Bias elements of one (dense) MLP."""
        f = self.ffn_hidden
        return ((2 * f if self.gated else f) + self.hidden) if self.mlp_bias else 0

    def layer_norm_params(self) -> int:
        """Norm weights (and LayerNorm biases) of one block, q/k norms included."""
        h = self.hidden
        if self.arch == "gpt":
            return 2 * 2 * h  # two LayerNorms with weight and bias
        norms = {"pre": 2, "post": 2, "sandwich": 4}[self.norm_position] * h
        qk = {"none": 0, "head": 2 * self.head_dim, "full": self.q_hidden + self.kv_hidden}[self.qk_norm]
        return norms + qk

    def layer_params(self) -> int:
        """All parameters of one transformer block (with experts or MLA: the mean over layers)."""
        if self.moe is not None or self.mla is not None:  # plait.spec.moe.parts.is_extended, inlined (hot)
            return moe_counts.blocks_params(self) / self.n_layers
        return (self.layer_matmul_params() + self.layer_bias_params() + self.layer_norm_params()
                + self.layer_sink_params())

    def layer_sink_params(self) -> int:
        """Attention-sink logits of one block (``sinks``: one per head)."""
        return self.n_heads if self.sinks else 0

    def final_norm_params(self) -> int:
        return self.hidden if self.arch == "llama" else 2 * self.hidden

    def embedding_params(self) -> int:
        """Token embedding (and, for gpt, learned positions); the LM head if it is not tied."""
        token = self.vocab * self.hidden
        positions = self.max_seq_len * self.hidden if self.arch == "gpt" else 0
        head = 0 if self.tied_embeddings else self.vocab * self.hidden
        return token + positions + head

    def non_embedding_params(self) -> int:
        if self.moe is not None or self.mla is not None:  # plait.spec.moe.parts.is_extended, inlined (hot)
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
        if self.moe is not None or self.mla is not None:  # plait.spec.moe.parts.is_extended, inlined (hot)
            return moe_counts.blocks_active_matmul(self) + self.vocab * self.hidden
        return self.n_layers * self.layer_matmul_params() + self.vocab * self.hidden

    # ------------------------------------------------------------------ FLOPs
    def keys_per_query(self, seq_len: int, local: bool, causal: bool = True) -> float:
        """Keys a query sees, averaged over a sequence of ``seq_len`` tokens, in a global layer
        (causal: (s+1)/2; ``causal=False``: s) or a local one (window W: the average of
        min(i+1, W) over i < s; ``causal=False``: min(s, W))."""
        s = float(seq_len)
        window = self.sliding_window if local else 0
        if not window or window >= seq_len:
            return (s + 1) / 2.0 if causal else s
        if not causal:
            return float(window)
        w = float(window)
        return (w * (w + 1) / 2.0 + (s - w) * w) / s

    def attention_flops_per_token(self, seq_len: int, causal: bool = True) -> float:
        """Forward FLOPs of Q·Kᵀ and P·V per token, summed over layers (see module doc): 2·2 FLOPs
        per key seen and element of a query head, sliding-window layers seeing fewer keys (MLA:
        ``plait.spec.moe.counts``, its query/key and value widths differ)."""
        if self.mla is not None:
            return moe_counts.attention_flops_per_token(self, seq_len, causal)
        local = self.local_layer_count()
        keys = (local * self.keys_per_query(seq_len, True, causal)
                + (self.n_layers - local) * self.keys_per_query(seq_len, False, causal))
        return 4.0 * self.q_hidden * keys

    def forward_flops_per_token(self, seq_len: int, causal: bool = True) -> float:
        """Forward matmul FLOPs per token: 2·(matmul weights) + attention."""
        return 2.0 * self.matmul_params() + self.attention_flops_per_token(seq_len, causal)

    def model_flops_per_token(self, seq_len: int, causal: bool = True) -> float:
        """Model FLOPs per trained token (forward + backward, no recomputation): 3 × forward."""
        return 3.0 * self.forward_flops_per_token(seq_len, causal)

    # --------------------------------------------------------- serialization
    def to_dict(self) -> dict:
        """All fields, less the feature fields at their defaults (older readers read it)."""
        out = dataclasses.asdict(self)
        gpt = self.arch == "gpt"
        defaults = {f.name: f.default for f in dataclasses.fields(self) if f.name in _FEATURES}
        defaults.update(qkv_bias=gpt, attn_out_bias=gpt, mlp_bias=gpt, activation="gelu_tanh" if gpt else "silu",
                        head_dim=self.hidden // self.n_heads if self.hidden % self.n_heads == 0 else None)
        for name, default in defaults.items():
            if out[name] == default:
                del out[name]
        if "rope_scaling" in out:
            out["rope_scaling"] = dict(self.rope_scaling)
        return out

    @classmethod
    def from_dict(cls, data: dict) -> ModelSpec:
        return dataclass_from_dict(cls, data, "model")

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text: str) -> ModelSpec:
        return cls.from_dict(parse_json(text))


_FEATURES = {f.name for f in dataclasses.fields(ModelSpec)} - {
    "name", "arch", "n_layers", "hidden", "ffn_hidden", "n_heads", "n_kv_heads", "vocab", "max_seq_len",
    "tied_embeddings", "dropout"}


def rope_scaling_pairs(config: dict) -> tuple:
    """A config's ``rope_scaling`` dict as sorted (key, value) pairs (lists become tuples), hashable."""
    def frozen(value):
        return tuple(frozen(v) for v in value) if isinstance(value, list) else value
    return tuple(sorted((str(k), frozen(v)) for k, v in config.items() if v is not None))
