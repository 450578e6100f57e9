"""``torch.compile`` per transformer block (``fullgraph=True``), with tensor parallelism, and async TP.

Each block is compiled on its own (``Module.compile``, so its TP hooks are traced with it) with
``fullgraph=True``: a graph break inside a block is an error, not a silent fallback to eager; and
``dynamic=False``: every micro-batch has the same shape, so the kernels are specialized to it. The
embedding, final norm and LM head stay eager, and so do MoE blocks (``plait.run.modules.moe``: the
expert dispatch reads per-expert row counts on the host, a graph break). Blocks are compiled after tensor parallelism and
activation checkpointing and before FSDP (``plait.run.parallel.parallelize``).

Tensor parallelism (torch 2.13 and 2.11): the token embedding is row-parallel, and
``RowwiseParallel`` all-reduces (or reduce-scatters, with sp) its output with ``async_op=True``
and hands the first block an ``AsyncCollectiveTensor``. A compiled module fed such a tensor runs
its forward, but the gradient it returns for that input bypasses the DTensor ``to_local()`` that
made it: ``Redistribute.backward`` gets a plain Tensor and fails with ``AttributeError: 'Tensor'
object has no attribute '_local_tensor'`` (repro in docs/runtime.md, "torch.compile"). The workaround:
a forward hook on the embedding turns an ``AsyncCollectiveTensor`` output into a plain tensor
(``clone``: one copy of the embedding output, batch × seq × hidden elements per micro-batch,
outside the compiled blocks). Blocks fed by another block or a pipeline receive plain tensors.

Async TP (``RuntimeConfig.async_tp``, CUDA with NCCL only): inductor's micro-pipeline pass
(``torch._inductor.config._micro_pipeline_tp``) splits the sequence-parallel all-gather /
reduce-scatter around the GEMMs into chunks that overlap, over symmetric memory on the tp group.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
from torch.distributed.device_mesh import DeviceMesh

from plait.run.modules.moe import MoEFeedForward


def _plain_output(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor | None:
    """Forward hook: an ``AsyncCollectiveTensor`` output as a plain tensor (see the module docstring)."""
    if isinstance(output, AsyncCollectiveTensor):
        return output.clone()
    return None


def compile_blocks(chunks: list[nn.Module], backend: str, tensor_parallel: bool) -> None:
    """``torch.compile(fullgraph=True)`` every transformer block of ``chunks`` in place.

    ``backend``: inductor (generated kernels), aot_eager (the autograd graphs, no code
    generation: tests) or eager. ``tensor_parallel``: the blocks were sharded with
    ``plait.run.parallel.tensor``; the embedding's output is then made a plain tensor first, and
    a fully checkpointed block is compiled inside its checkpoint wrapper (the recomputation runs
    the compiled block again): torch 2.13 cannot compile a checkpoint of DTensor code (AOTAutograd
    finds a DeviceMesh among the tensors it saves), which also rules out ckpt=selective/balanced
    with tp > 1 (``runtime-compile-tp-ckpt``).
    """
    for chunk in chunks:
        if tensor_parallel and getattr(chunk, "tok_embeddings", None) is not None:
            chunk.tok_embeddings.register_forward_hook(_plain_output)
        for block in chunk.layers.values():
            inner = block._checkpoint_wrapped_module if isinstance(block, CheckpointWrapper) else block
            if isinstance(inner.feed_forward, MoEFeedForward):
                continue  # MoE blocks stay eager: the dispatch reads the per-expert row counts on the host
            if tensor_parallel:
                block = inner
            block.compile(backend=backend, fullgraph=True, dynamic=False)


def enable_async_tp(tp_mesh: DeviceMesh) -> None:
    """Turn on inductor's micro-pipelined (async) tensor parallelism for ``tp_mesh``'s group.

    Needs CUDA, NCCL, inductor and sequence parallelism (``plait.spec.capabilities`` refuses the
    rest before launch); raises RuntimeError on any other device.
    """
    if tp_mesh.device_type != "cuda":
        raise RuntimeError(f"async TP needs a CUDA tp mesh, got {tp_mesh.device_type!r}")
    from torch._inductor import config as inductor_config
    from torch.distributed import _symmetric_memory

    inductor_config._micro_pipeline_tp = True
    with warnings.catch_warnings():  # deprecated (no longer needed) from torch 2.12; needed on 2.11
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        _symmetric_memory.enable_symm_mem_for_group(tp_mesh.get_group().group_name)
