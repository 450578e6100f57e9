"""Hugging Face weights in and out for every family plait reads (single process, tiny models).

* In: a random tiny transformers model of the family (its features on: biases, q/k norms, post
  and sandwich norms, windows, soft-caps, rope scaling, fused projections, multi-query attention,
  routed experts saved one tensor per expert, the router, a gated shared expert, GPT-OSS's sinks
  and fused, biased experts with the clamped SwiGLU;
  norms and biases moved off their initial values), saved with ``save_pretrained``, imported by
  ``load_hf_weights`` into the model plait reads from the same config.json: plait's loss equals
  transformers' on the same batch.
* Out: plait's model of that config (random weights, norms and biases moved), saved as a plait
  checkpoint and exported by ``export_checkpoint``: its config.json reads back as the same
  ModelSpec, and transformers' ``from_pretrained`` gives plait's logits.

The two compute the same sums in other orders, so they agree within ``tolerances.run_rtol`` of the
widest sum (the vocabulary) and the depth (relative to the loss, or to the largest logit); a wrong
row permutation, a transposed or misplaced tensor moves them by 1e-2 or more.
"""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

import hf_models
import tolerances
import torch
import torch.nn.functional as F

from plait.run.checkpoint.hf.export import export_checkpoint
from plait.run.checkpoint.hf.load import load_hf_weights, model_weights
from plait.run.model import apply_kernels
from plait.spec.hf_config import model_from_hf_config

RTOL = tolerances.run_rtol(hf_models.VOCAB, hf_models.LAYERS + 1)  # Gemma-2's tiny model has 3 layers
GLOBAL_BATCH, SEQ = 2, 12  # longer than every window
FAMILIES = sorted(hf_models.FAMILY_FEATURES)


def plait_model(spec, checkpoint=None):
    model = hf_models.plait_model(spec, checkpoint)
    apply_kernels(model, "eager" if spec.attn_softcap or spec.sinks else "sdpa", "fused")  # soft-caps, sinks: eager
    return model


@pytest.mark.parametrize("family", FAMILIES)
def test_import_gives_transformers_loss(tmp_path, family):
    hf_model = hf_models.family_model(family, tmp_path / family)
    directory = hf_models.save(hf_model, tmp_path / family)
    spec = model_from_hf_config(directory)
    assert spec.family == family
    model = plait_model(spec)
    load_hf_weights(directory, model_weights(model).items(), spec, "cpu")
    rows = hf_models.synthetic_batch(spec.vocab, 5, GLOBAL_BATCH, SEQ)
    with torch.no_grad():
        want = hf_model(input_ids=rows, labels=rows).loss.item()
        logits = model(rows[:, :-1])
    got = F.cross_entropy(logits.flatten(0, 1).float(), rows[:, 1:].flatten()).item()
    assert got == pytest.approx(want, rel=RTOL)


@pytest.mark.parametrize("family", FAMILIES)
def test_export_loads_in_transformers_with_plait_logits(tmp_path, family):
    from transformers import AutoModelForCausalLM

    spec = model_from_hf_config(hf_models.family_config(family, tmp_path / "config"))
    model = plait_model(spec)
    hf_models.perturb_norms_and_biases(model, seed=9)
    checkpoint = hf_models.save_checkpoint(model, spec, tmp_path / "ckpt")
    out = tmp_path / "exported"
    export_checkpoint(checkpoint, out)
    read_back = model_from_hf_config(out)
    assert dataclasses.replace(read_back, name=spec.name) == spec  # the config round trip
    exported = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32, attn_implementation="eager").eval()
    assert type(exported).__name__.lower().startswith(family.replace("_", ""))
    rows = hf_models.synthetic_batch(spec.vocab, 6, GLOBAL_BATCH, SEQ)[:, :-1]
    with torch.no_grad():
        want = model(rows)
        got = exported(input_ids=rows).logits
    scale = want.abs().max().item()
    assert (got - want).abs().max().item() <= RTOL * scale
