"""The runtime's model, stage split, checkpoint choice, schedule and config, without processes."""

from __future__ import annotations

import itertools
import math

import pytest

pytest.importorskip("torch")

import runtime_tasks
import torch

from plait.errors import PlaitError
from plait.run.memory.recompute import checkpointed_layer_ids
from plait.run.config import OptimConfig, RunConfig, TrainJob
from plait.run.parallel.mesh import mesh_dim_order, mesh_shape
from plait.run.model import build_model, canonical_name, count_parameters, init_weights
from plait.run.optim import lr_at
from plait.run.parallel.pipeline import build_stage_module, stage_ids_of_rank
from plait.run.device import gpu_from_device_name
from plait.spec.layout import Layout
from plait.spec.models import MODELS, get_model
from plait.spec.validate import stage_layer_counts


def _runtime_builds(spec) -> bool:
    """Whether plait train runs the model on one GPU with the eager attention kernel (which takes
    soft-caps and sinks): every preset, MLA and GPT-OSS's biased, clamped experts included."""
    from plait.spec.capabilities import runtime_violations
    from plait.spec.layout import JobSpec

    return not runtime_violations(spec, Layout(attn="eager"), JobSpec(global_batch=1, seq_len=8))


@pytest.mark.parametrize("name", sorted(name for name, spec in MODELS.items() if _runtime_builds(spec)))
def test_parameter_count_equals_the_planner_on_meta(name):
    from plait.spec.moe.counts import layer_params_at

    spec = MODELS[name]
    model = build_model(spec)  # meta device: no memory, even for 1T parameters
    assert next(model.parameters()).is_meta
    assert count_parameters(model) == spec.total_params()
    for index in {0, spec.n_layers - 1}:  # MoE models: a dense first layer (tiny-moe) and an MoE one
        block = model.layers[str(index)]
        planned = layer_params_at(spec, index) if spec.moe is not None else spec.layer_params()
        assert sum(p.numel() for p in block.parameters()) == planned


@pytest.mark.parametrize("layout", ["pp=2", "pp=4", "pp=2,vpp=2", "pp=3,split=uneven", "pp=3,vpp=2,split=uneven"])
def test_pipeline_stages_hold_every_parameter_once(layout):
    spec = get_model("tiny-gpt")  # 4 layers, untied head
    lay = Layout.parse(layout)
    names: list[str] = []
    for stage_id in range(lay.pp * lay.vpp):
        names += [n for n, _ in build_stage_module(spec, lay, stage_id).named_parameters()]
    assert len(names) == len(set(names))
    assert set(names) == {n for n, _ in build_model(spec).named_parameters()}


def test_uneven_split_matches_the_planner_and_spares_the_end_stages():
    spec = get_model("megatron-1.7b")  # 24 layers
    counts = stage_layer_counts(spec, Layout.parse("pp=5,split=uneven"))
    assert sum(counts) == 24 and max(counts) == math.ceil(24 / 5)
    assert counts[0] <= counts[1] and counts[-1] <= counts[1]
    assert stage_layer_counts(spec, Layout.parse("pp=4")) == [6, 6, 6, 6]


def test_interleaved_ranks_hold_looped_stages():
    assert stage_ids_of_rank(Layout.parse("pp=4,vpp=2"), 1) == [1, 5]
    assert stage_ids_of_rank(Layout.parse("pp=4"), 3) == [3]


def test_init_is_a_function_of_seed_and_name_only():
    spec = get_model("tiny")
    whole = build_model(spec, "meta")
    whole.to_empty(device="cpu")
    init_weights(whole, spec, seed=7, device="cpu")
    stage = build_stage_module(spec, Layout.parse("pp=2"), 1)  # layers 2-3, norm, output
    stage.to_empty(device="cpu")
    init_weights(stage, spec, seed=7, device="cpu")
    full = dict(whole.named_parameters())
    for name, param in stage.named_parameters():
        assert torch.equal(param, full[name]), name
    other = build_model(spec, "meta")
    other.to_empty(device="cpu")
    init_weights(other, spec, seed=8, device="cpu")
    assert not torch.equal(other.layers["0"].attention.wq.weight, whole.layers["0"].attention.wq.weight)
    assert torch.equal(whole.layers["0"].attention_norm.weight, torch.ones(spec.hidden))
    assert abs(whole.tok_embeddings.weight.std().item() - 0.02) < 0.002


def test_canonical_names_strip_wrappers():
    name = "layers.3._checkpoint_wrapped_module._orig_mod.attention.wq.weight"
    assert canonical_name(name) == "layers.3.attention.wq.weight"


