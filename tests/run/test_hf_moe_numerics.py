"""Mixture-of-experts config keys that change the outputs, against transformers 5.24 (one process, CPU).

* Import: a tiny transformers model whose config uses a key plait used to read wrong or ignore
  (Qwen3-MoE's decoder_sparse_step 2, which puts experts on layers 1 and 3; Qwen3-MoE's
  use_sliding_window; Qwen2-MoE's windows on the even layers and its head_dim; OLMoE's attention
  biases), saved with ``save_pretrained`` and imported by ``load_hf_weights`` into the model plait
  reads from its config.json: plait's loss is transformers'.
* DeepSeek-V2's group-limited router (topk_method group_limited_greedy: a group scored by its best
  expert, the others masked to 0), routed scaling and a shared expert: plait's ``MoEFeedForward``
  with transformers' ``DeepseekV2Moe`` weights gives its outputs, and routing without the group
  limit would not.
* ``plait train --init-from`` a GPT-OSS directory with ``--model tiny-dsv3`` is refused before any
  rank starts, also under ``--dry-run``, in one line naming the two families first; the check
  imports no torch.

Bounds: ``tolerances.run_rtol`` of the widest sum (the vocabulary; the MoE block's hidden width) and
the depth, as in test_hf_families.py; a layer with experts where transformers has a dense MLP, a
missing window or bias moves the loss by 1e-3 or more.
"""

from __future__ import annotations

import json
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

import hf_models
import tolerances
import torch
import torch.nn.functional as F
from torchless import run_without_torch

from plait.cli import main
from plait.run.checkpoint.hf.load import load_hf_weights, model_weights
from plait.run.model import apply_kernels
from plait.spec.hf_config import model_from_hf_config, model_from_hf_dict
from plait.spec.moe.parts import is_moe_layer

