"""What ``plait train`` runs: the runtime's capabilities as rules with ids (no torch, no hardware).

``runtime_violations(model, layout, job, compile=...)`` lists the rules a layout breaks, as
``Violation`` objects like the planner's (``plait.spec.validate``), with stable ids (``RUNTIME_RULES``).
``compile``: True with ``plait train --compile``; False (``--no-compile``) and None (the default:
compile on CUDA where the compile rules allow it, ``compile_enabled``) refuse nothing for compile.
``async_tp_violations`` holds the rules of ``--async-tp``, which need the device.
``plait plan`` ranks only layouts that break none (``search(..., runnable=True)``);
``plait train`` refuses them before launching (``RunConfig.runtime_problems``, which adds the
checks that need the machine, e.g. the offload directory).
"""

from __future__ import annotations

import functools
import importlib.util
import os

from plait.spec.hf.families import ROPE_TYPES
from plait.spec.layout import FP8_PRECISIONS, JobSpec, Layout
from plait.spec.model import ModelSpec
from plait.spec.validate import Violation, positions_limit_message

# Layout features that the planner models but this runtime does not run yet.
NOT_RUN_YET = {
    "cp": "context parallelism with pipeline parallelism (cp > 1 with pp > 1)",
    "opt_offload": "optimizer offload (opt_offload=1)",
}

# the attention kernels that take soft-capped scores and sinks (Layout.attn; plait.run.modules.flex)
SCORE_MOD_KERNELS = ("flex", "eager")
FP8_ALIGNMENT = 16  # torch._scaled_mm / _scaled_grouped_mm: both dimensions of an fp8 operand multiples of 16
# torch._grouped_mm's own CUDA kernels: compute capability 9.0 and 10.0 (Hopper, Blackwell: these GPU
# generations); elsewhere torch falls back to copying the offsets to the host (a sync) and one mm per
# group, so plait's runtime takes its own per-expert loop there (plait.run.modules.experts.use_grouped_mm)
GROUPED_MM_MIN_CAPABILITY = (9, 0)
GROUPED_MM_GENERATIONS = ("h100", "b200")
GROUPED_MM_ALIGN_BYTES = 16  # and every stride but the last of each operand a multiple of 16 bytes


