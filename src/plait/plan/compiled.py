"""The element-wise work of a block under torch.compile (inductor), counted from the model's shapes. Seconds.

Inductor leaves the GEMMs and the attention kernel (SDPA / FlashAttention) as they are and fuses the
element-wise work between them into one kernel per region: a region reads each of its inputs once
and writes each of its outputs once, whatever ops (norm statistics in fp32, the RoPE rotation, the
activation, the residual add, the dtype casts) it chains in registers. What a compiled block moves is
therefore what those regions cannot avoid, in elements of the compute dtype per token
(``compiled_counts``; h = hidden, q = n_heads·head_dim, kv = n_kv_heads·head_dim, f = the MLP's width):

  forward, pre-norm block (Llama, GPT):
    norm 1           read x, write the normed x                                        2h
    add + norm 2     read x and the attention output, write the sum and its norm       4h
    add              read the sum and the MLP output, write the block's output         3h
                     (one ``torch.compile`` per block: the next block's norm is another graph)
    RoPE             read q and k, write them rotated (at their own head counts)       2(q + kv)
                     (Q/K norms: in the same region; GPT's learned positions: none in the block)
    activation       SwiGLU: read gate and up, write the product                       3f
                     GELU (not gated): read, write                                     2f
  backward:
    each norm        read its input and its output's gradient, write its input's
                     gradient (3h), and its weight gradient - a reduction over the
                     tokens, another kernel - reads both again (2h)                    5h
    residual sums    the gradient of each residual branch added in a norm's region     1h each, 2
    RoPE             read the rotated gradients, write the unrotated ones              2(q + kv)
                     (Q/K norms: their input and the weight gradient's reads, 3(q + kv) more)
    activation       SwiGLU: read the gradient, gate and up, write both gradients      5f
                     GELU: read the gradient and the input, write the gradient         3f

A Llama block: forward 9h + 2(q + kv) + 3f, backward 12h + 2(q + kv) + 5f; Llama 3 8B (h 4096, q 4096,
kv 1024, f 14336): 22 and 32 passes of s·b·h elements, against the eager default's 45 and 90
(``CostParams.elementwise_passes``). Post-norm blocks (OLMo-2) norm each sub-block's output in the
region of its residual add: 3h + 3h forward. Sandwich norms (Gemma 2) add the post-norms to those
regions (9h forward, as pre-norm) and two norms' backward (5h each). ``norm=unfused`` compiles to the
same regions (inductor fuses the fp32 chain). Kernels: one per region (``COMPILED_REGIONS``).

Left as eager prices them: an MoE layer's dispatch permutes and router softmax (data-dependent
gathers around the dropless dispatch; ``plait.plan.moe.timing``), the attention kernel itself, and
``attn=eager``'s score traffic. Float8 (torchao, tensorwise): compile fuses each linear input's amax
into the region that produces it and its cast into the next kernel; what remains is priced inside
``CostParams.fp8_gemm_efficiency``, chosen on torchtitan's float8 runs, which all ran compiled, so
``fp8_cast_passes`` (0 for every PyTorch stack) is left as it is.

Who compiles (``compiled_share``, ``with_compile``): ``CostParams.compiled_blocks`` is the share of the
blocks compiled; with ``CostParams.compile_rules`` (plait's runtime) a layout that breaks a rule of
``plait train --compile`` (``plait.spec.capabilities.compile_enabled``) runs eager.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from plait.errors import PlaitError
from plait.plan.params import CostParams
from plait.spec.capabilities import compile_enabled
from plait.spec.hardware import GpuSpec
from plait.spec.layout import Layout
from plait.spec.model import ModelSpec
from plait.spec.moe.parts import moe_layer_count

# h-wide tensors the forward's norm and residual regions read and write, by norm position
FORWARD_MODEL_WIDTH = {"pre": 9.0, "post": 6.0, "sandwich": 9.0}
NORMS = {"pre": 2, "post": 2, "sandwich": 4}  # norms per block (the Q/K norms aside)
NORM_BACKWARD = 5.0  # h-wide reads and writes of one norm's backward, its weight gradient's included
RESIDUAL_SUMS = 2.0  # the two residual branches' gradients, summed in a norm's backward region
# (forward, backward) regions, i.e. kernels, of a block: the norm/add regions, RoPE, the activation
COMPILED_REGIONS = {"pre": (3, 4), "post": (2, 4), "sandwich": (3, 8)}


@dataclass(frozen=True)
class CompiledCounts:
    """Elements per token a compiled block's regions move (module docstring), as multiples of the
    widths they scale with: ``*_model`` of h (on the sequence-parallel shard), ``*_heads`` of q + kv
    and ``*_act`` of the MLP's width (both split by tensor parallelism); and the regions (kernels)."""

    fwd_model: float
    bwd_model: float
    fwd_heads: float
    bwd_heads: float
    fwd_act: float
    bwd_act: float
    fwd_regions: int
    bwd_regions: int

    def passes(self, model: ModelSpec) -> tuple[float, float]:
        """(forward, backward) in units of s·b·h elements, the units of ``CostParams.elementwise_passes``
        (no tensor parallelism)."""
        h, heads, f = model.hidden, model.q_hidden + model.kv_hidden, model.ffn_hidden
        return ((self.fwd_model * h + self.fwd_heads * heads + self.fwd_act * f) / h,
                (self.bwd_model * h + self.bwd_heads * heads + self.bwd_act * f) / h)


