"""Every RoPE scaling type plait reads from a config.json gives transformers' rotary embeddings
(``LlamaRotaryEmbedding`` of the same config, fp32, CPU) at sequence lengths up to 4x the original
context: the same inverse frequencies, the same cos/sin scale (yarn's and longrope's attention
factor) and the same cos/sin tables; and plait's model builds its tables for the length it trains,
past max_position_embeddings and across context-parallel shards.

Tolerances, from fp32 arithmetic (eps = 2^-23, the spacing of fp32 numbers at 1):
  * inverse frequencies: each side computes w = 1/theta^(2i/d) (then divides, blends or scales it)
    in a handful of fp32 operations, each rounding by at most half an ulp, so the two differ by at
    most a few ulps: |w - w_hf| <= FREQ_ULPS·eps·|w|.
  * tables: the angle p·w is one more fp32 product on each side, so the angles differ by at most
    (FREQ_ULPS + 1)·eps·|p·w|; cos and sin are 1-Lipschitz and round their result to within an ulp
    or two of values <= 1, and the attention factor a scales both (one more rounding):
    |cos - cos_hf| <= a·((FREQ_ULPS + 1)·eps·|p·w| + 4·eps).
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from transformers import LlamaConfig  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: E402

from plait.run.model import build_model, init_weights  # noqa: E402
from plait.run.modules.layers import rope_attention_factor, rope_inverse_frequencies, rope_tables  # noqa: E402
from plait.spec.hf_config import model_from_hf_dict  # noqa: E402

EPS = torch.finfo(torch.float32).eps
FREQ_ULPS = 8
HEAD_DIM, ORIGINAL = 64, 1024  # 32 rotated pairs; the pre-training context the scalings stretch
SIZES = {"model_type": "llama", "hidden_size": 2 * HEAD_DIM, "num_attention_heads": 2, "num_key_value_heads": 2,
         "num_hidden_layers": 1, "intermediate_size": 64, "vocab_size": 32}
RISING = [1.0 + i / 8 for i in range(HEAD_DIM // 2)]  # longrope factors, one per pair
# (config keys, a name): every type, with the optional settings real configs use
CASES = {
    "default": {"max_position_embeddings": ORIGINAL, "rope_theta": 500000.0},
    "linear": {"max_position_embeddings": 4 * ORIGINAL, "rope_scaling": {"type": "linear", "factor": 4.0}},
    "dynamic": {"max_position_embeddings": ORIGINAL, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
    "llama3": {"max_position_embeddings": 4 * ORIGINAL, "rope_theta": 500000.0,
               "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": ORIGINAL}},
    "yarn": {"max_position_embeddings": 4 * ORIGINAL, "rope_theta": 1e6,
             "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL}},
    "yarn-mscale": {"max_position_embeddings": 4 * ORIGINAL,  # DeepSeek's settings
                    "rope_scaling": {"type": "yarn", "factor": 40.0, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
                                     "mscale_all_dim": 0.707, "original_max_position_embeddings": ORIGINAL}},
    "yarn-untruncated": {"max_position_embeddings": 4 * ORIGINAL, "rope_theta": 150000.0,  # GPT-OSS's settings
                         "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                          "truncate": False, "original_max_position_embeddings": ORIGINAL,
                                          "attention_factor": 1.25}},
    "longrope": {"max_position_embeddings": 4 * ORIGINAL,  # Phi-3's: no factor, original at the top level
                 "original_max_position_embeddings": ORIGINAL,
                 "rope_scaling": {"type": "longrope", "short_factor": [1.0] * (HEAD_DIM // 2), "long_factor": RISING}},
}
LENGTHS = (ORIGINAL // 2, ORIGINAL, 2 * ORIGINAL, 4 * ORIGINAL)  # sequence lengths, up to 4x the original


def transformers_rope(config: dict, seq: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """(cos, sin) of transformers for positions 0..seq-1 (each (seq, head_dim/2): HF repeats the pairs'
    angles in both halves), its inverse frequencies after that forward, and its cos/sin scale."""
    keys = {k: v for k, v in config.items() if k != "model_type"}
    rotary = LlamaRotaryEmbedding(LlamaConfig(**keys))  # a fresh one: dynamic's frequencies follow the forward
    x = torch.zeros(1, seq, HEAD_DIM)
    cos, sin = rotary(x, torch.arange(seq)[None])
    cos, sin = cos[0], sin[0]
    half = HEAD_DIM // 2
    assert torch.equal(cos[:, :half], cos[:, half:]) and torch.equal(sin[:, :half], sin[:, half:])
    return cos[:, :half], sin[:, :half], rotary.inv_freq.clone(), float(rotary.attention_scaling)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("seq", LENGTHS)
def test_tables_equal_transformers(name, seq):
    config = {**SIZES, **CASES[name]}
    spec = model_from_hf_dict(config, _path())
    cos_hf, sin_hf, freq_hf, scale_hf = transformers_rope(config, seq)
    freq = rope_inverse_frequencies(HEAD_DIM, "cpu", spec.rope_theta, spec.rope_scaling, seq_len=seq,
                                    max_positions=spec.max_seq_len)
    assert torch.all((freq - freq_hf).abs() <= FREQ_ULPS * EPS * freq_hf.abs()), name
    scale = rope_attention_factor(spec.rope_scaling, spec.max_seq_len)
    assert scale == pytest.approx(scale_hf, rel=1e-12, abs=0)  # both in float64 from the same settings
    cos, sin = rope_tables(HEAD_DIM, seq, "cpu", spec.rope_theta, spec.rope_scaling, seq_len=seq,
                           max_positions=spec.max_seq_len)
    angles = torch.arange(seq, dtype=torch.float64)[:, None] * freq_hf.double()[None, :]
    bound = scale * ((FREQ_ULPS + 1) * EPS * angles + 4 * EPS)
    assert torch.all((cos.double() - cos_hf.double()).abs() <= bound), name
    assert torch.all((sin.double() - sin_hf.double()).abs() <= bound), name


def test_the_scalings_that_follow_the_length_change_past_it():
    """dynamic and longrope: the same below the original context, other frequencies past it."""
    for name in ("dynamic", "longrope"):
        spec = model_from_hf_dict({**SIZES, **CASES[name]}, _path())

        def frequencies(seq):
            return rope_inverse_frequencies(HEAD_DIM, "cpu", spec.rope_theta, spec.rope_scaling, seq_len=seq,
                                            max_positions=spec.max_seq_len)

        assert torch.equal(frequencies(ORIGINAL // 2), frequencies(ORIGINAL))
        assert not torch.equal(frequencies(ORIGINAL), frequencies(2 * ORIGINAL))


@pytest.mark.parametrize("name", ["default", "dynamic", "longrope", "yarn"])
def test_the_model_builds_tables_for_the_length_it_trains(name):
    """Past max_position_embeddings (tables grow) and as one of cp ranks sharing a sequence (the whole
    sequence's tables, indexed by the shard's global positions)."""
    spec = model_from_hf_dict({**SIZES, **CASES[name]}, _path())
    model = build_model(spec, "cpu")
    init_weights(model, spec, 0, "cpu")
    for seq in (spec.max_seq_len // 2, 2 * spec.max_seq_len, 4 * ORIGINAL):
        cos, sin = model.rope_for(seq)
        want = rope_tables(HEAD_DIM, seq, "cpu", spec.rope_theta, spec.rope_scaling, seq_len=seq,
                           max_positions=spec.max_seq_len)
        assert cos.shape[0] >= max(seq, spec.max_seq_len)  # rows for every position, the config's at least
        assert torch.equal(cos[:seq], want[0]) and torch.equal(sin[:seq], want[1])
    model.rope_for(ORIGINAL // 2)  # a short sequence's tables (dynamic, longrope: rebuilt for it)
    model.sequence_parts = 4
    tokens = torch.zeros(1, ORIGINAL, dtype=torch.long)  # a cp rank's quarter of a 4·ORIGINAL sequence
    with torch.no_grad():
        logits = model(tokens, positions=torch.arange(3 * ORIGINAL, 4 * ORIGINAL))
    assert logits.shape == (1, ORIGINAL, SIZES["vocab_size"]) and math.isfinite(float(logits.abs().max()))
    if name in ("dynamic", "longrope"):  # the whole sequence's tables, not the shard's
        assert model.rope_seq_len == 4 * ORIGINAL


def _path():
    from pathlib import Path

    return Path("config.json")
