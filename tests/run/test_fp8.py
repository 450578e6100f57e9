"""precision=fp8 (torchao's Float8Linear in the blocks) and mxfp8 (MXFP8 weights), emulated on
CPU, against fp32 and across ranks.

The tolerance, from fp8 arithmetic (tests/run/fp8_tasks.py computes it):

* Casting to e4m3 (3 mantissa bits, round to nearest) with a power-of-2 scale gives x·(1+δ),
  |δ| ≤ u = 2^-4, for every value above the subnormal range (below max-abs·2^-14: absolute
  error ≤ max-abs·2^-17, negligible here). The emulated GEMM then multiplies the rounded
  operands in fp32: a converted layer computes y_ti = Σ_j x_tj(1+δ_tj)·W_ij(1+ε_ij).
* To first order the loss moves by ΔL = Σ c_k·δ_k over every rounded operand element k, with
  c = x_tj·(g_t·W)_j for an activation and W_ij·(gᵀx)_ij for a weight (g = ∂L/∂y of the fp32
  model). The e5m2 cast of the incoming gradient (u = 2^-3) acts in the backward only: it moves
  the gradients and, through the update, later steps, not this step's loss.
* The worst case, u·Σ|c_k|, is 8.1 for the tiny model: larger than the loss itself, no test.
  As the suite does for fp32 (tests/support/tolerances.py, Higham & Mary 2019), the rounding
  errors are modelled as independent, zero-mean and bounded by u; Hoeffding's inequality then
  gives |ΔL| ≤ λ·u·‖c‖₂ except with probability 2·exp(-λ²/2) ≈ 2.5e-14 (λ = 8).
  For the tiny model's first step: λ·u·‖c‖₂ ≈ 1.15e-2 on a loss of 6.26 (seen: 2.2e-4 with fp8,
  2.6e-4 with mxfp8).
* Later steps start from weights the two runs moved apart: (a model assumption, not a theorem)
  each step adds at most one first-step bound, so step k is within (k+1)·λ·u·‖c‖₂
  (seen with fp8: 6.7e-4 and 1.4e-3 at steps 1 and 2, bounds 2.3e-2 and 3.4e-2; mxfp8 ≤ 5.7e-4).
  Parameters after n AdamW steps differ by at most 2·lr·n whatever the gradients (an update is at
  most lr in either run; seen: 4.8e-3 of 6e-3 after 3 steps), and by more than fp32's own
  bound (tolerances.param_atol), which shows that the fp8 arithmetic ran.
* mxfp8 rounds the same e4m3 elements with one power-of-2 scale per 32 elements (its gradients
  in e4m3 too, backward only): the same bound holds.
* Ranks: the scales are powers of 2, so the fp8 mantissas do not depend on how the batch is
  split; a dp=2 (DDP or FSDP2) or tp=2 run's first step matches the one-process fp8 run (of the same
  micro-batches) to fp32 rounding (tolerances.LOSS_RTOL; seen: 0 for dp, 6e-7 relative for tp's gradient norm). After
  that an fp32-sized difference in the weights can flip an fp8 rounding, and each run is within
  the bound above of fp32, so the two are within twice that.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao is not installed")

torch = pytest.importorskip("torch")

import fp8_tasks  # noqa: E402
import tolerances  # noqa: E402
from torch import nn  # noqa: E402

from plait.run.model import build_model  # noqa: E402
from plait.errors import PlaitError  # noqa: E402
from plait.run.parallel.float8 import (  # noqa: E402
    convert_to_float8,
    converts,
    float8_config,
    has_fp8_gemms,
    import_float8,
    mxfp8_config,
)
from plait.spec.models import get_model  # noqa: E402

STEPS = 3  # runtime_tasks.make_config's default, as the session's fp32 references


@pytest.fixture(scope="module")
def bound():
    return fp8_tasks.fp8_loss_bound()


@pytest.fixture(scope="module")
def fp8_references():
    """Factory: the one-process run in ``precision`` (fp8 or mxfp8), once per module."""
    cache: dict[str, dict] = {}

    def get(precision: str = "fp8", mbs: int = 1) -> dict:
        key = f"dp=1,mbs={mbs},precision={precision}"
        if key not in cache:
            cache[key] = fp8_tasks.one_process(key, steps=STEPS)
        return cache[key]

    return get


def block_linears(spec) -> list[str]:
    names = ["attention.wq", "attention.wk", "attention.wv", "attention.wo", "feed_forward.w1", "feed_forward.w2"]
    names += ["feed_forward.w3"] if spec.arch == "llama" else []
    return sorted(f"layers.{i}.{name}" for i in range(spec.n_layers) for name in names)


@pytest.mark.parametrize("model", ["tiny", "tiny-gpt"])
def test_block_linears_become_float8_and_the_head_stays(model):
    spec = get_model(model)
    net = build_model(spec)
    names_before = set(net.state_dict())
    converted = convert_to_float8(net, torch.device("cpu"), tp=1)
    float8_linear = import_float8().float8_linear.Float8Linear
    assert sorted(converted) == block_linears(spec)
    assert sorted(n for n, m in net.named_modules() if isinstance(m, float8_linear)) == block_linears(spec)
    assert type(net.output) is nn.Linear and type(net.tok_embeddings) is nn.Embedding
    assert set(net.state_dict()) == names_before  # a checkpoint holds the same keys
    assert net.layers["0"].attention.wq.config.emulate  # no fp8 GEMMs on a CPU


def test_mxfp8_wraps_the_block_linear_weights():
    spec = get_model("tiny")
    net = build_model(spec)
    names_before = set(net.state_dict())
    assert sorted(convert_to_float8(net, torch.device("cpu"), tp=1, precision="mxfp8")) == block_linears(spec)
    wrapped = sorted(name.removesuffix(".weight") for name, p in net.named_parameters()
                     if type(p).__name__ == "MXFP8TrainingWeightWrapperTensor")
    assert wrapped == block_linears(spec) and set(net.state_dict()) == names_before
    assert type(net.output.weight) is nn.Parameter


@pytest.mark.parametrize("capability,fp8,mx", [((8, 0), False, False), ((9, 0), True, False), ((10, 0), True, True)])
def test_which_gpus_multiply_in_fp8_and_mxfp8(monkeypatch, capability, fp8, mx):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: f"gpu sm{capability[0]}{capability[1]}")
    cuda = torch.device("cuda", 0)
    assert has_fp8_gemms(cuda) is fp8 and float8_config(cuda).emulate is not fp8
    if mx:
        assert mxfp8_config(cuda).kernel_preference.name == "AUTO"
    else:
        with pytest.raises(PlaitError, match=r"precision=mxfp8 needs MX tensor cores .* use precision=fp8"):
            mxfp8_config(cuda)
    assert mxfp8_config(torch.device("cpu")).kernel_preference.name == "EMULATED"


def test_only_dimensions_that_fp8_gemms_take_are_converted():
    assert converts("layers.0.attention.wk", nn.Linear(128, 48), tp=1)
    assert not converts("layers.0.attention.wk", nn.Linear(128, 48), tp=2)  # 24 columns per rank
    assert not converts("layers.0.attention.wk", nn.Linear(120, 64), tp=1)
    assert not converts("output", nn.Linear(128, 512), tp=1)  # the LM head
    assert not converts("layers.0.attention.wk", nn.Linear(128, 48), tp=1, precision="mxfp8")  # 32-blocks
    assert not converts("layers.1.feed_forward.router", nn.Linear(128, 16), tp=1)  # routing stays high precision


@pytest.mark.parametrize("capability,device,converted", [(None, "cpu", False), ((8, 9), "cuda", False),
                                                          ((9, 0), "cuda", True)])
def test_moe_experts_take_fp8_grouped_gemms_only_where_torchao_runs_them(monkeypatch, capability, device,
                                                                        converted):
    """tiny-moe in fp8: the shared experts become Float8Linear, the router does not; the routed
    experts get torchao's fp8 grouped GEMM on CUDA from compute capability 9.0, and elsewhere stay
    in the compute dtype with one note saying why (naming the kernel)."""
    from plait.run.parallel.float8 import convert_experts, fp8_grouped_mm
    from plait.spec.moe.parts import is_moe_layer

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "a gpu")
    spec = get_model("tiny-moe")
    net = build_model(spec)
    linears = convert_to_float8(net, torch.device(device, 0) if device == "cuda" else torch.device(device), tp=1)
    assert "layers.1.feed_forward.shared.w1" in linears and not any("router" in name for name in linears)
    experts, notes = convert_experts(net, torch.device(device), "fp8")
    moe_layers = [f"layers.{i}.feed_forward.experts" for i in range(spec.n_layers) if is_moe_layer(spec, i)]
    if converted:
        assert experts == moe_layers and notes == []
        assert all(net.get_submodule(name).grouped_mm is fp8_grouped_mm for name in moe_layers)
    else:
        assert experts == [] and len(notes) == 1 and "torch._scaled_grouped_mm" in notes[0]
        assert all(net.get_submodule(name).grouped_mm is None for name in moe_layers)


def test_the_emulated_gemm_multiplies_fp8_rounded_operands():
    torch.manual_seed(0)
    layer = nn.Linear(64, 32, bias=False)
    x = torch.randn(16, 64)
    fp8 = import_float8().float8_linear.Float8Linear.from_float(layer, config=float8_config(torch.device("cpu")))

    def rounded(t):  # e4m3 with the power-of-2 scale under 448 / max-abs
        scale = 2.0 ** torch.floor(torch.log2(448.0 / t.abs().max()))
        return (t * scale).to(torch.float8_e4m3fn).float() / scale

    with torch.no_grad():
        got = fp8(x)
        want = torch.mm(rounded(x), rounded(layer.weight).t())
        exact = layer(x)
    torch.testing.assert_close(got, want, rtol=tolerances.reduction_rtol(64), atol=0.0)
    assert (got - exact).abs().max() > 10 * tolerances.reduction_rtol(64) * exact.abs().max()


@pytest.mark.parametrize("precision", ["fp8", "mxfp8"])
def test_fp8_trains_like_fp32_within_the_rounding_bound(references, bound, fp8_references, precision):
    ref, fp8 = references(), fp8_references(precision)
    assert sorted(fp8["fp8"]) == bound["layers"] == block_linears(get_model("tiny"))
    assert fp8["losses"][0] != ref["losses"][0] or fp8["grad_norms"][0] != ref["grad_norms"][0]
    assert abs(ref["losses"][0] - bound["loss"]) <= tolerances.LOSS_RTOL * bound["loss"]  # the bound's batch
    for step, (got, want) in enumerate(zip(fp8["losses"], ref["losses"], strict=True)):
        allowed = (step + 1) * bound["bound"] + tolerances.LOSS_RTOL * abs(want)
        assert abs(got - want) <= allowed, f"step {step}: fp8 loss {got} vs fp32 {want} (allowed {allowed:.3g})"
    worst = max((fp8["params"][name] - value).abs().max().item() for name, value in ref["params"].items())
    assert tolerances.param_atol(STEPS) < worst <= fp8_tasks.adamw_drift(STEPS)


# tp=2 runs 2 micro-batches of 4 sequences (mbs=4), not 8 of 1 (a tp micro-batch is ~50 gloo collectives),
# against the one-process run of the same micro-batches: a tensor's fp8 scale is its micro-batch's
@pytest.mark.parametrize("layout", ["dp=2", "dp=2,zero=3", "tp=2,mbs=4", "dp=2,zero=3,precision=mxfp8"])
def test_two_ranks_in_fp8_match_one_process_in_fp8(dist_pool, bound, fp8_references, layout):
    precision = "mxfp8" if "mxfp8" in layout else "fp8"
    layout = layout if "precision" in layout else f"{layout},precision=fp8"
    out = dist_pool(2).run(fp8_tasks.train, layout, steps=STEPS, timeout=240)
    got, want = out[0], fp8_references(precision, mbs=4 if "mbs=4" in layout else 1)
    assert all(sorted(rank["fp8"]) == bound["layers"] for rank in out)
    # first step: the same fp8 roundings, summed in another order
    assert abs(got["losses"][0] - want["losses"][0]) <= tolerances.LOSS_RTOL * want["losses"][0]
    assert abs(got["grad_norms"][0] - want["grad_norms"][0]) <= tolerances.LOSS_RTOL * want["grad_norms"][0]
    for step in range(1, STEPS):
        allowed = 2 * (step + 1) * bound["bound"]
        assert abs(got["losses"][step] - want["losses"][step]) <= allowed, f"{layout}: step {step}"


def _stderr_of(script: str) -> str:
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "", done.stdout
    return done.stderr


# torchao's modules that fp8 and mxfp8 import (mxfp8's register more enums with pytree)
TORCHAO_MODULES = ("torchao.float8", "torchao.quantization", "torchao.prototype.moe_training.config",
                   "torchao.quantization.quantize_.common.kernel_preference")


def test_importing_torchao_prints_nothing_on_cpu():
    """Imported as plait imports it (fp8 and mxfp8), torchao's library-load warnings and torch's Enum
    notices for torchao's enums are dropped, and only they: another warning on either logger shows."""
    plain = _stderr_of("; ".join(f"import {module}" for module in TORCHAO_MODULES))
    if "Failed to load" not in plain and "Enum subclass" not in plain:
        pytest.skip("torchao imports quietly on this machine: nothing to filter")
    script = "\n".join([
        "import enum, logging, torch",
        "from plait.run.parallel.float8 import import_float8, mxfp8_config",
        "import_float8()",
        *(f"import {module}" for module in TORCHAO_MODULES),  # torchao's own later imports stay quiet too
        "mxfp8_config(torch.device('cpu'))",
        "logging.getLogger('torchao').warning('Failed to load the weather')",
        "class Mine(enum.Enum):\n    A = 1",
        "logging.getLogger('torch.utils._pytree').warning('%s is an Enum subclass and is now natively supported', Mine)",
    ])
    quiet = _stderr_of(script)
    assert "torchao/_C" not in quiet and "KernelPreference" not in quiet, quiet
    assert "Failed to load the weather" in quiet and "Mine" in quiet  # nothing else is dropped