def compiled_counts(model: ModelSpec) -> CompiledCounts:
    """The regions' reads and writes of one block of ``model`` (module docstring's table)."""
    position = model.norm_position
    rope = not model.learned_positions
    qk_norm = model.qk_norm != "none"
    heads_region = rope or qk_norm
    fwd_regions, bwd_regions = COMPILED_REGIONS[position]
    return CompiledCounts(
        fwd_model=FORWARD_MODEL_WIDTH[position],
        bwd_model=NORM_BACKWARD * NORMS[position] + RESIDUAL_SUMS,
        fwd_heads=2.0 if heads_region else 0.0,
        bwd_heads=(2.0 if heads_region else 0.0) + (3.0 if qk_norm else 0.0),
        fwd_act=3.0 if model.gated else 2.0,
        bwd_act=5.0 if model.gated else 3.0,
        fwd_regions=fwd_regions + int(heads_region) + 1,
        bwd_regions=bwd_regions + int(heads_region) + 1,
    )


def compiled_elementwise(model: ModelSpec, gpu: GpuSpec, tokens: float, tp: int, rep: int,
                         act_elements: float) -> tuple[float, float, float]:
    """(forward, backward, the MLP half's forward) seconds of one compiled block's element-wise
    regions for ``tokens`` on this rank: h-wide tensors on the sequence-parallel shard (``rep`` = tp
    with sequence parallelism, else 1), q + kv wide split by ``tp``, and ``act_elements`` elements of
    the MLP's width (tokens · f / tp for a dense MLP; an MoE layer's routed and shared experts'). The
    MLP half (``ckpt=mlp``'s recompute) is its norm (2h) and its activation."""
    counts = compiled_counts(model)
    e, h = gpu.element_bytes, model.hidden
    heads = tokens * (model.q_hidden + model.kv_hidden) / tp
    bandwidth = gpu.hbm_bandwidth * gpu.memory_efficiency

    def seconds(model_width: float, head_width: float, act: float, regions: int) -> float:
        moved = e * (model_width * tokens * h / rep + head_width * heads + act * act_elements)
        return moved / bandwidth + regions * gpu.kernel_overhead

    forward = seconds(counts.fwd_model, counts.fwd_heads, counts.fwd_act, counts.fwd_regions)
    backward = seconds(counts.bwd_model, counts.bwd_heads, counts.bwd_act, counts.bwd_regions)
    mlp = seconds(2.0, 0.0, counts.fwd_act, 2)
    return forward, backward, min(forward, mlp)


def blend(eager: tuple[float, ...], compiled: tuple[float, ...], share: float) -> tuple[float, ...]:
    """Seconds of a mean layer whose blocks are ``share`` compiled: each of ``compiled`` weighted by
    ``share``, each of ``eager`` by the rest."""
    return tuple((1 - share) * slow + share * fast for slow, fast in zip(eager, compiled))


def compiled_share(params: CostParams, model: ModelSpec, layout: Layout) -> float:
    """The share of ``layout``'s blocks priced compiled: ``params.compiled_blocks``; with
    ``params.compile_rules`` (plait's runtime) 0 when the layout breaks a rule of ``plait train
    --compile``, and only the dense blocks of an MoE model (its MoE blocks stay eager: the dispatch
    reads the per-expert row counts on the host, ``plait.run.parallel.compile``). The planner prices
    the mean layer, so an MoE model's share mixes the mean layer's compiled and eager work."""
    if not params.compiled_blocks:
        return 0.0
    if not params.compile_rules:
        return params.compiled_blocks
    if not compile_enabled(None, "cuda", layout):
        return 0.0
    return params.compiled_blocks * (1.0 - moe_layer_count(model) / model.n_layers)


def with_compile(params: CostParams, stack, compile: bool | None, device_type: str) -> CostParams:
    """``params`` with ``compiled_blocks`` as a compile setting decides, the one setting ``plait plan``,
    ``plait sweep`` and ``plait train`` share: True (``--compile``) 1, False (``--no-compile``) 0, None
    (auto) the software's own choice on a GPU and eager on a CPU (``device_type`` "cpu": a CPU cluster
    or profile). ``stack``: a ``plait.spec.stack.Stack``, or None for plait's runtime.

    plait's runtime (``plait train``): auto compiles on CUDA (``compile_enabled``), and a layout that
    breaks a compile rule runs eager (``compile_rules`` = 1, whatever the setting). Another stack keeps
    its own ``compiled_blocks`` under auto (torchtitan: 0, its default) and must declare it to take
    True: software that runs no torch.compile (Megatron, llm-foundry, DeepSpeed) cannot be asked to."""
    if stack is None or stack.is_plait:
        compiled = compile if compile is not None else device_type != "cpu"
        return dataclasses.replace(params, compiled_blocks=float(compiled), compile_rules=1.0)
    if compile is None:
        return params if device_type != "cpu" else dataclasses.replace(params, compiled_blocks=0.0)
    if compile and "compiled_blocks" not in stack.params:
        raise PlaitError(f"--compile: the {stack.name} stack runs no torch.compile (its own fused kernels are "
                         "priced by its stack numbers); use --stack plait or torchtitan, or leave --compile out")
    return dataclasses.replace(params, compiled_blocks=1.0 if compile else 0.0)
