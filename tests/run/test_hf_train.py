"""Hugging Face weights in and out, end to end: ``plait train --init-from`` then ``plait export``.

Two real launches (torchrun, gloo on CPU): a tiny Llama trained under tp=2 (2 processes) and a
tiny GPT-2 in one process, each from a random transformers model saved with save_pretrained.

* The first step's loss (JSONL) equals transformers' loss of the same model on the same batch
  (step 0 of ``--data synthetic``) within ``tolerances.run_rtol``: the two sum in other orders.
* The checkpoint the run saved, exported, loads in transformers (``from_pretrained``) and gives
  the logits of plait's model loaded from that checkpoint, within the same relative bound of
  the logits' scale; the exported weights are the trained ones (they differ from the start).
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

import hf_models
import tolerances
import torch

from plait.cli import main
from plait.run.checkpoint import store
from plait.run.checkpoint.hf import files as hf_files
from plait.run.observe.jsonl import HEADER
from plait.spec.hf_config import model_from_hf_config

RTOL = tolerances.run_rtol(hf_models.VOCAB, hf_models.LAYERS)
GLOBAL_BATCH, SEQ, SEED, STEPS = 4, 16, 3, 2


def plait(capsys, *args: str) -> None:
    """``plait`` in this process (its workers are processes): the tests are about the weights, not the
    command's own process, which cost a torch import of its own."""
    code = main(list(args))
    assert code == 0, "".join(capsys.readouterr())[-3000:]


def train_then_export(tmp_path, capsys, source, layout: str, nproc: int, max_shard_size: str):
    """(step records, the exported directory, the checkpoint) of a run started from ``source``."""
    log, checkpoints, out = tmp_path / "run.jsonl", tmp_path / "ckpt", tmp_path / "exported"
    plait(capsys, "train", "--init-from", str(source), "--layout", layout, "--nproc-per-node", str(nproc),
          "--global-batch", str(GLOBAL_BATCH), "--seq-len", str(SEQ), "--steps", str(STEPS), "--seed", str(SEED),
          "--lr", "1e-2", "--device", "cpu", "--checkpoint-dir", str(checkpoints), "--log", str(log))
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert lines[0] == HEADER and lines[1]["event"] == "init_from" and lines[1]["directory"] == str(source.resolve())
    records = [line for line in lines if "loss" in line and "summary" not in line]
    assert len(records) == STEPS
    capsys.readouterr()
    assert main(["export", "--checkpoint", str(checkpoints), "--to", str(out), "--max-shard-size", max_shard_size]) == 0
    assert f"(step {STEPS}) -> {out}" in capsys.readouterr().out
    return records, out, checkpoints / store.final_name(STEPS)


def check_round_trip(hf_model, source, records, exported, checkpoint):
    spec = model_from_hf_config(source)
    rows = hf_models.synthetic_batch(spec.vocab, SEED, GLOBAL_BATCH, SEQ)
    with torch.no_grad():
        first = hf_model(input_ids=rows, labels=rows).loss.item()
    assert records[0]["loss"] == pytest.approx(first, rel=RTOL)

    reloaded = hf_models.load(exported)
    trained = hf_models.plait_model(model_from_hf_config(exported), checkpoint)
    hf_models.assert_export_holds_trained(trained, reloaded, hf_model, rows[:, :-1], RTOL)


def test_llama_in_and_out_under_tensor_parallelism(tmp_path, capsys):
    hf_model = hf_models.llama(seed=11)
    source = hf_models.save(hf_model, tmp_path / "llama", max_shard_size="40KB")
    records, exported, checkpoint = train_then_export(tmp_path, capsys, source, "tp=2", 2, "60KB")
    assert (exported / hf_files.INDEX).is_file() and len(hf_files.weight_files(exported)) > 1
    config = json.loads((exported / "config.json").read_text())
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    check_round_trip(hf_model, source, records, exported, checkpoint)


def test_gpt2_in_and_out_in_one_process(tmp_path, capsys):
    hf_model = hf_models.gpt2(seed=12)
    source = hf_models.save(hf_model, tmp_path / "gpt2")
    records, exported, checkpoint = train_then_export(tmp_path, capsys, source, "dp=1", 1, "5GB")
    assert [p.name for p in hf_files.weight_files(exported)] == [hf_files.SINGLE]
    assert json.loads((exported / "config.json").read_text())["model_type"] == "gpt2"
    check_round_trip(hf_model, source, records, exported, checkpoint)


# ------------------------------------------------------------------ bad input, before anything launches
def test_init_from_a_missing_directory_is_one_line(tmp_path, capsys):
    code = main(["train", "--init-from", str(tmp_path / "absent"), "--global-batch", "4", "--seq-len", "16",
                 "--device", "cpu", "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--init-from" in err and "no such directory" in err


def test_init_from_names_the_model_when_model_is_not_given(tmp_path, capsys):
    source = hf_models.save(hf_models.llama(), tmp_path / "llama")
    code = main(["train", "--init-from", str(source), "--global-batch", "4", "--seq-len", "16", "--device", "cpu",
                 "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0 and "torchrun" in out


def test_export_never_overwrites_and_names_what_is_wrong(tmp_path, capsys):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    code = main(["export", "--checkpoint", str(tmp_path), "--to", str(tmp_path / "full")])
    err = capsys.readouterr().err
    assert code == 2 and "not an empty directory" in err and (tmp_path / "full" / "keep.txt").read_text() == "mine"
    code = main(["export", "--checkpoint", str(tmp_path / "nothing"), "--to", str(tmp_path / "new")])
    assert code == 2 and "no such directory" in capsys.readouterr().err and not (tmp_path / "new").exists()
    code = main(["export", "--checkpoint", str(tmp_path), "--to", str(tmp_path / "new"), "--max-shard-size", "5XB"])
    assert code == 2 and "expected a size such as 5GB" in capsys.readouterr().err