GLOBAL_BATCH, SEQ = 2, 12  # longer than the windows (5)
CASES = {  # family, config overrides, plait's expert layers of the 4-layer model
    "qwen3_moe-every-second-layer": ("qwen3_moe", {"decoder_sparse_step": 2}, [1, 3]),
    "qwen2_moe-dense-layers-then-step": ("qwen2_moe", {"decoder_sparse_step": 2, "mlp_only_layers": [1]}, [3]),
    "qwen3_moe-sliding-window": ("qwen3_moe", {"use_sliding_window": True, "sliding_window": 5}, [0, 1, 2, 3]),
    "qwen2_moe-even-windows-head-dim": ("qwen2_moe", {"use_sliding_window": True, "sliding_window": 5,
                                                      "max_window_layers": 4, "head_dim": 32}, [0, 1, 2, 3]),
    "olmoe-attention-bias": ("olmoe", {"attention_bias": True}, [0, 1, 2, 3]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_import_gives_transformers_loss(tmp_path, case):
    family, overrides, experts = CASES[case]
    hf_model = hf_models.family_model(family, tmp_path, seed=3, num_hidden_layers=4, **overrides)
    directory = hf_models.save(hf_model, tmp_path)
    spec = model_from_hf_config(directory)
    assert [i for i in range(spec.n_layers) if is_moe_layer(spec, i)] == experts
    model = hf_models.plait_model(spec)
    apply_kernels(model, "sdpa", "fused")
    load_hf_weights(directory, model_weights(model).items(), spec, "cpu")
    rows = hf_models.synthetic_batch(spec.vocab, 5, GLOBAL_BATCH, SEQ)
    with torch.no_grad():
        want = hf_model(input_ids=rows, labels=rows).loss.item()
        got = F.cross_entropy(model(rows[:, :-1]).flatten(0, 1), rows[:, 1:].flatten()).item()
    assert got == pytest.approx(want, rel=tolerances.run_rtol(hf_models.VOCAB, spec.n_layers))


def _deepseek_v2_block(tmp_path):
    """transformers' DeepseekV2Moe (8 experts in 4 groups, 2 groups a token, top-3, scale 1.5, one shared
    expert; weights N(0, 0.5)) and plait's MoEFeedForward of the same config.json, with its weights."""
    from transformers import AutoConfig
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Moe

    from plait.run.modules.moe import MoEFeedForward

    config = AutoConfig.for_model("deepseek_v2", hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                                  n_routed_experts=8, num_experts_per_tok=3, n_shared_experts=1, num_hidden_layers=2,
                                  num_attention_heads=4, vocab_size=64, kv_lora_rank=16, q_lora_rank=None,
                                  qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, routed_scaling_factor=1.5,
                                  topk_method="group_limited_greedy", n_group=4, topk_group=2)
    config.save_pretrained(str(tmp_path))
    spec = model_from_hf_dict(json.loads((tmp_path / "config.json").read_text()), tmp_path / "config.json")
    torch.manual_seed(0)
    theirs = DeepseekV2Moe(config).float().eval()
    ours = MoEFeedForward(spec).eval()
    f = spec.moe.expert_ffn
    with torch.no_grad():
        for param in theirs.parameters():
            param.normal_(0.0, 0.5)
        ours.router.weight.copy_(theirs.gate.weight)
        gate_up = theirs.experts.gate_up_proj  # (E, 2f, h): gate rows, then up rows
        ours.experts.w1.copy_(gate_up[:, :f].transpose(1, 2))
        ours.experts.w3.copy_(gate_up[:, f:].transpose(1, 2))
        ours.experts.w2.copy_(theirs.experts.down_proj.transpose(1, 2))
        for name, hf_name in (("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj")):
            getattr(ours.shared, name).weight.copy_(getattr(theirs.shared_experts, hf_name).weight)
    return spec, theirs, ours


def test_deepseek_v2_group_limited_routing_is_transformers(tmp_path):
    spec, theirs, ours = _deepseek_v2_block(tmp_path)
    assert (spec.moe.router, spec.moe.n_groups, spec.moe.topk_groups, spec.moe.norm_topk) == ("softmax", 4, 2, False)
    x = torch.randn(2, 24, spec.hidden, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = theirs(x)
        got = ours(x)
        ours.n_groups = 1  # the same router without the group limit
        ungrouped = ours(x)
    scale = want.abs().max().item()
    rtol = tolerances.run_rtol(spec.hidden, 1)  # one block: the router, expert and combine sums
    assert (got - want).abs().max().item() <= rtol * scale
    assert (ungrouped - want).abs().max().item() > 1e3 * rtol * scale  # the limit changes the routing here


def test_init_from_another_family_is_refused_before_any_rank(tmp_path, capsys):
    directory = hf_models.save(hf_models.family_model("gpt_oss", tmp_path), tmp_path)
    capsys.readouterr()  # save_pretrained's progress bar
    code = main(["train", "--init-from", str(directory), "--model", "tiny-dsv3", "--layout", "dp=2,ep=2",
                 "--nproc-per-node", "2", "--device", "cpu", "--global-batch", "4", "--seq-len", "16", "--dry-run"])
    captured = capsys.readouterr()
    assert code == 2 and "torchrun" not in captured.out and captured.err.count("\n") == 1
    assert "the checkpoint is gpt_oss, the model tiny-dsv3 is deepseek_v3; they differ in" in captured.err
    assert "MoESpec(" not in captured.err and len(captured.err) < 600


def test_init_from_weights_stored_quantized_is_refused_before_any_rank(tmp_path, capsys):
    """A checkpoint whose config.json has a quantization_config (DeepSeek-V3's fp8 blocks, GPT-OSS's
    mxfp4) holds quantized tensors plait does not import: refused in one line before torchrun, naming
    the method and what to do; the same config plans (tests/spec/test_released_moe_configs.py)."""
    directory = hf_models.save(hf_models.family_model("gpt_oss", tmp_path), tmp_path)
    config = json.loads((directory / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4"}
    (directory / "config.json").write_text(json.dumps(config))
    capsys.readouterr()
    code = main(["train", "--init-from", str(directory), "--layout", "dp=2,ep=2", "--nproc-per-node", "2",
                 "--device", "cpu", "--global-batch", "4", "--seq-len", "16", "--dry-run"])
    captured = capsys.readouterr()
    assert code == 2 and "torchrun" not in captured.out and captured.err.count("\n") == 1
    assert "stored quantized" in captured.err and "'mxfp4'" in captured.err and "dequantized copy" in captured.err


def test_the_launchers_config_check_imports_no_torch(tmp_path):
    hf_models.family_config("gpt_oss", tmp_path)
    script = ("from plait.errors import PlaitError\n"
              "from plait.run.checkpoint.hf.numerics import check_init_from\n"
              "from plait.spec.models import get_model\n"
              f"check_init_from({str(tmp_path)!r}, None)\n"
              "try:\n"
              f"    check_init_from({str(tmp_path)!r}, get_model('tiny-dsv3'))\n"
              "except PlaitError as exc:\n"
              "    print(exc)\n")
    done = run_without_torch(script)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "the checkpoint is gpt_oss" in done.stdout
