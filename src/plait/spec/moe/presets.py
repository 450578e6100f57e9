"""Mixture-of-experts presets, each with its source. ``plait models`` lists them with ``plait.spec.models``.

Dimensions are those of the released Hugging Face ``config.json`` files (the model cards name
them); the exact total and active counts that follow (``ModelSpec.total_params``,
``active_params``) were checked against transformers 5.23's own classes instantiated on the meta
device (tests/spec/test_moe_counts.py states each number):

  name              total parameters   active    source
  mixtral-8x7b      46,702,792,704     12.88B    Jiang et al. 2024, "Mixtral of Experts" (46.7B / 12.9B
                                                 active); mistralai/Mixtral-8x7B-v0.1 config.json
  mixtral-8x22b     140,630,071,296    39.16B    mistralai/Mixtral-8x22B-v0.1 config.json (141B / 39B)
  qwen3-30b-a3b     30,532,122,624      3.35B    Qwen3 Technical Report 2025, Table 2; Qwen/Qwen3-30B-A3B
                                                 config.json (head_dim 128, Q/K RMSNorm per head)
  qwen3-235b-a22b   235,093,634,560    22.19B    same report; Qwen/Qwen3-235B-A22B config.json
  olmoe-1b-7b       6,919,161,856       1.28B    Muennighoff et al. 2024, "OLMoE"; allenai/OLMoE-1B-7B-0924
                                                 config.json (Q/K norms over the whole projections, no top-k
                                                 renormalization)
  deepseek-v3       671,026,404,352    37.55B    DeepSeek-AI 2024, "DeepSeek-V3 Technical Report" (671B /
                                                 37B); deepseek-ai/DeepSeek-V3 config.json. Multi-token
                                                 prediction is OFF: its extra module (14B, the 685B of the
                                                 checkpoint) is not counted.
  gpt-oss-120b      116,829,156,672     5.71B    OpenAI 2025, "gpt-oss-120b & gpt-oss-20b Model Card" (116.8B;
                                                 its 5.1B active leaves out the token embedding, 0.58B);
                                                 openai/gpt-oss-120b config.json
  tiny-moe          (small)                      for the runtime tests: 4 layers, 8 experts top-2, one
                                                 shared expert, the first layer dense
  tiny-dsv3         (small)                      for the runtime tests: DeepSeek-V3 in small, 4 layers, MLA
                                                 (q rank 64, kv rank 32, heads 32+16 wide, values 32), 8 experts
                                                 top-2 by the sigmoid router (4 groups, 2 chosen, scale 2.5), one
                                                 shared expert, the first layer dense
  tiny-gpt-oss      (small)                      for the runtime tests: GPT-OSS in small, 4 layers, hidden 128,
                                                 4 heads of 32 (2 KV heads) with Q/K/V/O biases and sinks,
                                                 16-token windows on the even layers, 8 experts top-2 with
                                                 router and expert biases and the clamped SwiGLU

Sequence lengths are the configs' max_position_embeddings. Aux-loss coefficients are the configs'
``router_aux_loss_coef`` (Mixtral 0.02, Qwen3 0.001, OLMoE 0.01, GPT-OSS 0.9); DeepSeek-V3
balances with the router bias (its 0.0001 sequence-wise loss is recorded). Attention features are
ModelSpec fields (Qwen3-MoE: head_dim 128, qk_norm "head"; OLMoE: qk_norm "full"; GPT-OSS: head_dim
64, Q/K/V and output biases, 128-token windows on the even layers, sinks). RoPE settings and norm
epsilons change no count; DeepSeek-V3 and GPT-OSS carry their released ones (DeepSeek-V3: norm epsilon
1e-6, yarn x40 from 4,096 positions with mscale 1/1; GPT-OSS: theta 150,000, yarn x32 from 4,096), so
that a run or an export of the preset computes as the released model; the others keep the defaults
(``--model config.json`` reads a config's own).
"""

from __future__ import annotations

