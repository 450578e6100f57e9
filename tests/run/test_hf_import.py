"""Hugging Face weights into plait (``plait.run.checkpoint.hf.load``), in one process, and the
name tables' conversions (``plait.run.checkpoint.hf.codecs``).

A random tiny LlamaForCausalLM / GPT2LMHeadModel saved by transformers, imported into plait's
model, must give transformers' loss on the same batch. The two compute the same sums in other
orders (and Llama's rotary pairs in another order, undone by the import's row permutation), so
they agree within ``tolerances.run_rtol`` of the widest sum (the vocabulary) and the depth; a
wrong permutation or a transposed Conv1D changes the loss at the 1e-2 level.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

import hf_models
import tolerances
import torch
import torch.nn.functional as F

from plait.errors import PlaitError
from plait.run.checkpoint.hf import files as hf_files
from plait.run.checkpoint.hf import codecs as hf_codecs
from plait.run.checkpoint.hf import map as hf_map
from plait.run.checkpoint.hf.load import check_checkpoint, load_hf_weights
from plait.spec.hf_config import model_from_hf_config

RTOL = tolerances.run_rtol(hf_models.VOCAB, hf_models.LAYERS)
GLOBAL_BATCH, SEQ = 4, 16


def imported(directory):
    spec = model_from_hf_config(directory)
    model = hf_models.plait_model(spec)
    load_hf_weights(directory, model.named_parameters(), spec, "cpu")
    return spec, model


def losses(hf_model, model, rows):
    with torch.no_grad():
        want = hf_model(input_ids=rows, labels=rows).loss.item()
        logits = model(rows[:, :-1])
        got = F.cross_entropy(logits.flatten(0, 1).float(), rows[:, 1:].flatten()).item()
    return got, want


@pytest.mark.parametrize("shards", [None, "40KB"])
def test_llama_import_gives_transformers_loss(tmp_path, shards):
    hf_model = hf_models.llama()
    directory = hf_models.save(hf_model, tmp_path / "llama", shards)
    assert (directory / hf_files.INDEX).exists() == (shards is not None)
    spec, model = imported(directory)
    rows = hf_models.synthetic_batch(spec.vocab, 7, GLOBAL_BATCH, SEQ)
    got, want = losses(hf_model, model, rows)
    assert got == pytest.approx(want, rel=RTOL)
    random_loss = losses(hf_model, hf_models.plait_model(spec), rows)[0]
    assert abs(random_loss - want) > 1e3 * RTOL * want  # the test tells loaded weights from random ones


def test_llama_with_a_tied_head_imports(tmp_path):
    hf_model = hf_models.llama(seed=3, tied=True)
    spec, model = imported(hf_models.save(hf_model, tmp_path / "tied"))
    assert spec.tied_embeddings and model.output.weight is model.tok_embeddings.weight
    got, want = losses(hf_model, model, hf_models.synthetic_batch(spec.vocab, 1, GLOBAL_BATCH, SEQ))
    assert got == pytest.approx(want, rel=RTOL)


def test_gpt2_import_gives_transformers_loss(tmp_path):
    hf_model = hf_models.gpt2()
    spec, model = imported(hf_models.save(hf_model, tmp_path / "gpt2"))
    assert spec.arch == "gpt"
    got, want = losses(hf_model, model, hf_models.synthetic_batch(spec.vocab, 2, GLOBAL_BATCH, SEQ))
    assert got == pytest.approx(want, rel=RTOL)


def test_gpt2_names_without_the_transformer_prefix_are_read(tmp_path):
    """OpenAI's own GPT-2 checkpoint stores ``h.0.attn...``, not ``transformer.h.0.attn...``."""
    from safetensors.torch import load_file, save_file

    hf_model = hf_models.gpt2(seed=5)
    directory = hf_models.save(hf_model, tmp_path / "gpt2")
    weights = load_file(str(directory / hf_files.SINGLE))
    save_file({name.removeprefix("transformer."): value for name, value in weights.items()},
              str(directory / hf_files.SINGLE), metadata={"format": "pt"})
    spec, model = imported(directory)
    got, want = losses(hf_model, model, hf_models.synthetic_batch(spec.vocab, 2, GLOBAL_BATCH, SEQ))
    assert got == pytest.approx(want, rel=RTOL)


