"""What ``plait train`` runs: the runtime's capabilities as rules with ids (no torch, no hardware).

``runtime_violations(model, layout, job, compile=...)`` lists the rules a layout breaks, as
``Violation`` objects like the planner's (``plait.spec.validate``), with stable ids (``RUNTIME_RULES``).
``plait plan`` ranks only layouts that break none (``search(..., runnable=True)``);
``plait train`` refuses them before launching (``RunConfig.runtime_problems``, which adds the
checks that need the machine, e.g. the offload directory).
"""

from __future__ import annotations

import functools
import importlib.util

from plait.spec.layout import FP8_PRECISIONS, JobSpec, Layout
from plait.spec.model import ModelSpec
from plait.spec.validate import Violation

# Layout features that the planner models but this runtime does not run yet.
NOT_RUN_YET = {
    "cp": "context parallelism with pipeline parallelism (cp > 1 with pp > 1)",
    "opt_offload": "optimizer offload (opt_offload=1)",
}

RUNTIME_RULES = (
    "runtime-cp-with-pp", "runtime-cp-dropout", "runtime-compile-cp", "runtime-compile-offload",
    "runtime-opt-offload", "runtime-compile-tp", "runtime-fp8", "runtime-mxfp8-tp", "runtime-tied-embeddings-pp",
    "runtime-seq-len", "runtime-compile-zero-bubble",
)


def _layout_rules(model: ModelSpec, lay: Layout, job: JobSpec) -> list[tuple[str, str]]:
    """(rule id, message) of the rules that hold with or without ``--compile``."""
    out = []
    if lay.cp > 1 and lay.pp > 1:
        out.append(("runtime-cp-with-pp", f"{NOT_RUN_YET['cp']} is planned but not run yet; use pp=1 or cp=1"))
    if lay.cp > 1 and model.dropout:
        out.append(("runtime-cp-dropout", f"cp={lay.cp}: context-parallel attention has no dropout, but model "
                    f"{model.name} uses dropout; use cp=1 or a model without dropout"))
    if lay.opt_offload:
        out.append(("runtime-opt-offload", f"{NOT_RUN_YET['opt_offload']} is planned but not run yet"))
    if lay.precision in FP8_PRECISIONS and not torchao_installed():
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
    if job.seq_len > model.max_seq_len:
        out.append(("runtime-seq-len", f"seq_len={job.seq_len} exceeds the model's max_seq_len={model.max_seq_len}"))
    return out


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
    if lay.tp > 1:
        out.append(("runtime-compile-tp", "--compile with tp > 1: per-block torch.compile of DTensor "
                    "tensor-parallel blocks fails in the backward on torch 2.13; run without --compile"))
    if lay.pp > 1 and lay.schedule == "zero-bubble":
        out.append(("runtime-compile-zero-bubble", "schedule zero-bubble with --compile is not supported by "
                    "torch.distributed.pipelining"))
    return out


def runtime_violations(model: ModelSpec, layout: Layout, job: JobSpec, *, compile: bool = False) -> list[Violation]:
    """Every runtime rule ``layout`` breaks for ``job`` (empty: ``plait train`` runs it), in
    ``RUNTIME_RULES`` order; ``compile``: with ``plait train --compile``."""
    found = dict(_layout_rules(model, layout, job) + (_compile_rules(layout) if compile else []))
    return [Violation(rule, found[rule]) for rule in RUNTIME_RULES if rule in found]
