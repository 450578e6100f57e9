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
    megatron = layer_items(model, lay, s, runtime="megatron-core")
    assert torch_items["mlp_act_out"] == 2 * 2 * s * f / 2 and megatron["mlp_act_out"] == 2 * s * f / 2
    fp8 = layer_items(model, dataclasses.replace(lay, precision="fp8"), s, runtime="megatron-core")
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
    from plait.measure.validate.runs import SHIPPED_RUNS, predict_row, read_runs

    rows = [r for r in read_runs(SHIPPED_RUNS[1]) if r["id"].startswith("mbridge-") and "-h100-" in r["id"]]
    assert len(rows) >= 6
    for row in rows:
        result = predict_row(row)
        assert result.status == "ok", (row["id"], result.status, result.predicted_mem_gb)


def test_split_ends_counts_the_embedding_and_the_loss_as_pipeline_layers():
    """Megatron's account_for_embedding/loss_in_pipeline_split: Llama 3.1 405B's 126 layers + 2 on
    pp·vpp = 128 virtual stages (one layer each; the first holds only the embedding, the last only
    the loss), or 64 (two each)."""
    from plait.spec.validate import rank_layers, stage_layer_counts, stage_layers

    model = MODELS["llama3-405b"]
    job = JobSpec(global_batch=1536, seq_len=8192)
    lay = Layout(dp=4, tp=4, pp=16, vpp=8, mbs=1, zero=1, split="ends", schedule="interleaved-1f1b")
    counts = stage_layer_counts(model, lay)
    assert len(counts) == 128 and counts[0] == counts[-1] == 0 and set(counts[1:-1]) == {1}
    assert sum(counts) == model.n_layers and stage_layers(model, lay) == 1
    assert [rank_layers(model, lay, r) for r in (0, 1, 15)] == [7, 8, 7]
    cluster = CLUSTERS["gb200-nvl72"].with_gpus(256)
    assert not errors_of(validate(model, cluster, job, lay))
    assert "runtime-split-ends" in {v.rule for v in runtime_violations(model, lay, job)}
    wrong = dataclasses.replace(lay, vpp=5)  # 80 does not divide 128
    assert "pp-divides-layers" in {v.rule for v in errors_of(validate(model, cluster, job, wrong))}
    # the first rank holds a layer fewer than with an uneven split of the same stages, so less memory
    from plait.plan.memory import rank_memory

    uneven = dataclasses.replace(lay, vpp=4, split="uneven")
    ends = dataclasses.replace(lay, vpp=4)
    assert rank_memory(model, cluster, job, ends, 0).activations < rank_memory(model, cluster, job, uneven, 0).activations


@pytest.mark.parametrize("stack", ["plait", "megatron-core", "megatron-lm", "torchtitan", "llm-foundry", "deepspeed"])
def test_every_stack_prices_a_gpu_cp_layout_with_its_own_kernel_never_the_cpu_ring(stack, capsys):
    from plait.spec.stack import get_stack

    argv = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch", "128",
            "--seq-len", "8192", "--layout", "dp=4,cp=2,mbs=1,zero=1", "--stack", stack, "--json"]
    main(argv)
    import json

    layout = json.loads(capsys.readouterr().out)[0]["layout_string"]
    kernel = Layout.parse(layout).cp_impl
    assert kernel in get_stack(stack).cp_impls and kernel != "ring", layout


def test_a_cpu_profile_gets_the_exact_ring(tmp_path, capsys):
    import json

    calibration = tmp_path / "cpu.json"
    calibration.write_text(json.dumps({"format": "plait-calibration/1", "device": "cpu", "params": {},
                                       "gpu_overrides": {"element_bytes": 4.0}}), encoding="utf-8")
    main(["plan", "--model", "tiny", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch", "8", "--seq-len",
          "512", "--layout", "dp=4,cp=2,mbs=1", "--calibration", str(calibration), "--json"])
    assert Layout.parse(json.loads(capsys.readouterr().out)[0]["layout_string"]).cp_impl == "ring"
    main(["plan", "--model", "tiny", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch", "8", "--seq-len",
          "512", "--layout", "dp=4,cp=2,mbs=1", "--json"])  # the same without the profile: the GPU's kernel
    assert Layout.parse(json.loads(capsys.readouterr().out)[0]["layout_string"]).cp_impl == "torch"


def test_plan_reads_the_calibration_file_once(tmp_path, capsys, monkeypatch):
    import json

    from plait.plan import calibration as calibration_module

    calibration = tmp_path / "cal.json"
    calibration.write_text(json.dumps({"format": "plait-calibration/1", "params": {},
                                       "gpu_overrides": {"attention_efficiency": 0.3}}), encoding="utf-8")
    reads = []
    real = calibration_module.read_calibration
    monkeypatch.setattr(calibration_module, "read_calibration", lambda path: reads.append(path) or real(path))
    assert main(["plan", "--model", "tiny", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch", "8",
                 "--seq-len", "512", "--layout", "dp=8", "--stack", "megatron-core", "--calibration",
                 str(calibration), "--json"]) == 0
    assert reads == [str(calibration)]
    capsys.readouterr()