# ------------------------------------------------------------------ refusals, each naming what is wrong
def test_a_model_of_other_shapes_is_refused_naming_the_first_tensor(tmp_path):
    import dataclasses

    directory = hf_models.save(hf_models.llama(), tmp_path / "llama")
    spec = dataclasses.replace(model_from_hf_config(directory), ffn_hidden=2 * hf_models.FFN)
    with pytest.raises(PlaitError, match=r"model\.layers\.0\.mlp\.gate_proj\.weight has shape \[96, 64\], .* needs "
                                         r"\[192, 64\]"):
        check_checkpoint(directory, spec)


def test_a_tensor_the_model_lacks_is_refused_not_dropped(tmp_path):
    from safetensors.torch import load_file, save_file

    directory = hf_models.save(hf_models.llama(), tmp_path / "llama")
    weights = load_file(str(directory / hf_files.SINGLE))
    weights["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(hf_models.HIDDEN)
    save_file(weights, str(directory / hf_files.SINGLE), metadata={"format": "pt"})
    with pytest.raises(PlaitError, match=r"tensor model\.layers\.0\.self_attn\.q_proj\.bias has no place"):
        check_checkpoint(directory, model_from_hf_config(directory))


def test_a_missing_tensor_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    directory = hf_models.save(hf_models.llama(), tmp_path / "llama")
    weights = load_file(str(directory / hf_files.SINGLE))
    del weights["lm_head.weight"]
    save_file(weights, str(directory / hf_files.SINGLE), metadata={"format": "pt"})
    with pytest.raises(PlaitError, match=r"no tensor lm_head\.weight for plait parameter output\.weight.*tie"):
        check_checkpoint(directory, model_from_hf_config(directory))


def test_a_model_of_other_numerics_is_refused_naming_the_field(tmp_path):
    """The checkpoint's config.json is read as plait reads it; a --model that computes otherwise is refused."""
    import dataclasses

    directory = hf_models.save(hf_models.llama(), tmp_path / "llama")
    spec = dataclasses.replace(model_from_hf_config(directory), rope_theta=500000.0)
    with pytest.raises(PlaitError, match=r"both llama; they differ in \(checkpoint vs model\) rope_theta 10000\.0 vs "
                                         r"500000\.0;"):
        check_checkpoint(directory, spec)


def edit_config(directory, **changes):
    import json

    config = json.loads((directory / "config.json").read_text())
    config.update(changes)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_numerics_the_runtime_does_not_build_are_refused(tmp_path):
    plain = hf_models.save(hf_models.llama(), tmp_path / "plain")
    directory = edit_config(hf_models.save(hf_models.llama(), tmp_path / "llama"),
                            rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0})
    check_checkpoint(directory, model_from_hf_config(directory))  # the runtime applies yarn
    with pytest.raises(PlaitError, match=r"rope_scaling \(\('factor', 4\.0\), .*'yarn'\)\) vs \(\)"):
        check_checkpoint(directory, model_from_hf_config(plain))  # a model without it computes otherwise
    directory = edit_config(hf_models.save(hf_models.gpt2(), tmp_path / "gpt2"), scale_attn_weights=False)
    with pytest.raises(PlaitError, match=r"scale_attn_weights=False \(plait's runtime runs True\)"):
        check_checkpoint(directory, model_from_hf_config(directory))


