"""``plait plan`` prints what it read (exact parameters, FLOPs per token) and, with ``--tokens``,
the time to train that many tokens on the top layout."""

from __future__ import annotations

import json

import pytest
from hf_configs import CONFIGS, PARAMS

from plait.cli import main
from plait.spec.units import parse_token_count

ARGS = ["--gpus", "8", "--global-batch", "64", "--seq-len", "4096", "--top", "1"]


def test_header_names_the_exact_parameter_count(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(CONFIGS["Qwen3-0.6B"]))
    assert main(["plan", "--model", str(tmp_path), *ARGS, "--tokens", "1e9"]) == 0
    out = capsys.readouterr().out
    assert f"{PARAMS['Qwen3-0.6B']:,} parameters" in out and "qwen3" in out
    assert "GFLOP per trained token" in out
    line = next(x for x in out.splitlines() if x.startswith("1B tokens on"))
    assert "steps" in line and "GPU-hours" in line


def test_training_time_is_tokens_over_throughput(capsys):
    from plait.cli.support.tables import training_time_line
    from plait.plan.plan import evaluate
    from plait.spec.hardware import get_cluster
    from plait.spec.layout import JobSpec, Layout
    from plait.spec.models import get_model

    plan = evaluate(get_model("llama3-8b"), get_cluster("dgx-h100"), JobSpec(global_batch=64, seq_len=4096),
                    Layout(dp=8, zero=1, ckpt="full"))
    tokens = 2e12
    seconds = tokens / (plan.step.tokens_per_s_per_gpu * 8)
    line = training_time_line(plan, tokens)
    assert f"{seconds / 86400:,.1f} days" in line
    assert f"{tokens / (64 * 4096):,.0f} steps" in line


@pytest.mark.parametrize("text, value", [("2T", 2e12), ("300B", 3e11), ("1e12", 1e12), ("1_000", 1000.0),
                                         ("1.5m", 1.5e6)])
def test_token_counts_parse(text, value):
    assert parse_token_count(text) == value


@pytest.mark.parametrize("text", ["", "T", "-5B", "lots", "0", "inf"])
def test_bad_token_counts_are_refused(text, capsys):
    with pytest.raises(ValueError):
        parse_token_count(text)
    assert main(["plan", "--model", "tiny", *ARGS, f"--tokens={text}"]) == 2  # a one-line PlaitError
    err = capsys.readouterr().err
    assert "--tokens" in err and len(err.strip().splitlines()) == 1


def test_models_show_lists_what_was_read(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(CONFIGS["Gemma-2-2B"]))
    assert main(["models", "--show", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"{PARAMS['Gemma-2-2B']:,}" in out and "sandwich" in out and "attn_softcap" in out


def test_a_soft_capped_model_is_planned_with_flex_attention(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(CONFIGS["Gemma-2-2B"]))
    assert main(["plan", "--model", str(tmp_path), "--gpus", "8", "--global-batch", "16", "--seq-len", "1024",
                 "--top", "3", "--json"]) == 0  # the search's kernel: the fastest that runs soft-caps
    plans = json.loads(capsys.readouterr().out)
    assert plans and all(p["layout"]["attn"] == "flex" for p in plans)
    assert main(["plan", "--model", str(tmp_path), "--gpus", "8", "--global-batch", "16", "--seq-len", "1024",
                 "--top", "3", "--json", "--fix", "attn=eager"]) == 0  # --fix only narrows
    plans = json.loads(capsys.readouterr().out)
    assert plans and all(p["layout"]["attn"] == "eager" for p in plans)