def test_transformer_engines_memory_is_megatron_cores_only():
    from plait.plan.activations import layer_items

    fp8 = Layout(dp=1, tp=2, mbs=1, precision="fp8")
    core = layer_items(LLAMA8B, fp8, 4096, runtime="megatron-core")
    old = layer_items(LLAMA8B, fp8, 4096, runtime="megatron")  # Megatron-LM 2021-22, deepspeed
    assert sum(core.values()) < sum(old.values())
    assert old == layer_items(LLAMA8B, dataclasses.replace(fp8, precision="bf16"), 4096, runtime="megatron")


def test_send_recv_hides_only_in_the_interleaved_schedule():
    cluster, job = CLUSTERS["dgx-h100"].with_gpus(16), JobSpec(global_batch=128, seq_len=4096)
    params = dataclasses.replace(DEFAULT_PARAMS, pp_comm_overlap=0.9)
    one_f_one_b = Layout(dp=4, pp=4, mbs=1, zero=1)
    assert estimate_step(LLAMA13B, cluster, job, one_f_one_b, params).pp_comm == \
        estimate_step(LLAMA13B, cluster, job, one_f_one_b).pp_comm


def test_validate_keeps_what_a_calibration_measured():
    from plait.measure.validate.runs import SHIPPED_RUNS, read_runs
    from plait.measure.validate.specs import row_specs

    row = next(r for r in read_runs(SHIPPED_RUNS[1]) if r["id"] == "mbridge-2602-h100-llama3-70b-fp8")
    measured = dataclasses.replace(DEFAULT_PARAMS, tp_comm_overlap=0.3)
    assert row_specs(row, [], measured).params.tp_comm_overlap == 0.3
    assert row_specs(row, []).params.tp_comm_overlap == 0.8  # the megatron-core stack's


def test_no_plait_train_marks_on_another_stacks_plan(capsys):
    main([*NEMO_FP8[:-2], "dp=4,pp=4,vpp=10,mbs=1,zero=1,precision=fp8,split=ends", "--stack", "megatron-core"])
    out = capsys.readouterr().out
    assert "*" not in out.split("How sure")[0] and "plait train does not run" not in out


def test_the_table_says_why_a_slower_layout_ranks_first():
    from plait.cli.support.tables import why_first as _why_first
    from plait.plan.search import search

    result = search(LLAMA13B, CLUSTERS["dgx-a100"].with_gpus(64), JobSpec(global_batch=1024, seq_len=2048))
    top = result.plans[:5]
    fastest = max(top, key=lambda p: p.step.tokens_per_s_per_gpu)
    line = _why_first(top, 0.05)
    if fastest is top[0]:
        assert line == ""
    else:  # the roomiest within 1% of the fastest leads: the line gives its cost and the memory it frees
        slower = 100 * (1 - top[0].step.tokens_per_s_per_gpu / fastest.step.tokens_per_s_per_gpu)
        assert 0 < slower <= 1.0 and f"{slower:.1f}% slower" in line and "GiB more free memory" in line
    assert _why_first(top[:1], 0.05) == ""


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_forward_tp_comm_hides_all_chunks_but_the_first(tp):
    """The megatron-core stack's forward all-gathers and reduce-scatters run in tp chunks pipelined with
    their GEMMs (userbuffers): 1/tp of them stays exposed, whatever tp_forward_overlap above 1 - 1/tp
    says; the backward hides by tp_comm_overlap; the default (plait's runtime) exposes the forward."""
    from plait.plan.params import params_for_stack
    from plait.plan.terms.tensor import tp_layer
    from plait.spec.stack import get_stack
    cluster = CLUSTERS["dgx-h100"]
    lay = Layout(dp=8 // tp, tp=tp, sp=True)
    group = group_of(lay, cluster.gpus_per_node, ("tp",))
    act_bytes = 2.0 * 8192 * LLAMA8B.hidden
    one_way = 2 * comm.all_gather(cluster, group, act_bytes) + 2 * comm.reduce_scatter(cluster, group, act_bytes)
    plain = dataclasses.replace(DEFAULT_PARAMS, tp_comm_overlap=0.5)
    assert tp_layer(cluster, group, lay, act_bytes, plain) == pytest.approx((one_way, one_way + 0.5 * one_way))
    chunked = dataclasses.replace(plain, tp_forward_overlap=1.0)
    assert tp_layer(cluster, group, lay, act_bytes, chunked)[1] == pytest.approx(one_way / tp + 0.5 * one_way)
    stack_params = params_for_stack(get_stack("megatron-core"))
    assert stack_params.tp_forward_overlap == 1.0 and DEFAULT_PARAMS.tp_forward_overlap == 0.0