def test_checkpoint_k_of_l_layers():
    assert checkpointed_layer_ids(["0", "1", "2"], Layout.parse("ckpt=full:2")) == ["0", "1"]
    assert checkpointed_layer_ids(["0", "1"], Layout.parse("ckpt=selective")) == ["0", "1"]
    assert checkpointed_layer_ids(["0", "1"], Layout.parse("dp=1")) == []


def test_mesh_follows_the_zero_stage_and_rank_order():
    assert mesh_shape(Layout.parse("dp=4")) == {"pp": 1, "dp_replicate": 4, "dp_shard": 1, "cp": 1, "tp": 1}
    assert mesh_shape(Layout.parse("dp=8,zero=3,hsdp=2"))["dp_shard"] == 4
    assert mesh_dim_order(Layout.parse("dp=1")) == ("pp", "dp_replicate", "dp_shard", "cp", "tp")
    assert mesh_dim_order(Layout.parse("order=dp-tp-cp-pp")) == ("pp", "cp", "tp", "dp_replicate", "dp_shard")


def test_learning_rate_warms_up_then_decays_to_the_floor():
    config = OptimConfig(lr=1.0, warmup_steps=4, min_lr_ratio=0.1)
    values = [lr_at(step, 20, config) for step in range(21)]
    assert values[:4] == [0.25, 0.5, 0.75, 1.0]
    assert all(a >= b for a, b in itertools.pairwise(values[3:]))
    assert values[20] == pytest.approx(0.1)


def test_run_config_round_trips_json(tmp_path):
    config = RunConfig(job=TrainJob(model=get_model("tiny"), layout=Layout.parse("dp=2,tp=2,ckpt=full:1"),
                                    global_batch=8, seq_len=32, steps=3), optim=OptimConfig(lr=1e-3))
    config.save(tmp_path / "c.json")
    assert RunConfig.load(tmp_path / "c.json") == config


def test_runtime_refuses_what_it_does_not_run():
    base = {"model": get_model("llama3.2-1b"), "global_batch": 8, "seq_len": 64}
    assert "ties its embeddings" in " ".join(
        RunConfig(job=TrainJob(layout=Layout.parse("pp=2"), **base)).runtime_problems())
    assert RunConfig(job=TrainJob(layout=Layout.parse("dp=2,tp=2"), **base)).runtime_problems() == []
    with pytest.raises(PlaitError, match="steps=0"):
        TrainJob(layout=Layout(), steps=0, **base)


@pytest.mark.parametrize("device,preset", [
    ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA H200", "h200"), ("NVIDIA A100-SXM4-80GB", "a100-80g"),
    ("NVIDIA H100 PCIe", None), ("NVIDIA GeForce RTX 4090", None),
])
def test_gpu_spec_is_named_only_when_certain(device, preset):
    assert gpu_from_device_name(device) == preset


@pytest.mark.parametrize("layout", ["dp=2", "dp=2,zero=3", "tp=2"])
def test_tied_embeddings_stay_tied_on_the_device(dist_pool, layout):
    """Materializing off the meta device (``to_empty``) gives each module its own Parameter: re-tied."""
    for rank in dist_pool(2).run(runtime_tasks.tied_model_parameters, layout):
        assert rank["tied"], layout
        if layout == "dp=2":  # unsharded: the full count
            assert rank["count"] == rank["planned"]


def test_weight_decay_skips_every_bias_the_experts_stacked_ones_included():
    """AdamW's groups for tiny-gpt-oss: the matrices (attention, stacked expert weights, router,
    embeddings) decay; norms, attention sinks and every bias do not, the experts' 2-D (E, f) biases
    included (the rule was ``ndim >= 2`` alone, which decayed them)."""
    from plait.run.optim import build_optimizer

    model = build_model(get_model("tiny-gpt-oss"))
    named = list(model.named_parameters())
    optimizer = build_optimizer(named, OptimConfig(weight_decay=0.1))
    decay_of = {id(p): group["weight_decay"] for group in optimizer.param_groups for p in group["params"]}
    by_name = {name: decay_of[id(p)] for name, p in named}
    assert len(by_name) == len(named)  # every parameter is in exactly one group
    expert_biases = [name for name in by_name if name.endswith(("w1_bias", "w2_bias", "w3_bias"))]
    assert expert_biases and all(dict(named)[name].ndim == 2 for name in expert_biases)
    assert {by_name[name] for name in expert_biases} == {0.0}
    stacked = [name for name in by_name if name.endswith((".w1", ".w2", ".w3")) and dict(named)[name].ndim == 3]
    assert stacked and {by_name[name] for name in stacked} == {0.1}
    assert {by_name[name] for name, p in named if p.ndim == 1} == {0.0}  # norms, sinks, vector biases
    assert by_name["tok_embeddings.weight"] == 0.1
