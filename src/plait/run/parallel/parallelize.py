"""Turn a ModelSpec and a Layout into this rank's trainable model parts.

The order is fixed (each step changes what the next one sees):
  build on meta → fp8 linear layers (precision=fp8/mxfp8) → tensor parallel → expert parallel
  (ep > 1: ``plait.run.parallel.expert``) → MoE tokens and etp (``plait.run.parallel.moe_tensor``)
  → context parallel →
  activation checkpointing → activation offload hooks → torch.compile per block → FSDP2 →
  materialize on the device and initialize → DDP (zero=0) → pipeline schedule.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from plait.errors import PlaitError
from plait.run.memory.recompute import apply_activation_checkpointing
from plait.run.parallel.compile import compile_blocks as compile_blocks_of, enable_async_tp
from plait.run.parallel.context.ring import apply_context_parallel
from plait.run.parallel.context.shard import SequenceShard
from plait.run.parallel.data import apply_ddp, apply_fsdp, reshard_all, uses_fsdp
from plait.run.parallel.expert import ExpertParallel, set_aux_grad_scale
from plait.run.parallel.float8 import convert_experts, convert_to_float8
from plait.run.parallel.mesh import ParallelDims
from plait.run.parallel import moe_tensor
from plait.run.loss import loss_function, token_loss
from plait.run.model import Transformer, apply_kernels, build_model, init_weights, kept_buffers
from plait.run.memory.offload import ActivationOffloader, apply_activation_offload
from plait.run.parallel.pipeline import build_schedule, build_stage_module, stage_ids_of_rank
from plait.run.parallel.tensor import apply_tensor_parallel
from plait.spec.capabilities import async_tp_violations, compile_enabled
from plait.spec.model import ModelSpec


@dataclass
class ModelParts:
    """What one rank trains: its model chunks and, with pp > 1, the pipeline schedule."""

    chunks: list[nn.Module]
    stage_ids: list[int]
    schedule: object | None = None
    checkpointed: list[str] = field(default_factory=list)
    fp8: list[str] = field(default_factory=list)  # linear layers converted to fp8 (precision=fp8/mxfp8)
    fsdp: bool = False
    offloader: ActivationOffloader | None = None  # activation offload (plait.run.memory.offload)
    offloaded: list[str] = field(default_factory=list)  # ids of the blocks whose activations move
    sequence_shard: SequenceShard | None = None  # context parallelism: this rank's tokens of each sequence
    loss_fn: Callable = token_loss  # (model output, labels) -> mean token loss (Layout.loss, plait.run.loss)
    experts: ExpertParallel | None = None  # ep > 1: syncs the expert gradients after the backward
    pdims: ParallelDims | None = None  # the run's mesh (the MoE experts' gradient sum over tp)
    notes: list[str] = field(default_factory=list)  # what plait train says at startup (fp8 experts not converted)

    def state_buffers(self) -> list[tuple[str, torch.Tensor]]:
        """(plain-model name, tensor) of the buffers a checkpoint keeps: the sigmoid routers' biases."""
        return [item for chunk in self.chunks for item in kept_buffers(chunk)]

    def sync_expert_gradients(self) -> None:
        """Reduce the routed experts' gradients over their data-parallel group (ep > 1) and, when the
        tp ranks split the tokens with etp = 1, over tp (``plait.run.parallel.moe_tensor``)."""
        if self.experts is not None:
            self.experts.sync_gradients(self.chunks)
        if self.pdims is not None:
            moe_tensor.sync_gradients(self.chunks, self.pdims)

    def parameters(self) -> list[nn.Parameter]:
        return [p for chunk in self.chunks for p in chunk.parameters()]

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        return [item for chunk in self.chunks for item in chunk.named_parameters()]

    def train(self, mode: bool = True) -> None:
        for chunk in self.chunks:
            chunk.train(mode)

    def reshard(self) -> None:
        """Put every FSDP unit back in its sharded form (no-op without FSDP): a forward with no
        backward (an evaluation) leaves the units that do not reshard after forward gathered, and
        their parameters are then other tensors than the optimizer's."""
        reshard_all(self.chunks)

    def token_positions(self, seq: int, device: torch.device) -> torch.Tensor | None:
        """The global positions (int64) of this rank's ``seq`` tokens of each sequence, for the model's
        forward; None when they are 0..seq-1 (no context parallelism)."""
        return None if self.sequence_shard is None else self.sequence_shard.positions(seq, device)


