"""Which attention kernel (``Layout.attn``) a searched layout gets: the fastest the runtime runs
the model with. No torch.

plait's runtime runs every model with ``flex`` and ``eager``, and with ``flash``/``sdpa`` those
without soft-capped scores or sinks (``plait.spec.capabilities.SCORE_MOD_KERNELS``, rule
``runtime-attn-softcap``). Of those the planner prices (``plait.plan.kernels.layer_times``) the
one whose attention forward + backward is least for a sequence, ties to the earlier of
``ATTENTION_KERNELS``: flash for a plain causal model, flex where a window's explicit mask would
slow SDPA or where soft-caps or sinks rule flash out; eager, never faster and larger (the s×s
scores), only when pinned (``--fix attn=eager``). The choice reads only the model, the GPU and
the sequence: memory does not tell flash and flex apart (both save the output and its log-sum-exp).
"""

from __future__ import annotations

from functools import lru_cache

from plait.plan.kernels import layer_times
from plait.plan.params import CostParams
from plait.spec.capabilities import SCORE_MOD_KERNELS
from plait.spec.hardware import GpuSpec
from plait.spec.layout import ATTENTION_KERNELS
from plait.spec.model import ModelSpec


def runtime_attention_kernels(model: ModelSpec) -> tuple[str, ...]:
    """The ``attn`` values plait's runtime runs ``model`` with (without context parallelism)."""
    if model.attn_softcap or model.sinks:
        return tuple(kernel for kernel in ATTENTION_KERNELS if kernel in SCORE_MOD_KERNELS)
    return ATTENTION_KERNELS


def runnable_attention(model: ModelSpec, attn: str) -> str:
    """``attn`` when the runtime runs ``model`` with it, else the first fused kernel it runs the
    model with (``flex`` for soft-capped scores or sinks): the kernel of a layout that does not name one."""
    kernels = runtime_attention_kernels(model)
    return attn if attn in kernels else next((k for k in kernels if k != "eager"), "eager")


@lru_cache(maxsize=1024)
def fastest_attention(model: ModelSpec, gpu: GpuSpec, params: CostParams, seq_len: int, doc_len: int = 0) -> str:
    """The fused kernel (not eager) of ``runtime_attention_kernels`` with the least attention time
    for one sequence of ``seq_len`` tokens on one GPU (module docstring)."""
    kernels = [kernel for kernel in runtime_attention_kernels(model) if kernel != "eager"] or ["eager"]

    def seconds(kernel: str) -> float:
        times = layer_times(model, gpu, params, float(seq_len), seq_len, 1, 1, False, kernel, "bf16",
                            doc_len=doc_len)
        return times.attn_fwd + times.attn_bwd

    return min(kernels, key=seconds)
