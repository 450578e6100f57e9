"""Software stacks as data (plait.spec.stack): every built-in file loads with a source for each number,
and a wrong stack file is one error naming the file and the key."""

from __future__ import annotations

import dataclasses

import pytest

from plait.errors import PlaitError
from plait.plan.params import DEFAULT_PARAMS, params_for_stack
from plait.spec.hardware import GPUS
from plait.spec.stack import STACK_PARAMS, generation_of, get_stack, left_out_defaults, read_stack, stack_names

REQUIRED = {"plait", "megatron-core", "torchtitan", "deepspeed"}


def test_the_required_stacks_are_built_in_and_each_number_has_a_source():
    names = stack_names()
    assert REQUIRED <= set(names)
    for name in names:
        stack = get_stack(name)
        assert stack.name == name and stack.summary
        sources = stack.sources()
        assert len(sources) == (len(stack.params) + len(stack.defaults) + len(stack.attention_efficiency)
                                + len(stack.run))
        assert all(len(text) > 20 for text in sources.values()), (name, sources)
        assert set(stack.params) <= set(STACK_PARAMS)


def test_the_default_stack_changes_no_cost_parameter():
    assert params_for_stack(get_stack("plait")) == DEFAULT_PARAMS
    assert get_stack(None).name == "plait"


def test_a_stack_replaces_its_numbers_and_a_calibration_keeps_what_it_measured():
    stack = get_stack("megatron-core")
    params = params_for_stack(stack)
    for name, value in stack.param_values().items():
        assert getattr(params, name) == value
    measured = dataclasses.replace(DEFAULT_PARAMS, tp_comm_overlap=0.3)
    kept = params_for_stack(stack, measured, keep=("tp_comm_overlap",))
    assert kept.tp_comm_overlap == 0.3 and kept.pp_comm_overlap == stack.param_values()["pp_comm_overlap"]


def test_attention_efficiency_applies_to_its_generation_only():
    stack = get_stack("megatron-core")
    h100, a100 = GPUS["h100-sxm"], GPUS["a100-80g"]
    assert generation_of("h100-sxm") == "h100" and generation_of("cpu") is None
    assert stack.gpu(h100).attention_efficiency == stack.attention_efficiency["h100"].value
    assert stack.gpu(h100).attention_efficiency != h100.attention_efficiency
    assert stack.gpu(a100) == a100  # no A100 number in the file: the preset's stays


@pytest.mark.parametrize("text, words", [
    ('name = "x"\nsummary = "y"\ncolour = 1\n', "unknown key(s) colour"),
    ('name = "x"\nsummary = "y"\n[params]\nelementwise_passes = { value = 20 }\n', "params.elementwise_passes must be"),
    ('name = "x"\nsummary = "y"\n[params]\nelementwise_passes = { value = 20, source = " " }\n', "needs a source"),
    ('name = "x"\nsummary = "y"\n[params]\ngemm_efficiency = { value = 1, source = "z" }\n', "not one a stack may set"),
    ('name = "x"\nsummary = "y"\n[params]\ndp_overlap = { value = -1, source = "z" }\n', "must be a number >= 0"),
    ('name = "x"\nsummary = "y"\n[defaults]\nzero = { value = 5, source = "z" }\n', "defaults.zero=5"),
    ('name = "x"\nsummary = "y"\n[defaults]\nzero = { value = 1.0, source = "z" }\n', "defaults.zero=1.0"),
    ('name = "x"\nsummary = "y"\n[defaults]\ncp_impl = { value = "p2p", source = "z" }\n', "not one of its cp_impls"),
    ('name = "x"\nsummary = "y"\n[attention_efficiency]\nh100 = { value = 1.5, source = "z" }\n', "(0, 1]"),
    ('name = "x"\nsummary = "y"\nruntime = "jax"\n', "runtime='jax'"),
    ('name = "x"\nsummary = "y"\ncp_impls = ["warp"]\n', "cp_impls="),
    ('name = "x"\nsummary = \n', "not valid TOML"),
    ('name = "x"\nsummary = "y"\n[run]\nseq_len = { value = 0, source = "z" }\n', "run.seq_len=0 must be a positive"),
    ('name = "x"\nsummary = "y"\n[run]\nseq_len = { value = 8192.5, source = "z" }\n', "run.seq_len=8192.5"),
    ('name = "x"\nsummary = "y"\n[run]\nselective = { value = "half", source = "z" }\n', "run.selective='half'"),
    ('name = "x"\nsummary = "y"\n[run]\ndropout = { value = 1, source = "z" }\n', "run.dropout=1 must be one of True"),
    ('name = "x"\nsummary = "y"\n[run]\nbatch = { value = 8, source = "z" }\n', "run.batch is not one a stack may set"),
])
def test_a_wrong_stack_file_is_one_error_naming_file_and_key(tmp_path, text, words):
    path = tmp_path / "mine.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(PlaitError) as caught:
        read_stack(path)
    assert str(path) in str(caught.value) and words in str(caught.value)


