"""What a stack changes in a plan, mechanism by mechanism, and the plan examples of the stacks' issue.

Each expected number is derived here from the cost model's own definitions (bytes over bandwidth,
FLOPs over peak), never read back from the function under test."""

from __future__ import annotations

import dataclasses

import pytest

from plait.cli import main
from plait.plan import comm
from plait.plan.context.exchange import cp_exchange, exchanges
from plait.plan.cost import estimate_step
from plait.plan.kernels import gemm_time, layer_times
from plait.plan.params import DEFAULT_PARAMS
from plait.spec.capabilities import runtime_violations
from plait.spec.hardware import CLUSTERS, GPUS
from plait.spec.layout import JobSpec, Layout, group_of
from plait.spec.models import MODELS
from plait.spec.validate import errors_of, validate

LLAMA8B, LLAMA13B = MODELS["llama3-8b"], MODELS["llama2-13b"]


def test_p2p_sends_kv_at_its_own_heads_in_the_compute_dtype():
    """Transformer Engine's ring: cp-1 hops of K and V (GQA heads, bf16) forward, twice that backward
    (K/V again and dK/dV); PyTorch's ring (torch) sends K/V repeated to the query heads."""
    lay = Layout(dp=4, cp=2, cp_impl="p2p")
    tokens = 8192 / 2
    one_hop = 2 * 2 * tokens * LLAMA8B.kv_hidden  # K and V, 2 bytes each
    sent = exchanges(LLAMA8B, lay, tokens, 2.0)
    assert [(e.phase, e.op, e.calls, e.nbytes, e.hidden) for e in sent] == [
        ("forward", "send_recv", 1, one_hop, True), ("backward", "send_recv", 2, one_hop, True)]
    torch_ring = exchanges(LLAMA8B, dataclasses.replace(lay, cp_impl="torch"), tokens, 2.0)
    assert torch_ring[0].nbytes == 2 * one_hop * LLAMA8B.q_hidden / LLAMA8B.kv_hidden  # all-gathered over cp=2


def test_hidden_hops_cost_only_beyond_the_attention_they_overlap():
    cluster = CLUSTERS["dgx-h100"].with_gpus(16)
    lay = Layout(dp=2, tp=8, cp=2, cp_impl="p2p")  # cp spans the two nodes
    group = group_of(lay, cluster.gpus_per_node, ("cp",))
    tokens = 8192 / 2
    hop = comm.send_recv(cluster, group.spans_nodes, 2 * 2 * tokens * LLAMA8B.kv_hidden / 8)
    forward, backward = cp_exchange(LLAMA8B, cluster, group, lay, tokens, 0.0, 0.0, DEFAULT_PARAMS)
    assert forward == pytest.approx(hop) and backward == pytest.approx(2 * hop)  # nothing to hide behind
    assert cp_exchange(LLAMA8B, cluster, group, lay, tokens, hop, 2 * hop, DEFAULT_PARAMS) == (0.0, 0.0)


def test_pipeline_send_recv_hides_by_the_stack_overlap():
    cluster, job = CLUSTERS["dgx-h100"].with_gpus(16), JobSpec(global_batch=128, seq_len=4096)
    lay = Layout(dp=4, pp=4, vpp=10, mbs=1, zero=1, schedule="interleaved-1f1b")
    plain = estimate_step(LLAMA13B, cluster, job, lay)
    overlapped = estimate_step(LLAMA13B, cluster, job, lay, dataclasses.replace(DEFAULT_PARAMS, pp_comm_overlap=0.9))
    assert plain.pp_comm > 0 and overlapped.pp_comm == pytest.approx(0.1 * plain.pp_comm)


def test_fp8_cast_traffic_is_element_wise_bytes_of_the_fp8_layers_only():
    gpu, h = GPUS["h100-sxm"], LLAMA8B.hidden
    tokens = 8192.0
    params = dataclasses.replace(DEFAULT_PARAMS, fp8_cast_passes=16.0)
    base = layer_times(LLAMA8B, gpu, DEFAULT_PARAMS, tokens, 8192, 1, 1, False, "flash", "fp8")
    cast = layer_times(LLAMA8B, gpu, params, tokens, 8192, 1, 1, False, "flash", "fp8")
    # passes are in units of tokens * h * element bytes, forward
    assert cast.elementwise_fwd - base.elementwise_fwd == pytest.approx(
        16.0 * tokens * h * gpu.element_bytes / (gpu.hbm_bandwidth * gpu.memory_efficiency))
    bf16 = layer_times(LLAMA8B, gpu, params, tokens, 8192, 1, 1, False, "flash", "bf16")
    assert bf16 == layer_times(LLAMA8B, gpu, DEFAULT_PARAMS, tokens, 8192, 1, 1, False, "flash", "bf16")


def test_nvfp4_runs_at_the_fp4_peak_and_only_where_there_is_one():
    b200, h100 = GPUS["b200"], GPUS["h100-sxm"]
    m = k = n = 16384.0
    flops = 2 * m * k * n
    eff = DEFAULT_PARAMS.fp8_gemm_efficiency
    expected = (flops + DEFAULT_PARAMS.gemm_half_flops) / (b200.fp4_flops * eff) + b200.kernel_overhead
    assert gemm_time(b200, DEFAULT_PARAMS, m, k, n, "nvfp4") == pytest.approx(expected)
    assert gemm_time(b200, DEFAULT_PARAMS, m, k, n, "nvfp4") < gemm_time(b200, DEFAULT_PARAMS, m, k, n, "fp8")
    job, lay = JobSpec(global_batch=64, seq_len=4096), Layout(dp=8, precision="nvfp4")
    errors = errors_of(validate(LLAMA8B, CLUSTERS["dgx-h100"], job, lay))
    assert errors and "no fp4 tensor cores" in errors[0].message
    assert not errors_of(validate(LLAMA8B, CLUSTERS["dgx-b200"], job, lay))
    assert "runtime-fp8" in {v.rule for v in runtime_violations(LLAMA8B, lay, job)}
    assert "runtime-cp-p2p" in {v.rule for v in runtime_violations(LLAMA8B, Layout(dp=4, cp=2, cp_impl="p2p"), job)}
    assert h100.fp4_flops == 0