def test_directories_without_safetensors_weights_are_refused(tmp_path):
    with pytest.raises(PlaitError, match="no such directory"):
        hf_files.check_model_dir(tmp_path / "absent")
    directory = tmp_path / "pickled"
    directory.mkdir()
    (directory / "config.json").write_text('{"model_type": "llama"}')
    (directory / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(PlaitError, match="neither model.safetensors nor .*PyTorch pickles are not read"):
        hf_files.check_model_dir(directory)
    (directory / hf_files.SINGLE).write_bytes(b"\xff" * 16)
    with pytest.raises(PlaitError, match="not a safetensors file"):
        hf_files.check_model_dir(directory)


def test_unknown_model_types_are_refused_by_name(tmp_path):
    with pytest.raises(PlaitError, match="model_type 'deepseek_v2' has no weight-name table.*DeepSeek-V2's"):
        hf_map.family_of_model_type("deepseek_v2")
    with pytest.raises(PlaitError, match="model_type 'bert' has no weight-name table"):
        hf_map.family_of_model_type("bert")


# ------------------------------------------------------------------ the tables' conversions
def small_spec():
    from plait.spec.model import ModelSpec

    return ModelSpec(name="t", arch="llama", n_layers=1, hidden=16, ffn_hidden=24, n_heads=4, n_kv_heads=2, vocab=8)


CODECS = [hf_codecs.Copy(), hf_codecs.Conv1D(), hf_codecs.RopeRows("q"), hf_codecs.RopeRows("kv"),
          hf_codecs.RopeRows("one"), hf_codecs.QkNorm("q"), hf_codecs.Fused(("h", "kv", "kv"), conv1d=True),
          hf_codecs.Fused(("h", "kv", "kv"), rope=True), hf_codecs.Fused(("ffn", "ffn"))]


@pytest.mark.parametrize("codec", CODECS,
                         ids=lambda codec: type(codec).__name__ if " object at " in repr(codec) else repr(codec))
def test_every_codec_round_trips(codec):
    spec = small_spec()
    rows = {"h": 16, "kv": 8, "ffn": 24}
    if isinstance(codec, hf_codecs.Fused):
        parts = tuple(torch.randn(rows[p], 16) for p in codec.parts)
    elif isinstance(codec, hf_codecs.RopeRows):
        parts = (torch.randn({"q": 16, "kv": 8}[codec.heads], 16) if codec.heads != "one" else torch.randn(4),)
    else:
        parts = (torch.randn(16, 24),)
    back = codec.to_plait(codec.to_hf(parts, spec), spec)
    assert len(back) == len(parts) and all(torch.equal(a, b) for a, b in zip(back, parts))


def test_rope_rows_move_adjacent_pairs_to_halves():
    """plait row 2j + r of a head is Hugging Face row r·d/2 + j (d = head_dim)."""
    d = 8
    plait_rows = torch.arange(2 * d).float()  # two heads
    hf = hf_codecs.pairs_to_halves(plait_rows, heads=2)
    assert hf.tolist() == [0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15]


def test_shards_are_consecutive_groups_under_the_limit():
    sizes = [("a", 40), ("b", 40), ("c", 30), ("d", 100), ("e", 10)]
    assert hf_files.shard_groups(sizes, 100) == [["a", "b"], ["c"], ["d"], ["e"]]
    assert hf_files.shard_names(1) == ["model.safetensors"]
    assert hf_files.shard_names(2) == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]


def test_sizes_read_in_decimal_and_binary_units():
    assert [hf_files.parse_size(t) for t in ("5GB", "500MB", "2GiB", "40KB", "1000", "1.5GB")] == \
        [5 * 10**9, 500 * 10**6, 2 * 2**30, 40_000, 1000, 1_500_000_000]
    with pytest.raises(PlaitError, match="expected a size such as 5GB"):
        hf_files.parse_size("5XB")


def test_phi3_fused_projections_import(tmp_path):
    """Phi-3 is Llama with Q/K/V fused in qkv_proj and gate/up in gate_up_proj (its rows split, Q and K permuted)."""
    from transformers import Phi3Config, Phi3ForCausalLM

    torch.manual_seed(4)
    config = Phi3Config(vocab_size=hf_models.VOCAB, hidden_size=hf_models.HIDDEN, intermediate_size=hf_models.FFN,
                        num_hidden_layers=hf_models.LAYERS, num_attention_heads=hf_models.HEADS,
                        num_key_value_heads=hf_models.KV_HEADS, max_position_embeddings=hf_models.POSITIONS,
                        rms_norm_eps=1e-5, pad_token_id=None, bos_token_id=0, eos_token_id=0,
                        initializer_range=hf_models.INIT_STD, tie_word_embeddings=False)
    hf_model = Phi3ForCausalLM(config).eval()
    directory = hf_models.save(hf_model, tmp_path / "phi3")
    spec = model_from_hf_config(directory)
    assert spec.family == "phi3"
    model = hf_models.plait_model(spec)
    load_hf_weights(directory, model.named_parameters(), spec, "cpu")
    got, want = losses(hf_model, model, hf_models.synthetic_batch(spec.vocab, 4, GLOBAL_BATCH, SEQ))
    assert got == pytest.approx(want, rel=RTOL)


def test_a_sliding_window_the_model_does_not_have_is_refused(tmp_path):
    import json

    directory = hf_models.save(hf_models.llama(), tmp_path / "llama")
    spec = model_from_hf_config(directory)  # full causal attention
    config = json.loads((directory / "config.json").read_text())
    config["sliding_window"] = 8
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(PlaitError, match=r"sliding_window 8 vs 0"):
        check_checkpoint(directory, spec)