def test_a_stack_by_path_and_an_unknown_name(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('name = "mine"\nsummary = "my fork"\n[params]\npp_comm_overlap = { value = 0.5, source = '
                    '"measured on our cluster"}\n', encoding="utf-8")
    assert get_stack(str(path)).param_values() == {"pp_comm_overlap": 0.5}
    with pytest.raises(PlaitError, match="unknown stack 'nemo-9'.*megatron-core"):
        get_stack("nemo-9")


def test_a_stack_number_out_of_range_is_refused_when_applied(tmp_path):
    path = tmp_path / "slow.toml"
    path.write_text('name = "slow"\nsummary = "s"\n[params]\nmicrobatch_overhead_s = { value = 1e9, source = "x" }\n',
                    encoding="utf-8")
    with pytest.raises(PlaitError, match="microbatch_overhead_s=1000000000.0"):
        params_for_stack(get_stack(str(path)))


def test_only_the_built_in_file_is_plaits_own_stack(tmp_path):
    assert get_stack("plait").is_plait and not get_stack("megatron-core").is_plait
    path = tmp_path / "plait.toml"
    path.write_text('name = "plait"\nsummary = "my copy"\n', encoding="utf-8")
    assert not get_stack(str(path)).is_plait  # a user's file named plait does not run in plait train


def test_a_stacks_defaults_fill_only_the_knobs_left_out_and_not_moot():
    core = get_stack("megatron-core")  # zero=1, ckpt=none, sp=true, cp_impl=p2p
    assert left_out_defaults(core, given=()) == {"zero": 1, "ckpt": "none", "ckpt_layers": 0, "sp": True,
                                                 "cp_impl": "p2p"}
    assert left_out_defaults(core, given=("zero", "ckpt"), moot=("sp", "cp_impl")) == {}
    assert left_out_defaults(core, given={"zero": 3}, moot=("cp_impl",)) == {"ckpt": "none", "ckpt_layers": 0,
                                                                              "sp": True}
    assert left_out_defaults(get_stack("plait"), given=("cp_impl",)) == {}


def test_a_stacks_run_settings_are_read_with_their_source():
    """torchtitan's own run configs: seq_len 8192, one micro-batch per pipeline stage, per-op selective
    checkpointing; a stack without a ``[run]`` table has none."""
    titan = get_stack("torchtitan")
    assert titan.run_value("seq_len")[0] == 8192 and "seq_len = 8192" in titan.run_value("seq_len")[1]
    assert titan.run_value("pp_microbatches")[0] == "pp" and titan.run_value("selective")[0] == "op"
    assert get_stack("megatron-core").run_value("seq_len") == (None, "")


def test_megatron_gpt_stacks_keep_dropout_for_the_published_rows():
    """Megatron-LM 2021-22 and the DeepSpeed ZeRO-3 baseline trained Megatron's GPT with dropout 0.1;
    the stacks of today's software say nothing (a row's model keeps its own)."""
    for name in ("megatron-lm", "deepspeed"):
        value, source = get_stack(name).run_value("dropout")
        assert value is True and "0.1" in source
    for name in ("megatron-core", "torchtitan", "plait"):
        assert get_stack(name).run_value("dropout") == (None, "")