NEMO_FP8 = ["plan", "--model", "llama2-13b", "--cluster", "dgx-h100", "--gpus", "16", "--global-batch", "128",
            "--seq-len", "4096", "--layout", "dp=4,pp=4,vpp=10,mbs=1,zero=1,precision=fp8", "--explain"]


def test_nvidias_fp8_recipe_fits_for_megatron_core_and_plait_says_why_its_runtime_would_not(capsys):
    assert main([*NEMO_FP8, "--stack", "megatron-core"]) == 0
    out = capsys.readouterr().out
    assert "OOM" not in out and "pipeline buffers" not in out and "priced for megatron-core" in out
    assert main(NEMO_FP8) == 1  # plait's runtime: torch.distributed.pipelining's buffers do not fit
    out = " ".join(capsys.readouterr().out.split())
    assert "pipeline buffers: plait train builds its schedule on torch.distributed.pipelining" in out
    assert "for every micro-batch (32)" in out


def _mfu(argv, capsys) -> float:
    main([*argv, "--json"])
    import json

    return json.loads(capsys.readouterr().out)[0]["prediction"]["mfu"]


def test_a_cp_layout_without_its_kernel_gets_the_stacks_fastest_not_the_cpu_ring(capsys):
    base = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch", "128",
            "--seq-len", "8192", "--layout"]
    given = _mfu([*base, "dp=4,cp=2,mbs=1,zero=1"], capsys)
    kernels = {impl: _mfu([*base, f"dp=4,cp=2,mbs=1,zero=1,cp_impl={impl}"], capsys)
               for impl in ("ring", "allgather", "torch", "ulysses")}
    assert given >= max(kernels.values()) - 0.05
    assert given > kernels["ring"] + 0.1  # the fp32 reference kernel is not what a GPU layout gets


def test_deepspeed_2021_zero3_at_1536_gpus_and_plaits_own_fsdp2(capsys):
    argv = ["plan", "--model", "gpt3-175b", "--cluster", "dgx-a100", "--gpus", "1536", "--global-batch", "1536",
            "--seq-len", "2048", "--layout", "dp=1536,zero=3,mbs=1,ckpt=full"]
    assert 0.10 <= _mfu([*argv, "--stack", "deepspeed"], capsys) <= 0.14
    assert _mfu([*argv, "--stack", "plait"], capsys) > 0.3


def test_a_plan_for_another_stack_is_not_saved_for_plait_train(tmp_path, capsys):
    path = tmp_path / "plan.json"
    assert main([*NEMO_FP8[:-1], "--stack", "megatron-core", "--save", str(path)]) == 2
    assert "plait train runs plait's own" in capsys.readouterr().err and not path.exists()


def test_megatron_keeps_fp8_linear_inputs_and_one_swiglu_output():
    """Megatron's fused SwiGLU keeps fc1's output and fc2's input (the torch runtime also keeps
    silu(gate)); under fp8 Transformer Engine keeps each linear layer's input as a 1-byte copy."""
    from plait.plan.activations import TE_FP8_SAVED_INPUTS, layer_items

    model, lay = LLAMA8B, Layout(dp=1, tp=2, mbs=1)
    s, h, f, q = 4096, LLAMA8B.hidden, LLAMA8B.ffn_hidden, LLAMA8B.q_hidden
    torch_items = layer_items(model, lay, s, runtime="torch")
    megatron = layer_items(model, lay, s, runtime="megatron")
    assert torch_items["mlp_act_out"] == 2 * 2 * s * f / 2 and megatron["mlp_act_out"] == 2 * s * f / 2
    fp8 = layer_items(model, dataclasses.replace(lay, precision="fp8"), s, runtime="megatron")
    expected_bytes_per_element = {"attn_norm_output": h / 2, "attn_out": q / 2, "mlp_norm_output": h / 2,
                                  "mlp_act_out": f / 2}  # sp: tp=2 shards the replicated items too
    for key in TE_FP8_SAVED_INPUTS:
        assert fp8[key] == pytest.approx(1.0 * s * expected_bytes_per_element[key]), key
    assert {k: v for k, v in fp8.items() if k not in TE_FP8_SAVED_INPUTS} == \
        {k: v for k, v in megatron.items() if k not in TE_FP8_SAVED_INPUTS}
    torch_fp8 = layer_items(model, dataclasses.replace(lay, precision="fp8"), s, runtime="torch")
    assert torch_fp8 == torch_items  # plait's runtime is counted in its own dtype (its memory-truth tests)


def test_the_h100_layouts_megatron_bridge_ran_are_predicted_to_fit():
    """NVIDIA ran these on 80 GB H100s (Megatron-Bridge 25.09-26.06, Llama 3 70B / 3.1 405B, fp8)."""
    from plait.measure.published import SHIPPED_RUNS, predict_row, read_runs

    rows = [r for r in read_runs(SHIPPED_RUNS[1]) if r["id"].startswith("mbridge-") and "-h100-" in r["id"]]
    assert len(rows) >= 6
    for row in rows:
        result = predict_row(row)
        assert result.status == "ok", (row["id"], result.status, result.predicted_mem_gb)
