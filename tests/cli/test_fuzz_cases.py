"""The inputs issue 31 (item 6) found ending in a traceback, a hang or silent nonsense: each is now one line
naming the input and the rule, before anything is built or launched. No torch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from plait.cli import main
from plait.errors import PlaitError
from plait.run.checkpoint.hf.files import parse_size
from plait.spec.hf_config import model_from_hf_dict

LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 128,
         "rms_norm_eps": 1e-5}
MIXTRAL = {"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2,
           "vocab_size": 256, "max_position_embeddings": 128}
TRAIN = ["train", "--model", "tiny", "--global-batch", "8", "--seq-len", "32", "--device", "cpu", "--dry-run"]


def one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(("base", "change", "message"), [
    (LLAMA, {"num_hidden_layers": 10**8}, "num_hidden_layers=100000000 must be between 1 and 10,000"),
    (LLAMA, {"num_hidden_layers": 1e20}, "num_hidden_layers=1e+20 must be between 1 and 10,000"),
    (LLAMA, {"num_attention_heads": 0}, "num_attention_heads=0 must be between 1 and 65,536"),
    (LLAMA, {"vocab_size": "256"}, "vocab_size='256' must be an integer"),
    (LLAMA, {"rope_parameters": "yarn"}, "rope_parameters='yarn' must be a JSON object"),
    (LLAMA, {"layer_types": "full_attention"}, "layer_types='full_attention' must be a JSON array"),
    (LLAMA, {"hidden_act": {"silu": 1}}, "hidden_act=\"{'silu': 1}\" must be a JSON string"),
    (MIXTRAL, {"num_hidden_layers": 10**8}, "num_hidden_layers=100000000 must be between"),
    (MIXTRAL, {"num_attention_heads": 0}, "num_attention_heads=0 must be between"),
])
def test_hf_configs_are_checked_before_anything_is_built(base, change, message):
    with pytest.raises(PlaitError, match="^x/config.json: " + message.replace("(", r"\(").replace("+", r"\+")
                       .replace("{", r"\{").replace("}", r"\}")):
        model_from_hf_dict({**base, **change}, Path("x/config.json"))


def test_a_mixtral_head_dim_counts_as_transformers_builds_it():
    # MixtralForCausalLM(MixtralConfig(**MIXTRAL, head_dim=32)) has 279,360 parameters (transformers 4.x);
    # the key was ignored (as if head_dim = 64 / 4 = 16)
    assert model_from_hf_dict({**MIXTRAL, "head_dim": 32}, Path("x/config.json")).total_params() == 279_360
    assert model_from_hf_dict(MIXTRAL, Path("x/config.json")).total_params() != 279_360


def test_a_bad_config_is_one_line_through_the_cli(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, "num_attention_heads": 0}))
    assert main(["train", "--model", str(tmp_path / "config.json"), *TRAIN[3:]]) == 2
    assert "num_attention_heads=0 must be between 1 and 65,536" in one_line(capsys)


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--lr", "-1", "lr=-1.0 must be a finite number >= 0"),
    ("--lr", "nan", "lr=nan must be a finite number >= 0"),
    ("--lr", "inf", "lr=inf must be a finite number >= 0"),
    ("--grad-clip", "-1", "grad_clip=-1.0 must be a finite number >= 0"),
    ("--warmup-steps", "-5", "warmup_steps=-5 must be a non-negative integer"),
    ("--weight-decay", "-100", "weight_decay=-100.0 must be a finite number >= 0"),
])
def test_optimizer_settings_are_refused_at_dry_run_and_in_job_files(tmp_path, capsys, flag, value, message):
    assert main([*TRAIN, flag, value]) == 2
    assert message in one_line(capsys)
    key = flag[2:].replace("-", "_")
    (tmp_path / "run.toml").write_text(f"{key} = {value}\n")  # TOML spells nan and inf as the flags do
    assert main([*TRAIN, "--config", str(tmp_path / "run.toml")]) == 2
    assert message in one_line(capsys)


@pytest.mark.parametrize(("text", "message"), [
    ("lr = " + "9" * 5000, "is not valid TOML: Exceeds the limit (4300 digits)"),
    ("lr = " + "9" * 4000, "lr = 99999"),
    ("extra = " + "[" * 5000 + "]" * 5000, "is not valid TOML: nested too deeply"),
])
def test_job_files_with_huge_numbers_or_deep_nesting_are_one_line(tmp_path, capsys, text, message):
    (tmp_path / "run.toml").write_text(text + "\n")
    assert main([*TRAIN, "--config", str(tmp_path / "run.toml")]) == 2
    assert message in one_line(capsys)


def test_a_shard_size_that_overflows_is_refused():
    with pytest.raises(PlaitError, match="expected a size from 1 byte to 1 PB"):
        parse_size("9" * 400 + "GB")
    with pytest.raises(PlaitError, match="expected a size from 1 byte to 1 PB"):
        parse_size("0")


@pytest.mark.parametrize("flag", ["--plan", "--init-from", "--checkpoint-dir", "--resume", "--data", "--eval-data"])
def test_a_path_too_long_for_the_filesystem_is_one_line(capsys, flag):
    # bench/fuzz_cli.py: a TOML job file's data = 999...9 (4,000 digits) ended in OSError ENAMETOOLONG
    assert main([*TRAIN, flag, "9" * 4000]) == 2
    err = one_line(capsys)
    assert "(4,000 characters)" in err or "token file 9999" in err, err


def test_a_mixture_of_experts_config_with_an_unknown_key_is_refused():
    # the dense families refused unknown keys; the MoE families read what they knew and ignored the rest
    with pytest.raises(PlaitError, match="config key 'moe_magic' of model_type 'mixtral' is not understood"):
        model_from_hf_dict({**MIXTRAL, "moe_magic": 4}, Path("x/config.json"))
    harmless = {"output_router_logits": False, "router_jitter_noise": 0.0, "architectures": ["MixtralForCausalLM"]}
    assert model_from_hf_dict({**MIXTRAL, **harmless}, Path("x/config.json")).moe.n_experts == 4


def test_a_layout_order_that_is_not_text_is_one_line():
    # bench/fuzz_cli.py report, seed 2: a saved plan whose layout "order" is {"a": 1}
    from plait.spec.layout import Layout

    with pytest.raises(PlaitError, match="order"):
        Layout.from_dict({"dp": 1, "order": {"a": 1}})


@pytest.mark.parametrize("name", [{"a": 1}, [1, 2], 7])
def test_a_model_file_whose_name_is_not_text_is_one_line(tmp_path, capsys, name):
    # bench/fuzz_cli.py (plan, 10,000 cases, seed 0): the name reached the planner's cache as a key,
    # "TypeError: unhashable type: 'dict'"
    model = {"name": name, "arch": "llama", "n_layers": 4, "hidden": 64, "ffn_hidden": 176, "n_heads": 4,
             "n_kv_heads": 2, "vocab": 512, "max_seq_len": 256, "tied_embeddings": False, "dropout": False}
    (tmp_path / "model.json").write_text(json.dumps(model))
    assert main(["plan", "--model", str(tmp_path / "model.json"), "--cluster", "dgx-h100", "--gpus", "2",
                 "--global-batch", "8", "--seq-len", "64", "--layout", "dp=2"]) == 2
    assert f"name={name!r} must be a string" in one_line(capsys)


@pytest.mark.parametrize(("key", "value", "message"), [
    ("sp", [1, 2], "sp=[1, 2] must be true or false (1 or 0)"),
    ("reshard", {"a": 1}, "reshard={'a': 1} must be true or false (1 or 0)"),
    ("opt_offload", "yes", "opt_offload='yes' must be true or false (1 or 0)"),
    ("offload", "0.5", "offload='0.5' must be a fraction between 0 and 1"),
])
def test_a_plan_files_layout_switch_that_is_not_a_switch_is_one_line(tmp_path, capsys, key, value, message):
    # bench/fuzz_cli.py (report, seed 2): a saved plan's "sp": [..] reached the planner's cache key,
    # "TypeError: unhashable type: 'list'"; a text value was taken as true
    plan = tmp_path / "plan.json"
    assert main(["plan", "--model", "tiny", "--cluster", "dgx-h100", "--gpus", "2", "--global-batch", "8",
                 "--seq-len", "64", "--layout", "dp=2", "--save", str(plan)]) == 0
    capsys.readouterr()
    data = json.loads(plan.read_text())
    data["layout"][key] = value
    plan.write_text(json.dumps(data))
    assert main(["report", "--plan", str(plan), "--out", str(tmp_path / "r")]) == 2
    assert message in one_line(capsys)


def test_a_published_run_with_300_million_layers_is_refused_not_built(tmp_path, capsys):
    # bench/fuzz_cli.py (validate, seed 4): n_layers = 309,778,089 (under the 2^31 size cap) made the
    # planner build per-layer lists of that length: minutes of CPU and 2.5 GB before the fuzzer's limit
    header = "id,source,arch,n_layers,hidden,ffn_hidden,n_heads,n_kv_heads,vocab,seq_len,gpu_type,n_gpus,tp,pp,dp," \
             "mbs,gbs,zero_stage,recompute,reported_mfu,reported_tokens_per_s_per_gpu"
    row = "r1,Narayanan et al. 2021,gpt,309778089,2304,9216,24,24,51200,2048,a100,32,1,1,32,4,512,1,full,,3000"
    (tmp_path / "runs.csv").write_text(f"{header}\n{row}\n")
    out = tmp_path / "predictions.csv"
    assert main(["validate", "--runs", str(tmp_path / "runs.csv"), "--json", "--out", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["unsupported"] == 1
    assert "n_layers=309778089 is more than 10,000" in out.read_text()