def plait_grouped_experts(model: ModelSpec, lay: Layout, gpu) -> bool:
    """Whether plait's runtime runs the routed experts of ``model`` under ``lay`` as grouped GEMMs on
    ``gpu`` (a ``GpuSpec``): bf16 compute (``element_bytes`` 2: not a CPU), a GPU generation in
    ``GROUPED_MM_GENERATIONS``, and bf16 rows of the hidden width and of the expert ffn / etp that are
    multiples of ``GROUPED_MM_ALIGN_BYTES``; else one GEMM per local expert. The runtime asks the same of
    the device and the tensors (``plait.run.modules.experts.use_grouped_mm``)."""
    from plait.spec.hardware import GPU_GENERATIONS

    generation = next((g for g, names in GPU_GENERATIONS.items() if gpu.name in names), None)
    if gpu.element_bytes > 2 or generation not in GROUPED_MM_GENERATIONS:
        return False
    widths = (model.hidden, model.moe.expert_ffn // lay.etp)
    return all(2 * width % GROUPED_MM_ALIGN_BYTES == 0 for width in widths)


def routed_expert_precision(model: ModelSpec, lay: Layout, runtime: str = "torch") -> str:
    """The precision the routed experts of ``model`` compute in under ``lay``: the layout's, except in
    plait's runtime (``runtime`` "torch"), whose experts take torchao's fp8 grouped GEMM only under
    precision=fp8 and with the hidden width and the expert ffn / etp multiples of ``FP8_ALIGNMENT``,
    and otherwise stay bf16 (``plait.run.parallel.float8.experts_fp8_blocker``; the planner prices
    them so)."""
    if runtime != "torch" or lay.precision not in FP8_PRECISIONS:
        return lay.precision
    ffn = model.moe.expert_ffn // lay.etp
    aligned = model.hidden % FP8_ALIGNMENT == 0 and ffn % FP8_ALIGNMENT == 0
    return "fp8" if lay.precision == "fp8" and aligned else "bf16"


RUNTIME_RULES = (
    "runtime-cp-with-pp", "runtime-cp-p2p", "runtime-split-ends", "runtime-cp-dropout", "runtime-compile-cp", "runtime-compile-offload",
    "runtime-opt-offload", "runtime-compile-tp-ckpt", "runtime-fp8", "runtime-mxfp8-tp", "runtime-tied-embeddings-pp",
    "runtime-seq-len", "runtime-compile-zero-bubble", "runtime-async-tp-device", "runtime-async-tp-compile",
    "runtime-async-tp-sp", "runtime-attn-softcap",
    "runtime-cp-attention-options", "runtime-logit-softcap-loss", "runtime-moe",
    "runtime-doc-mask-cp-torch",
)
# rope_scaling types plait.run.modules.layers applies besides plain RoPE: every type a ModelSpec takes
RUNTIME_ROPE_SCALINGS = tuple(kind for kind in ROPE_TYPES if kind != "default")


def _layout_rules(model: ModelSpec, lay: Layout, job: JobSpec) -> list[tuple[str, str]]:
    """(rule id, message) of the rules that hold with or without ``--compile``."""
    out = []
    if lay.cp > 1 and lay.pp > 1:
        out.append(("runtime-cp-with-pp", f"{NOT_RUN_YET['cp']} is planned but not run yet; use pp=1 or cp=1"))
    if lay.cp > 1 and lay.cp_impl == "p2p":
        out.append(("runtime-cp-p2p", "cp_impl=p2p is Transformer Engine's ring (Megatron-Core), planned but not run by "
                    "plait train; use cp_impl=torch (PyTorch's ring of fused kernels)"))
    if lay.split == "ends" and lay.pp > 1:
        out.append(("runtime-split-ends", "split=ends (the embedding and the loss as pipeline layers, Megatron's "
                    "split) is planned but not run by plait train; use split=even or uneven"))
    if lay.cp > 1 and model.dropout:
        out.append(("runtime-cp-dropout", f"cp={lay.cp}: context-parallel attention has no dropout, but model "
                    f"{model.name} uses dropout; use cp=1 or a model without dropout"))
    if lay.opt_offload:
        out.append(("runtime-opt-offload", f"{NOT_RUN_YET['opt_offload']} is planned but not run yet"))
    if lay.precision == "nvfp4":
        out.append(("runtime-fp8", "precision=nvfp4 is planned but not run yet (torchao's NVFP4 training is a "
                    "prototype); use precision=fp8 or mxfp8"))
    elif lay.precision in FP8_PRECISIONS and not torchao_installed():
        out.append(("runtime-fp8", f"precision={lay.precision} trains through torchao's float8 layers, and "
                    "torchao is not installed; install torchao (pip install torchao, or plait[cpu] / plait[gpu]) "
                    "or use precision=bf16"))
    if lay.precision == "mxfp8" and lay.tp > 1:
        out.append(("runtime-mxfp8-tp", f"precision=mxfp8 with tp={lay.tp}: torchao's MXFP8 weights lose their "
                    "fp8 wrapper when tensor parallelism shards them (the layers would run in bf16); use "
                    "precision=fp8 or tp=1"))
    if lay.pp > 1 and model.tied_embeddings:
        out.append(("runtime-tied-embeddings-pp", f"model {model.name} ties its embeddings, which needs the first "
                    "and last pipeline stage on one GPU; use pp=1"))
    if job.doc_len and lay.cp > 1 and lay.cp_impl == "torch":
        out.append(("runtime-doc-mask-cp-torch", "document masks (--doc-mask) with cp_impl=torch: PyTorch's ring "
                    "attention takes no mask; use cp_impl=ring, allgather or ulysses"))
    if model.learned_positions and job.seq_len > model.max_seq_len:  # RoPE runs past it (a warning, not a rule)
        out.append(("runtime-seq-len", positions_limit_message(model, job.seq_len)))
    return out + _model_feature_rules(model, lay) + _moe_rules(model, lay)


def _moe_rules(model: ModelSpec, lay: Layout) -> list[tuple[str, str]]:
    """(rule id, message) of the mixture-of-experts and latent-attention features the planner models
    and the runtime does not run yet. The runtime (``plait.run.modules.moe``, ``.mla``,
    ``plait.run.parallel.expert``) runs models with GQA or multi-head latent attention (MLA,
    DeepSeek-V2/V3) and routed (softmax or bias-balanced sigmoid router, group-limited routing,
    route scale, router bias) and shared experts, SwiGLU or GPT-OSS's clamped SwiGLU, with or without
    expert biases, dropless or with a capacity factor, with ep carved out of dp·cp, etp 1 or tp, cp > 1
    and fp8 (the experts' grouped GEMMs in fp8 through torchao's ``moe_training``; the rule names it
    when it is missing), every ``moe_overlap`` (``plait.run.parallel.expert_overlap``; with etp > 1 only
    at ep = 1, where it runs as none); refused: etp > 1 with expert biases (the biases are not split over etp), mxfp8 with MoE (torchao's MXFP8 grouped GEMM
    is not wired), and ep not dividing dp·cp."""
    if (model.moe is None and model.mla is None and lay.ep == 1 and lay.etp == 1
            and lay.moe_overlap == "none"):  # a dense model and layout: asked for every plan of a search
        return []
    moe = model.moe
    parts: list[str] = []  # model features refused on every layout (none left: GPT-OSS's biases and clamped SwiGLU run)
    keys: list[str] = []
    if lay.etp not in (1, lay.tp):
        keys.append(f"etp={lay.etp} other than 1 or tp={lay.tp} (the runtime's etp ranks are the tp ranks)")
    if lay.etp > 1 and lay.ep > 1 and [d for d in lay.order.split("-") if d in ("tp", "cp", "dp")][0] != "tp":
        keys.append(f"etp={lay.etp} with ep={lay.ep} and order={lay.order} (the expert mesh needs tp innermost "
                    "of tp, cp and dp)")
    if lay.etp > 1 and lay.ep > 1 and lay.moe_overlap != "none":
        keys.append(f"moe_overlap={lay.moe_overlap} with etp={lay.etp} and ep={lay.ep} (the etp exchange wraps the "
                    "plain all-to-all; use moe_overlap=none or etp=1)")
    if lay.etp > 1 and moe is not None and moe.expert_bias:
        keys.append(f"etp={lay.etp} with expert biases (model {model.name}: the biases are not split over etp; "
                    "use etp=1)")
    if moe is not None and lay.precision == "mxfp8":
        keys.append("precision=mxfp8 with an MoE model (torchao's MXFP8 grouped GEMM is not wired; use precision=fp8)")
    if moe is not None and lay.precision == "fp8" and torchao_installed() and not torchao_grouped_fp8():
        keys.append("precision=fp8 with an MoE model, and this torchao has no fp8 grouped GEMM "
                    "(torchao.prototype.moe_training: _to_fp8_rowwise_then_scaled_grouped_mm); upgrade torchao")
    if moe is not None and (lay.dp * lay.cp) % lay.ep:
        keys.append(f"ep={lay.ep} not dividing dp·cp = {lay.dp * lay.cp} (the runtime carves ep out of dp·cp)")
    if moe is None and lay.ep > 1:
        keys.append(f"ep={lay.ep} for a dense model")
    if not parts and not keys:
        return []
    what = f"model {model.name} has {', '.join(parts)}" if parts else f"layout sets {', '.join(keys)}"
    return [("runtime-moe", f"{what}: planned but not run by plait train yet; plait train runs MoE models "
             "(GQA or MLA attention) with SwiGLU or clamped SwiGLU experts, ep dividing dp·cp, etp=1 or tp, "
             "bf16 or fp8 (plait plan --any-runtime ranks the rest)")]


def _model_feature_rules(model: ModelSpec, lay: Layout) -> list[tuple[str, str]]:
    """(rule id, message) of the Hugging Face model features the runtime runs only on some layouts."""
    out = []
    fused_only = [name for name, value in (("soft-caps its attention scores", model.attn_softcap),
                                           ("has attention sinks", model.sinks)) if value]
    if fused_only and lay.cp == 1 and lay.attn not in SCORE_MOD_KERNELS:
        out.append(("runtime-attn-softcap", f"model {model.name} {' and '.join(fused_only)}, which attn={lay.attn} "
                    f"(FlashAttention through SDPA) does not take; use attn=flex (FlexAttention) or attn=eager"))
    options = [name for name, value in (("sliding_window", model.sliding_window), ("attn_scale", model.attn_scale),
                                        ("attn_softcap", model.attn_softcap), ("sinks", model.sinks),
                                        ("mla (its score scale)", model.mla)) if value]
    if options and lay.cp > 1 and lay.cp_impl == "torch":
        out.append(("runtime-cp-attention-options", f"model {model.name} sets {', '.join(options)}, which PyTorch's "
                    "ring attention (cp_impl=torch) does not take; use cp_impl=ring, allgather or ulysses"))
    if model.logit_softcap and lay.loss == "fused":
        out.append(("runtime-logit-softcap-loss", f"model {model.name} soft-caps its logits, which the fused "
                    "(chunked) loss does not; use loss=unfused"))
    return out


@functools.lru_cache(maxsize=1)
def torchao_grouped_fp8() -> bool:
    """Whether the installed torchao has the fp8 grouped GEMM of MoE training
    (``torchao/prototype/moe_training/fp8_grouped_mm.py``); found without importing torchao."""
    spec = importlib.util.find_spec("torchao")
    folders = spec.submodule_search_locations if spec is not None else None
    return any(os.path.exists(os.path.join(folder, "prototype", "moe_training", "fp8_grouped_mm.py"))
               for folder in folders or ())


@functools.lru_cache(maxsize=1)
def torchao_installed() -> bool:
    """Whether torchao (fp8 training, ``plait.run.parallel.float8``) is installed here; found
    without importing it (importing torchao imports torch)."""
    return importlib.util.find_spec("torchao") is not None


def _compile_rules(lay: Layout) -> list[tuple[str, str]]:
    """(rule id, message) of the rules of ``plait train --compile`` (per-block torch.compile)."""
    out = []
    if lay.cp > 1:
        out.append(("runtime-compile-cp", "--compile with cp > 1: ring attention's send/recv are not compiled; "
                    "run without --compile"))
    if lay.offload:
        out.append(("runtime-compile-offload", "--compile with activation offload: saved-tensor hooks are not "
                    "compiled; run without --compile or use offload=0"))
    if lay.tp > 1 and lay.ckpt in ("selective", "balanced", "mlp"):
        out.append(("runtime-compile-tp-ckpt", f"--compile with tp > 1 and ckpt={lay.ckpt}: torch 2.13 cannot "
                    "compile a checkpoint inside a DTensor tensor-parallel block; use ckpt=full or none, or "
                    "run without --compile"))
    if lay.pp > 1 and lay.schedule == "zero-bubble":
        out.append(("runtime-compile-zero-bubble", "schedule zero-bubble with --compile is not supported by "
                    "torch.distributed.pipelining"))
    return out


def runtime_violations(model: ModelSpec, layout: Layout, job: JobSpec, *,
                       compile: bool | None = False) -> list[Violation]:
    """Every runtime rule ``layout`` breaks for ``job`` (empty: ``plait train`` runs it), in
    ``RUNTIME_RULES`` order; ``compile``: True with ``plait train --compile`` (None, the automatic
    default, and False refuse nothing: auto compiles only layouts that break no compile rule)."""
    found = dict(_layout_rules(model, layout, job) + (_compile_rules(layout) if compile is True else []))
    return [Violation(rule, found[rule]) for rule in RUNTIME_RULES if rule in found]


# rules that only the model and the job decide: broken by one layout, broken by all (with MoE the
# rule names the model's features on the plainest layout, its layout keys elsewhere)
MODEL_RULES = ("runtime-seq-len", "runtime-moe")


def model_blockers(model: ModelSpec, job: JobSpec) -> list[Violation]:
    """The runtime rules that every layout of ``model`` for ``job`` breaks: those of ``MODEL_RULES``
    the plainest layout (one GPU, bf16, no expert or context parallelism) already breaks. Non-empty:
    ``plait train`` runs no layout of it, and a search for runnable layouts can say so at once."""
    return [v for v in runtime_violations(model, Layout(), job) if v.rule in MODEL_RULES]


def compile_enabled(compile: bool | None, device_type: str, layout: Layout) -> bool:
    """Whether blocks are compiled: ``compile`` when given (``--compile`` / ``--no-compile``); None
    (auto): on a CUDA device when ``layout`` breaks no compile rule, off elsewhere (on CPU the
    compile time dominates the small runs it can do)."""
    if compile is not None:
        return compile
    return device_type == "cuda" and not _compile_rules(layout)


def async_tp_violations(layout: Layout, *, device: str, compile: bool | None, backend: str) -> list[Violation]:
    """The rules of ``--async-tp`` (inductor's micro-pipelined TP) for ``device`` (auto, cpu, cuda;
    a resolved device type in the worker): CUDA with NCCL, compiled blocks with inductor, tp > 1 with
    sequence parallelism (the all-gather / reduce-scatter it overlaps with the GEMMs)."""
    out = []
    if device not in ("cuda", "auto"):
        out.append(("runtime-async-tp-device", f"--async-tp needs CUDA GPUs with NCCL (symmetric memory); "
                    f"device {device} (gloo) has none: run without --async-tp"))
    if compile is False or backend != "inductor":
        out.append(("runtime-async-tp-compile", "--async-tp is a pass of inductor: it needs compiled blocks "
                    "(--compile, or the default on GPU) with --compile-backend inductor"))
    if layout.tp == 1 or not layout.sequence_parallel:
        out.append(("runtime-async-tp-sp", f"--async-tp overlaps sequence parallelism's collectives with the "
                    f"GEMMs: it needs tp > 1 with sp=1 (layout {layout}); run without --async-tp"))
    return [Violation(rule, message) for rule, message in out]
