"""RoPE scaling and sequence length, planner side (no torch): config.json's rope_scaling dicts read
and checked (one line for a malformed one), and a RoPE model past its max_position_embeddings
planned with a warning naming its scaling, while learned positions (GPT-2) keep their hard limit."""

from __future__ import annotations

import dataclasses
import importlib.util
import json

import pytest

from plait.errors import PlaitError
from plait.spec.capabilities import RUNTIME_ROPE_SCALINGS, model_blockers, runtime_violations
from plait.spec.hardware import get_cluster
from plait.spec.hf.families import ROPE_TYPES
from plait.spec.hf.writer import config_for, differences
from plait.spec.hf_config import model_from_hf_config
from plait.spec.layout import JobSpec, Layout
from plait.spec.model import ModelSpec
from plait.spec.models import get_model
from plait.spec.validate import errors_of, past_positions_warning, validate

HAVE_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
BASE = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
        "intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 4096}  # head_dim 16: 8 pairs


def read(tmp_path, config, reader="plain"):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return model_from_hf_config(path, reader)


@pytest.mark.parametrize("config, expected", [
    ({"rope_scaling": {"type": "linear", "factor": 4.0}}, {"rope_type": "linear", "factor": 4.0}),
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, {"rope_type": "dynamic", "factor": 2.0}),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},  # the original context defaults to max_position_embeddings
     {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}),
    ({"rope_scaling": {"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
                       "mscale_all_dim": 0.707, "original_max_position_embeddings": 1024, "attention_factor": None}},
     {"rope_type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.707,
      "original_max_position_embeddings": 1024}),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 32.0, "truncate": False, "attention_factor": 1.25,
                          "original_max_position_embeddings": 1024, "rope_theta": 150000.0}},
     {"rope_type": "yarn", "factor": 32.0, "truncate": False, "attention_factor": 1.25,
      "original_max_position_embeddings": 1024}),
    ({"original_max_position_embeddings": 512,  # Phi-3 writes it at the top level; it wins, as in transformers
      "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 8, "long_factor": [1.5] * 8,
                       "original_max_position_embeddings": 1024}},
     {"rope_type": "longrope", "short_factor": (1.0,) * 8, "long_factor": (1.5,) * 8,
      "original_max_position_embeddings": 512}),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 1024}},
     {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 1024}),
    ({"rope_scaling": {"type": "default"}}, {}),
])
def test_rope_scaling_dicts_are_read(tmp_path, config, expected):
    spec = read(tmp_path, {**BASE, **config})
    assert dict(spec.rope_scaling) == expected
    assert ModelSpec.from_dict(spec.to_dict()) == spec  # the plan file records it
    for family in ("llama", "phi3"):  # plait export's config.json reads back the same (Phi-3: its top-level key)
        assert differences(spec, config_for(spec, family), family) == []
    if HAVE_TRANSFORMERS:
        assert read(tmp_path, {**BASE, **config}, "transformers") == spec


@pytest.mark.parametrize("scaling, fragment", [
    ({"type": "ntk-by-parts", "factor": 2.0}, "rope_scaling type 'ntk-by-parts' is not one of default, linear"),
    ({"type": "linear", "factor": 2.0, "warp": 1}, "rope_scaling key 'warp' is not understood by plait"),
    ({"type": "linear"}, "rope_scaling type 'linear' needs factor"),
    ({"rope_type": "llama3", "factor": 8.0}, "needs low_freq_factor, high_freq_factor"),
    ({"type": "yarn", "factor": "4"}, "rope_scaling factor='4' must be a number > 0"),
    ({"type": "dynamic", "factor": 0}, "rope_scaling factor=0 must be a number > 0"),
    ({"type": "yarn", "factor": 4.0, "beta_fast": -1}, "rope_scaling beta_fast=-1 must be a number >= 0"),
    ({"type": "yarn", "factor": 4.0, "truncate": "no"}, "rope_scaling truncate='no' must be true or false"),
    ({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 10.5},
     "original_max_position_embeddings=10.5 must be a positive integer"),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0,
      "original_max_position_embeddings": 1024}, "high_freq_factor=1.0 must be greater than low_freq_factor=4.0"),
    ({"type": "longrope", "short_factor": [1.0] * 8}, "needs long_factor"),
    ({"type": "longrope", "short_factor": [1.0] * 7, "long_factor": [1.0] * 8},
     "short_factor must hold 8 positive numbers (one per rotated pair of a 16-wide head)"),
    ({"type": "longrope", "short_factor": [1.0] * 8, "long_factor": [0.0] * 8}, "long_factor must hold 8 positive"),
])
def test_malformed_rope_scaling_is_one_line(tmp_path, scaling, fragment):
    with pytest.raises(PlaitError) as caught:
        read(tmp_path, {**BASE, "rope_scaling": scaling})
    message = str(caught.value)
    assert fragment in message and "config.json" in message and "\n" not in message


def test_model_json_is_checked_and_gpt_has_no_rope():
    tiny = get_model("tiny")
    with pytest.raises(PlaitError, match="rope_scaling type 'yarn' needs factor, original_max_position_embeddings"):
        dataclasses.replace(tiny, rope_scaling={"rope_type": "yarn"})
    with pytest.raises(PlaitError, match=r"rope_scaling apply to arch=llama \(RMSNorm, RoPE\) only"):
        dataclasses.replace(get_model("tiny-gpt"), rope_scaling={"rope_type": "linear", "factor": 2.0})
    assert set(RUNTIME_ROPE_SCALINGS) == set(ROPE_TYPES) - {"default"}  # the runtime applies every type


LLAMA = get_model("llama3-8b")
YARN = dataclasses.replace(LLAMA, rope_theta=500000.0,
                           rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192})


def test_rope_models_run_past_max_position_embeddings_with_one_warning():
    job = JobSpec(global_batch=64, seq_len=131072)
    cluster = get_cluster("dgx-h100").with_gpus(64)
    layout = Layout(dp=8, cp=8, zero=3, ckpt="full")
    for model in (LLAMA, YARN, get_model("tiny")):
        assert model_blockers(model, job) == [] and runtime_violations(model, layout, job) == []
        assert errors_of(validate(model, cluster, job, layout)) == []
    warning = past_positions_warning(LLAMA, 131072)
    assert warning.startswith("seq_len=131072 passes llama3-8b's max_position_embeddings=8192: RoPE runs at any")
    assert "no rope_scaling (plain RoPE, rope_theta=10000)" in warning and "\n" not in warning
    assert ("rope_scaling yarn (factor=4.0, original_max_position_embeddings=8192; rope_theta=500000)"
            in past_positions_warning(YARN, 131072))
    assert past_positions_warning(LLAMA, 8192) is None  # within the config's context: nothing to say


def test_learned_positions_keep_their_hard_limit_with_the_reason():
    gpt = get_model("tiny-gpt")
    job = JobSpec(global_batch=8, seq_len=2 * gpt.max_seq_len)
    reason = "learned absolute position embeddings have one row per position and none past 256"
    assert past_positions_warning(gpt, job.seq_len) is None  # refused, not warned
    [blocker] = model_blockers(gpt, job)
    assert blocker.rule == "runtime-seq-len" and reason in blocker.message
    broken = errors_of(validate(gpt, get_cluster("dgx-h100").with_gpus(1), job, Layout()))
    assert [v.rule for v in broken] == ["seq-positions"] and reason in broken[0].message