def test_an_fp8_checkpoint_resumes_exactly_and_in_bf16(dist_pool, tmp_path, bound):
    import checkpoint_tasks
    from plait.run.checkpoint import store

    pool, layout = dist_pool(2), "dp=2,zero=3,precision=fp8"
    full = pool.run(checkpoint_tasks.train, layout, steps=STEPS, with_params=False)[0]
    stopped = pool.run(checkpoint_tasks.train, layout, stop_after=2, steps=STEPS, with_params=False,
                       checkpoint_dir=str(tmp_path))[0]
    checkpoint = str(store.verify(tmp_path / store.final_name(2)).path)
    resumed = pool.run(checkpoint_tasks.train, layout, steps=STEPS, resume_from=checkpoint, with_params=False)[0]
    assert stopped["losses"] == full["losses"][:2] and resumed["losses"] == full["losses"][2:]  # the same kernels
    in_bf16 = pool.run(checkpoint_tasks.train, "dp=2,zero=3", steps=STEPS, resume_from=checkpoint,
                       with_params=False)[0]
    assert in_bf16["steps"] == [2] and in_bf16["summary"]["start_step"] == 2
    # the same weights, forward in fp32 instead of fp8: within the rounding bound (the first step's c)
    assert abs(in_bf16["losses"][0] - full["losses"][2]) <= bound["bound"]