from plait.spec.model import ModelSpec
from plait.spec.moe.parts import MLASpec, MoESpec


def _rope(**scaling) -> tuple:
    """A released config's rope_scaling as ``ModelSpec.rope_scaling`` records it: sorted (key, value) pairs."""
    return tuple(sorted(scaling.items()))


def _moe(name, layers, hidden, ffn, heads, kv, vocab, seq, moe: MoESpec, **features) -> ModelSpec:
    """A llama-architecture MoE preset; ``features``: ModelSpec fields (head_dim, qk_norm, mla, ...)."""
    return ModelSpec(name=name, arch="llama", n_layers=layers, hidden=hidden, ffn_hidden=ffn, n_heads=heads,
                     n_kv_heads=kv, vocab=vocab, max_seq_len=seq, moe=moe, **features)


_QWEN3 = dict(head_dim=128, qk_norm="head")

MOE_PRESETS = [
    _moe("mixtral-8x7b", 32, 4096, 14336, 32, 8, 32000, 32768, MoESpec(8, 2, 14336, aux_loss_coef=0.02)),
    _moe("mixtral-8x22b", 56, 6144, 16384, 48, 8, 32768, 65536, MoESpec(8, 2, 16384, aux_loss_coef=0.001)),
    _moe("qwen3-30b-a3b", 48, 2048, 6144, 32, 4, 151936, 40960, MoESpec(128, 8, 768, aux_loss_coef=0.001),
         **_QWEN3),
    _moe("qwen3-235b-a22b", 94, 4096, 12288, 64, 4, 151936, 40960, MoESpec(128, 8, 1536, aux_loss_coef=0.001),
         **_QWEN3),
    _moe("olmoe-1b-7b", 16, 2048, 1024, 16, 16, 50304, 4096,
         MoESpec(64, 8, 1024, norm_topk=False, aux_loss_coef=0.01), qk_norm="full"),
    _moe("deepseek-v3", 61, 7168, 18432, 128, 128, 129280, 163840,
         MoESpec(256, 8, 2048, n_shared=1, first_dense=3, router="sigmoid", n_groups=8, topk_groups=4,
                 route_scale=2.5, aux_loss_coef=0.0001),
         mla=MLASpec(q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128),
         norm_eps=1e-6, rope_scaling=_rope(rope_type="yarn", factor=40.0, beta_fast=32.0, beta_slow=1.0, mscale=1.0,
                                           mscale_all_dim=1.0, original_max_position_embeddings=4096)),
    _moe("gpt-oss-120b", 36, 2880, 2880, 64, 8, 201088, 131072,
         MoESpec(128, 4, 2880, router_bias=True, expert_bias=True, activation="oai", aux_loss_coef=0.9),
         head_dim=64, qkv_bias=True, attn_out_bias=True, sliding_window=128, local_layers="even", sinks=True,
         rope_theta=150000.0, rope_scaling=_rope(rope_type="yarn", factor=32.0, beta_fast=32.0, beta_slow=1.0,
                                                 truncate=False, original_max_position_embeddings=4096)),
    _moe("tiny-moe", 4, 128, 384, 4, 2, 512, 256, MoESpec(8, 2, 96, n_shared=1, first_dense=1, aux_loss_coef=0.01)),
    _moe("tiny-dsv3", 4, 128, 384, 4, 4, 512, 256,
         MoESpec(8, 2, 96, n_shared=1, first_dense=1, router="sigmoid", n_groups=4, topk_groups=2, route_scale=2.5,
                 aux_loss_coef=0.0001),
         mla=MLASpec(q_lora_rank=64, kv_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32),
         norm_eps=1e-6),
    _moe("tiny-gpt-oss", 4, 128, 96, 4, 2, 512, 256,
         MoESpec(8, 2, 96, router_bias=True, expert_bias=True, activation="oai", aux_loss_coef=0.01),
         head_dim=32, qkv_bias=True, attn_out_bias=True, sliding_window=16, local_layers="even", sinks=True,
         rope_theta=150000.0),
]
