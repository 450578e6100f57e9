"""DeepSeek-V3's Hugging Face weights in and out (``plait.run.checkpoint.hf.moe_rows``), beyond the
one-process round trip of every family (tests/run/test_hf_families.py, low-rank queries).

* Without a query rank (``q_lora_rank: null``: ``q_proj``): a ``save_pretrained`` model imported gives
  transformers' loss, and plait's model exported loads in transformers with plait's logits.
* ``plait train --init-from`` a tiny DeepSeek-V3 under dp=2 × ep=2 with ZeRO-3 (two processes, gloo
  on CPU): the first step's loss equals transformers' on the same batch, and the checkpoint, exported
  by ``plait export``, loads in transformers with the logits of plait's model read from that
  checkpoint; the sigmoid routers' balancing biases, moved by the training steps, are exported exactly.
* ``rope_interleave: false`` (RoPE on the halves of the decoupled key/query rows, which the table
  does not permute) is refused by name.

Bounds: ``tolerances.run_rtol`` of the widest sum (the vocabulary) and the depth, as in
test_hf_families.py; a wrong row, a transposed tensor or a missing router bias moves the loss by 1e-3
or more.
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
import torch.nn.functional as F

from plait.errors import PlaitError
from plait.run.checkpoint import store
from plait.run.checkpoint.hf.export import export_checkpoint
from plait.run.checkpoint.hf.load import check_checkpoint, load_hf_weights, model_weights
from plait.spec.hf_config import model_from_hf_config

RTOL = tolerances.run_rtol(hf_models.VOCAB, hf_models.LAYERS)
GLOBAL_BATCH, SEQ, SEED, STEPS = 4, 16, 3, 2


def test_without_query_rank_weights_go_in_and_out(tmp_path):
    hf_model = hf_models.family_model("deepseek_v3", tmp_path / "source", seed=4, q_lora_rank=None)
    source = hf_models.save(hf_model, tmp_path / "source")
    spec = model_from_hf_config(source)
    assert spec.mla.q_lora_rank == 0
    model = hf_models.plait_model(spec)
    load_hf_weights(source, model_weights(model).items(), spec, "cpu")
    rows = hf_models.synthetic_batch(spec.vocab, 5, 2, 12)
    with torch.no_grad():
        want = hf_model(input_ids=rows, labels=rows).loss.item()
        got = F.cross_entropy(model(rows[:, :-1]).flatten(0, 1), rows[:, 1:].flatten()).item()
    assert got == pytest.approx(want, rel=RTOL)

    hf_models.perturb_norms_and_biases(model, seed=9)
    export_checkpoint(hf_models.save_checkpoint(model, spec, tmp_path / "ckpt"), tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["q_lora_rank"] is None and config["rope_interleave"] is True
    reloaded = hf_models.load(tmp_path / "out")
    with torch.no_grad():
        want, got = model(rows[:, :-1]), reloaded(input_ids=rows[:, :-1]).logits
    assert (got - want).abs().max().item() <= RTOL * want.abs().max().item()


def test_rope_on_the_halves_is_refused(tmp_path):
    hf_model = hf_models.family_model("deepseek_v3", tmp_path / "source", rope_interleave=False)
    source = hf_models.save(hf_model, tmp_path / "source")
    with pytest.raises(PlaitError, match="rope_interleave=False"):
        check_checkpoint(source, model_from_hf_config(source))


def test_deepseek_v3_in_and_out_under_expert_parallelism_and_zero3(tmp_path):
    hf_model = hf_models.family_model("deepseek_v3", tmp_path / "source", seed=13)
    source = hf_models.save(hf_model, tmp_path / "source")
    records, checkpoints, out = hf_models.train_from_and_export(source, "dp=2,ep=2,zero=3", tmp_path, GLOBAL_BATCH, SEQ,
                                                                 STEPS, SEED)
    spec = model_from_hf_config(source)
    rows = hf_models.synthetic_batch(spec.vocab, SEED, GLOBAL_BATCH, SEQ)
    with torch.no_grad():
        first = hf_model(input_ids=rows, labels=rows).loss.item()
    assert records[0]["loss"] == pytest.approx(first, rel=RTOL)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "deepseek_v3" and config["architectures"] == ["DeepseekV3ForCausalLM"]
    reloaded = hf_models.load(out)
    trained = hf_models.plait_model(model_from_hf_config(out), checkpoints / store.final_name(STEPS))
    for layer in range(spec.moe.first_dense, spec.n_layers):  # the balancing biases, as trained, exported exactly
        ours = trained.layers[str(layer)].feed_forward.score_bias
        start, exported = (m.model.layers[layer].mlp.gate.e_score_correction_bias for m in (hf_model, reloaded))
        assert torch.equal(exported, ours) and not torch.equal(ours, start)
    hf_models.assert_export_holds_trained(trained, reloaded, hf_model, rows[:, :-1], RTOL)
