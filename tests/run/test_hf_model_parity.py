"""plait's runtime builds the model a Hugging Face config names: tiny versions of each family
(head_dim override, QKV biases, q/k norms per head and over the projection, post- and sandwich
norms, sliding windows on all or every other layer, soft-capping, Phi-3's fused projections), with
transformers' weights copied in, give transformers' logits (fp32, single process).

The weights are converted in memory by the import's own name tables (``plait.run.checkpoint.hf.map``,
through ``plait.run.checkpoint.hf.load.plait_state_from_hf``); rotary embeddings: HF rotates (x[j], x[j + d/2]) pairs,
plait (x[2j], x[2j+1]), so the rows of Q and K (and the q/k norm weights) are permuted per head."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from plait.run.checkpoint.hf.load import plait_state_from_hf  # noqa: E402
from plait.run.model import apply_kernels, build_model, init_weights  # noqa: E402
from plait.spec.hf_config import model_from_hf_dict  # noqa: E402

SIZES = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
         "intermediate_size": 96, "vocab_size": 128, "max_position_embeddings": 64,
         "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
FAMILIES = {
    "llama": {"rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 16}, "tie_word_embeddings": True},
    "mistral": {"sliding_window": 5},
    "qwen2": {"rope_theta": 1e6},
    "qwen3": {"head_dim": 32},  # q is 4·32 = 128 wide, hidden 64
    "olmo2": {},
    "gemma2": {"head_dim": 32, "sliding_window": 5, "query_pre_attn_scalar": 24},
    "phi3": {"sliding_window": 6},
}
SEQ = 12  # longer than every window


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_plait_model_equals_transformers(family):
    config = {"model_type": family, **SIZES, **FAMILIES[family]}
    if family == "gemma2":
        config["num_hidden_layers"] = 3  # local, global, local
    from pathlib import Path
    spec = model_from_hf_dict(config, Path(f"{family}/config.json"))
    torch.manual_seed(0)
    values = {k: v for k, v in config.items() if k != "model_type"}
    hf_config = transformers.AutoConfig.for_model(family, **values, attn_implementation="eager")
    hf = transformers.AutoModelForCausalLM.from_config(hf_config).float().eval()
    with torch.no_grad():  # norms start at 1 (0 for Gemma): perturb them so a misplaced norm shows
        for name, param in hf.named_parameters():
            if "norm" in name or name.endswith("bias"):
                param.add_(0.1 * torch.randn_like(param))
    model = build_model(spec, "cpu")
    init_weights(model, spec, 0, "cpu")
    apply_kernels(model, "eager" if spec.attn_softcap else "sdpa", "fused")
    missing, unexpected = model.load_state_dict(plait_state_from_hf(hf.state_dict(), spec), strict=False)
    assert not unexpected and set(missing) <= ({"output.weight"} if spec.tied_embeddings else set())
    model.eval()
    tokens = torch.randint(0, 128, (2, SEQ), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(tokens).logits
        got = model(tokens)
    # fp32: a few hundred float ops per logit, each rounding by 2^-24 relative; logits are O(1)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_window_mask_matches_a_model_without_window_on_short_sequences():
    """A window at least the sequence long changes nothing: the mask equals the causal one."""
    from plait.run.modules.layers import attention_mask

    assert torch.equal(attention_mask(6, 6, "cpu"), attention_mask(6, 0, "cpu"))
    assert attention_mask(6, 2, "cpu").sum(dim=1).tolist() == [1, 2, 2, 2, 2, 2]