def build_model_parts(spec: ModelSpec, pdims: ParallelDims, device: torch.device, seed: int,
                      n_microbatches: int, compile_blocks: bool | None = False, compile_backend: str = "inductor",
                      loss_fn: Callable = token_loss, offload_dir: str | None = None,
                      async_tp: bool = False, fused_qkv: bool = False) -> ModelParts:
    """This rank's parallelized, initialized model parts for ``pdims.layout``.

    ``compile_blocks``: torch.compile every block (fullgraph); None: on CUDA when the layout allows
    it (``plait.spec.capabilities.compile_enabled``). ``async_tp``: inductor's micro-pipelined TP.
    ``fused_qkv``: Q, K and V projections as one GEMM (``plait.run.model.qkv_projection``).
    ``offload_dir``: where ``offload=disk:α`` writes this rank's activations (a fresh directory).
    """
    layout = pdims.layout
    compiled = compile_enabled(compile_blocks, device.type, layout)
    if async_tp:
        broken = async_tp_violations(layout, device=device.type, compile=compiled, backend=compile_backend)
        if broken:
            raise PlaitError("; ".join(f"{v.message} [{v.rule}]" for v in broken))
        enable_async_tp(pdims.mesh["tp"])
    if layout.pp > 1:
        stage_ids = stage_ids_of_rank(layout, pdims.pp_rank)
        chunks: list[Transformer] = [build_stage_module(spec, layout, sid) for sid in stage_ids]
    else:
        stage_ids = [0]
        chunks = [build_model(spec)]
    sequence_shard = None
    fp8: list[str] = []
    notes: list[str] = []
    experts = ExpertParallel(pdims) if layout.ep > 1 else None
    # the aux loss's gradient is scaled as each micro-batch's loss: by the step without a pipeline,
    # by the schedule's scale_grads with one
    # (times cp: plait.run.parallel.moe_tensor.aux_grad_factor)
    set_aux_grad_scale(chunks, (1.0 if layout.pp > 1 else 1.0 / n_microbatches) * moe_tensor.aux_grad_factor(pdims))
    for chunk in chunks:
        apply_kernels(chunk, layout.attn, layout.norm, layout.loss)
        for block in chunk.layers.values():
            block.attention.fused_qkv = fused_qkv
        if layout.precision != "bf16":
            fp8 += convert_to_float8(chunk, device, layout.tp, layout.precision)
            experts_fp8, experts_notes = convert_experts(chunk, device, layout.precision, layout.etp)
            fp8 += experts_fp8
            notes += [note for note in experts_notes if note not in notes]
        if layout.tp > 1:
            apply_tensor_parallel(chunk, pdims.mesh["tp"], layout.sequence_parallel)
        if experts is not None:
            experts.apply(chunk)
        moe_tensor.apply_moe_tensor_parallel(chunk, pdims)
        if layout.cp > 1:
            sequence_shard = apply_context_parallel(chunk, pdims.mesh["cp"], layout.cp_impl)
    checkpointed = apply_activation_checkpointing(chunks, layout)
    offloader, offloaded = apply_activation_offload(chunks, layout, pdims.pp_rank, device, offload_dir)
    if compiled:
        compile_blocks_of(chunks, compile_backend, tensor_parallel=layout.tp > 1)
    fsdp = pdims.grad_sync_size > 1 and uses_fsdp(pdims)
    if fsdp:
        for chunk in chunks:
            apply_fsdp(chunk, pdims, device.type, experts.edp_mesh if experts is not None else None)
    for chunk in chunks:
        chunk.to_empty(device=device)
        chunk.tie_embeddings()  # to_empty untied plain (non-DTensor) parameters
        init_weights(chunk, spec, seed, device)
    ddp = pdims.grad_sync_size > 1 and not fsdp
    trained: list[nn.Module] = [apply_ddp(chunk, pdims) for chunk in chunks] if ddp else list(chunks)
    last = [chunk for chunk in chunks if chunk.output is not None]  # the chunk with the LM head (last stage)
    loss_fn = loss_function(layout.loss, last[0].output if last else None, loss_fn, last[0] if last else None)
    schedule = None
    if layout.pp > 1:
        schedule = build_schedule(trained, stage_ids, pdims, n_microbatches, loss_fn, device)
    return ModelParts(chunks=trained, stage_ids=stage_ids, schedule=schedule,
                      checkpointed=checkpointed, fp8=fp8, fsdp=fsdp, offloader=offloader, offloaded=offloaded,
                      sequence_shard=sequence_shard, loss_fn=loss_fn, experts=experts, pdims=pdims, notes=notes)
