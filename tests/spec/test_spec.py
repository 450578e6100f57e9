"""Specs as data: parsing, round trips, Hugging Face configs and every validation rule."""

import json

import pytest

from plait.errors import PlaitError
from plait.spec.hf_config import model_from_hf_config
from plait.spec.hardware import CLUSTERS, get_cluster, get_gpu
from plait.spec.layout import JobSpec, Layout, placement
from plait.spec.model import ModelSpec
from plait.spec.models import MODELS, get_model
from plait.spec.validate import validate


def messages(model, cluster, job, layout):
    return [str(v) for v in validate(model, cluster, job, layout)]


def test_parse_defaults_and_keys():
    layout = Layout.parse("dp=8,tp=4,pp=2,mbs=1,ckpt=selective")
    assert (layout.dp, layout.tp, layout.pp, layout.cp, layout.vpp) == (8, 4, 2, 1, 1)
    assert layout.ckpt == "selective" and layout.zero == 0 and layout.sp and layout.schedule == "1f1b"
    full = Layout.parse("dp=2, tp=2, pp=4, cp=2, vpp=2, mbs=2, zero=3, sp=0, ckpt=full:3, offload=disk:0.5, "
                        "opt_offload=1, hsdp=2, precision=fp8, attn=eager, order=tp-dp-cp-pp, split=uneven")
    assert full.schedule == "interleaved-1f1b" and full.ckpt_layers == 3
    assert (full.offload, full.offload_target, full.opt_offload) == (0.5, "disk", True)
    assert Layout.parse(str(full)) == full
    assert Layout.parse("schedule=zb,pp=2").schedule == "zero-bubble"


@pytest.mark.parametrize("text,fragment", [
    ("tp=two", "must be an integer"),
    ("warp=2", "unknown layout key 'warp'"),
    ("ckpt=sometimes", "ckpt='sometimes' must be one of"),
    ("tp=2,tp=4", "given twice"),
    ("offload=2", "must be a fraction"),
    ("order=tp-dp-pp", "must list each of"),
    ("dp", "is not key=value"),
])
def test_parse_errors_are_clear(text, fragment):
    with pytest.raises(PlaitError, match=fragment):
        Layout.parse(text)


def test_issue_examples_of_broken_rules():
    llama8b = get_model("llama3-8b")
    dgx64 = get_cluster("dgx-h100", 64)
    out = messages(llama8b, dgx64, JobSpec(1000, 2048), Layout(dp=8, tp=3, pp=4))
    assert "error: tp=3 does not divide n_kv_heads=8; tp that would: 1, 2, 4, 8" in out
    assert any("dp·tp·pp·cp = 8·3·4·1 = 96 but the cluster has 64 GPUs" in m for m in out)
    thirty = ModelSpec("m30", "llama", 30, 4096, 11008, 32, 8, 32000)
    out = messages(thirty, dgx64, JobSpec(1024, 2048), Layout(dp=16, tp=1, pp=4))
    assert any("pp=4 does not divide n_layers=30" in m for m in out)
    out = messages(llama8b, dgx64, JobSpec(1000, 2048), Layout(dp=64, mbs=1))
    assert any("global batch 1000 is not a multiple of dp·mbs = 64·1 = 64" in m for m in out)
    wide = messages(llama8b, get_cluster("dgx-h100", 16), JobSpec(16, 2048), Layout(tp=16))
    assert "warning: tp=16 spans 2 nodes of 8: tensor parallel over the inter-node network" in wide


def test_every_error_is_reported_at_once():
    model = get_model("tiny")
    out = messages(model, get_cluster("dgx-h100", 8), JobSpec(6, 100), Layout(dp=2, tp=3, pp=8, cp=3, mbs=4, hsdp=3))
    for fragment in ("but the cluster has 8 GPUs", "tp=3 does not divide n_heads", "pp·vpp", "not a multiple of dp·mbs",
                     "2·cp", "hsdp=3 replicas do not divide dp=2"):
        assert any(fragment in m for m in out), fragment


def test_valid_layout_has_no_errors():
    out = validate(get_model("llama2-70b"), get_cluster("dgx-a100", 64), JobSpec(512, 4096),
                   Layout(dp=2, tp=8, pp=4, vpp=2, schedule="interleaved-1f1b", zero=1))
    assert [v for v in out if v.severity == "error"] == []


def test_placement_follows_rank_order():
    layout = Layout(dp=4, tp=8, pp=2)
    groups = placement(layout, 8)
    assert not groups["tp"].spans_nodes and groups["dp"].nodes == 4 and groups["dp"].ranks_per_node == 1
    flipped = placement(Layout(dp=4, tp=8, pp=2, order="dp-tp-cp-pp"), 8)
    assert flipped["dp"].nodes == 1 and flipped["tp"].nodes == 4


def test_json_round_trips():
    for model in MODELS.values():
        assert ModelSpec.from_json(model.to_json()) == model
    for cluster in CLUSTERS.values():
        assert type(cluster).from_json(cluster.to_json()) == cluster
    layout = Layout.parse("dp=4,tp=2,zero=3,ckpt=balanced,offload=0.25")
    assert Layout.from_json(layout.to_json()) == layout


def test_cluster_from_json_file(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"name": "mine", "gpu": "h100-sxm", "gpus_per_node": 4,
                                "intra_node_bandwidth": 300e9, "inter_node_bandwidth": 25e9}))
    cluster = get_cluster(str(path), 16)
    assert cluster.gpu.name == "h100-sxm" and cluster.gpus_per_node == 4 and cluster.n_nodes == 4
    path.write_text(json.dumps({"name": "x", "gpu": "h100-sxm", "gpus_per_node": 4}))
    with pytest.raises(PlaitError, match="incomplete"):
        get_cluster(str(path))


def test_gpu_names_are_mapped_explicitly():
    assert get_gpu("h100 (96GB HBM2e, 500W)").name == "h100-96g-500w"
    with pytest.raises(PlaitError, match="known GPUs"):
        get_gpu("p100 sxm2")  # no preset: not guessed


def test_from_hf_config_llama_and_gpt2(tmp_path):
    llama = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "intermediate_size": 14336,
             "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
             "max_position_embeddings": 8192, "tie_word_embeddings": False}
    (tmp_path / "config.json").write_text(json.dumps(llama))
    assert model_from_hf_config(tmp_path).total_params() == 8_030_261_248
    gpt2 = {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "n_positions": 1024,
            "vocab_size": 50257}
    path = tmp_path / "gpt2.json"
    path.write_text(json.dumps(gpt2))
    # GPT-2 small: 124,439,808 parameters (tied embeddings)
    assert model_from_hf_config(path).total_params() == 124_439_808


def test_invalid_model_spec_is_a_clear_error():
    with pytest.raises(PlaitError, match="n_kv_heads=3 does not divide n_heads=8"):
        ModelSpec("bad", "llama", 2, 512, 1024, 8, 3, 1000)
