"""What each stack's software holds at the memory peak that the planner's generic accounting does not
(issue 29, item 3), mechanism by mechanism. Expected bytes are built from the formula's parts here
(parameters, tokens, bytes per element), never read back from the function under test."""

from __future__ import annotations

import dataclasses

import pytest

from plait.measure.validate.loss import TE_LOSS_BYTES
from plait.plan.activations import layer_bytes
from plait.plan.cost import estimate_step
from plait.plan.memory import estimate_memory, largest_submodule_params, offload_buffer_bytes
from plait.plan.params import DEFAULT_PARAMS, params_for_stack
from plait.plan.states import zero3_buffer_params
from plait.spec.hardware import cluster_for_gpu
from plait.spec.layout import JobSpec, Layout
from plait.spec.model import ModelSpec
from plait.spec.models import MODELS
from plait.spec.stack import get_stack

# Narayanan et al. 2021 Table 1's 530B GPT (the Table 2 ZeRO-3 baseline ran it on DeepSpeed)
GPT530B = ModelSpec(name="gpt-530b", arch="gpt", n_layers=105, hidden=20480, ffn_hidden=81920, n_heads=128,
                    n_kv_heads=128, vocab=51200, max_seq_len=2048, tied_embeddings=True)
DEEPSPEED = params_for_stack(get_stack("deepspeed"))


def test_fsdp_holds_two_gathered_layers_and_one_layer_of_gradients():
    assert zero3_buffer_params(100.0) == 300.0
    assert zero3_buffer_params(100.0, largest=40.0, live_cap=0.0, bucket=50.0) == 300.0  # no cap: FSDP's units


def test_deepspeed_gathers_under_its_live_cap_and_reduces_in_buckets():
    layer, largest, cap, bucket = 5.0e9, 1.7e9, 1.0e9, 5.0e8
    # up to the cap, plus one whole parameter fetched past it; one bucket plus one full-size gradient
    assert zero3_buffer_params(layer, largest, cap, bucket) == cap + largest + bucket + largest
    # a layer smaller than half the cap: two layers live, as FSDP, but gradients by bucket
    assert zero3_buffer_params(1.0e8, 4.0e7, cap, bucket) == 2 * 1.0e8 + 4.0e7 + bucket + 4.0e7


def test_the_deepspeed_stack_states_the_librarys_defaults():
    assert DEEPSPEED.zero3_live_params == 1.0e9 and DEEPSPEED.zero3_bucket_params == 5.0e8
    assert DEFAULT_PARAMS.zero3_live_params == 0.0  # every other stack: FSDP's units


def test_narayanans_530b_zero3_fits_on_80gb_with_deepspeeds_gathering():
    h, f = GPT530B.hidden, GPT530B.ffn_hidden
    assert largest_submodule_params(GPT530B, Layout()) == h * f  # the MLP's first GEMM, 1.68B
    layout = Layout(dp=640, mbs=4, zero=3, ckpt="full", attn="eager")
    cluster, job = cluster_for_gpu("a100-80g", 640, 8), JobSpec(global_batch=2560, seq_len=2048)
    fsdp = estimate_memory(GPT530B, cluster, job, layout, runtime="megatron")
    ds = estimate_memory(GPT530B, cluster, job, layout, DEEPSPEED, runtime="megatron")
    layer = GPT530B.layer_params()
    assert fsdp.zero3_buffers == 2 * 3 * layer
    assert ds.zero3_buffers == 2 * (1.0e9 + 2 * h * f + 5.0e8)
    assert not fsdp.fits and ds.fits
    assert ds.activations == fsdp.activations  # only the gathered buffers differ


def test_a_fused_cross_entropy_keeps_its_bytes_per_logit_and_prices_the_same_time():
    """Transformer Engine's cross entropy (a Megatron-Bridge recipe's, ``plait.measure.validate.loss``)
    writes the gradient over the bf16 logits; flash-attn's (the llm-foundry stack's) keeps the logits
    and writes a bf16 gradient beside them; Megatron-Core's own default keeps the generic loss."""
    model, cluster = MODELS["llama3-8b"], cluster_for_gpu("h100-sxm", 8, 8)
    layout, job = Layout(dp=8, mbs=2, zero=1), JobSpec(global_batch=16, seq_len=8192)
    logits = 2 * 8192 * model.vocab  # one micro-batch's logits, elements
    foundry = params_for_stack(get_stack("llm-foundry"))
    te_loss = dataclasses.replace(params_for_stack(get_stack("megatron-core")), loss_peak_bytes=TE_LOSS_BYTES)
    for params, peak in ((te_loss, 2.0), (foundry, 4.0)):
        assert params.loss_peak_bytes == peak
        assert estimate_memory(model, cluster, job, layout, params).logits == peak * logits
        traffic = dataclasses.replace(params, loss_peak_bytes=0.0)  # the loss's traffic stays priced alike
        assert estimate_step(model, cluster, job, layout, params).step_time == \
            estimate_step(model, cluster, job, layout, traffic).step_time
    # Megatron's own loss keeps the bf16 logits + fp32 log-softmax + fp32 gradient (2 + 4 + 4); PyTorch's
    # (the default) its counted 12
    megatron = params_for_stack(get_stack("megatron-core"))
    assert estimate_memory(model, cluster, job, layout, megatron).logits == (2 + 4 + 4) * logits
    assert estimate_memory(model, cluster, job, layout).logits == DEFAULT_PARAMS.loss_peak_bytes * logits == 12 * logits


def test_transformer_engines_offload_holds_only_the_kept_layers_at_the_peak():
    moved = [3.0, 3.0, 2.0]
    assert offload_buffer_bytes(8.0, moved, "torch") == 6.0  # plait: one layer copied, one prefetched
    assert offload_buffer_bytes(8.0, moved, "megatron-core") == 0.0
    model, cluster = MODELS["llama3-70b"], cluster_for_gpu("gb200", 64, 64)
    layout, job = Layout(dp=64, mbs=2, zero=3, offload=0.5, precision="fp8"), JobSpec(global_batch=256, seq_len=8192)
    per_layer = layer_bytes(model, layout, 8192, runtime="megatron-core")
    memory = estimate_memory(model, cluster, job, layout, runtime="megatron-core")
    assert memory.activations == pytest.approx(40 * per_layer)  # (L - N)·T: 80 layers, 40 offloaded


@pytest.mark.parametrize("runtime, share", [("megatron-core", 0.0), ("megatron", 1.0), ("torch", 1.0)])
def test_the_embedding_output_is_the_first_layers_input_in_megatron_core(runtime, share):
    model, cluster = MODELS["llama3-8b"], cluster_for_gpu("h100-sxm", 8, 8)
    layout, job = Layout(dp=8, mbs=1, zero=1), JobSpec(global_batch=8, seq_len=4096)
    memory = estimate_memory(model, cluster, job, layout, runtime=runtime)
    assert memory.embedding_activations == share * 2 * 4096 * model.hidden
