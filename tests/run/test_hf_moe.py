"""Mixture-of-experts Hugging Face weights in and out, end to end, and the families refused.

* ``plait train --init-from`` a tiny Qwen3-MoE saved by transformers' ``save_pretrained`` (one
  tensor per expert, per-head q/k norms), under dp=2 × ep=2 (two processes, gloo on CPU): the
  first step's loss equals transformers' on the same batch within ``tolerances.run_rtol``, and the
  checkpoint, exported by ``plait export``, loads in transformers with the logits of plait's model
  loaded from that checkpoint (the same relative bound of the logits' scale).
* A family without a weight-name table (DeepSeek-V2, whose router is not the runtime's) is refused
  in one line before any worker starts, and export says what it cannot write, without claiming
  that plait train does not run the families it does run.

(tests/run/test_hf_families.py checks import and export of every MoE family in one process.)
"""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

import hf_models
import tolerances
import torch
from torchless import run_without_torch

from plait.cli import main
from plait.errors import PlaitError
from plait.run.checkpoint import store
from plait.spec.hf.writer import hf_config_of
from plait.spec.hf_config import model_from_hf_config
from plait.spec.models import get_model

RTOL = tolerances.run_rtol(hf_models.VOCAB, hf_models.LAYERS)
GLOBAL_BATCH, SEQ, SEED, STEPS = 4, 16, 3, 2


def test_qwen3_moe_in_and_out_under_expert_parallelism(tmp_path):
    hf_model = hf_models.family_model("qwen3_moe", tmp_path / "source", seed=13)
    source = hf_models.save(hf_model, tmp_path / "source")
    records, checkpoints, out = hf_models.train_from_and_export(source, "dp=2,ep=2", tmp_path, GLOBAL_BATCH, SEQ,
                                                                 STEPS, SEED)
    spec = model_from_hf_config(source)
    rows = hf_models.synthetic_batch(spec.vocab, SEED, GLOBAL_BATCH, SEQ)
    with torch.no_grad():
        first = hf_model(input_ids=rows, labels=rows).loss.item()
    assert records[0]["loss"] == pytest.approx(first, rel=RTOL)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "qwen3_moe" and config["architectures"] == ["Qwen3MoeForCausalLM"]
    reloaded = hf_models.load(out)
    trained = hf_models.plait_model(model_from_hf_config(out), checkpoints / store.final_name(STEPS))
    hf_models.assert_export_holds_trained(trained, reloaded, hf_model, rows[:, :-1], RTOL)


def _unsupported_dir(tmp_path, model_type: str):
    """A directory with a config.json of ``model_type`` and one (irrelevant) safetensors tensor."""
    from safetensors.torch import save_file

    directory = tmp_path / model_type
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"model_type": model_type}))
    save_file({"model.embed_tokens.weight": torch.zeros(2, 2)}, str(directory / "model.safetensors"))
    return directory


@pytest.mark.parametrize("model_type, why", [("deepseek_v2", "DeepSeek-V2's")])
def test_init_from_an_unsupported_family_is_refused_before_launch(tmp_path, capsys, model_type, why):
    directory = _unsupported_dir(tmp_path, model_type)
    # --dry-run prints the launch command once every check before the launch has passed
    code = main(["train", "--init-from", str(directory), "--model", "tiny-moe", "--global-batch", "4",
                 "--seq-len", "16", "--device", "cpu", "--dry-run"])
    captured = capsys.readouterr()
    assert code == 2 and "torchrun" not in captured.out and captured.err.count("\n") == 1
    assert "--init-from" in captured.err and "no weight-name table" in captured.err and why in captured.err


DEEPSEEK_V2 = dataclasses.replace(get_model("deepseek-v3"), name="a-deepseek-v2", family="deepseek_v2")


@pytest.mark.parametrize("spec", [DEEPSEEK_V2], ids=lambda spec: spec.name)
def test_export_refusal_names_what_it_cannot_write(spec):
    with pytest.raises(PlaitError) as info:
        hf_config_of(spec)
    message = str(info.value)
    assert "does not run" not in message and "mixtral" in message


def test_export_writes_the_moe_families_plait_trains(tmp_path):
    for family in hf_models.MOE_FAMILIES:
        spec = model_from_hf_config(hf_models.family_config(family, tmp_path / family))
        assert hf_config_of(spec)["model_type"] == family


def test_the_launcher_asks_for_the_weight_table_without_importing_torch():
    done = run_without_torch("from plait.run.checkpoint.hf.map import family_of_model_type\n"
                             "assert family_of_model_type('qwen3_moe').name == 'qwen_moe'\n")
    assert done.returncode == 0, done.stderr[-2000:]
