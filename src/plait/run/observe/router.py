"""Router health of a mixture-of-experts run: per-step figures of the MoE layers' routing, in the
step records of the JSONL log (and so in TensorBoard, W&B and MLflow, which take a record's numbers).

Every training forward of an MoE layer (``plait.run.modules.moe.MoEFeedForward``) adds, on the
device, its routed (token, expert) pairs per expert, the pairs its capacity dropped, and its aux
loss. After the step's backward, ``local_health`` gathers them (and each sigmoid router's bias
spread) into one flat fp32 vector with a slot for every MoE layer of the model, zero in the slots
of layers this rank does not hold (other pipeline stages), and zeroes the buffers. The vector
rides in the step's loss all-reduce (``plait.run.step.reduce_loss_and_stop``): no collective and
no host read of its own; it is L·(E + 4) fp32 values for L MoE layers of E experts (60 KB for
DeepSeek-V3's 58 layers of 256). ``summarize`` turns the world's sum into ``FIELDS`` on the device, where
they wait with the loss and gradient norm for the next sync step (``plait.run.pending``);
``health_fields`` names them on the host.

The fields (the model's MoE layers, the step's whole global batch; a "pair" is one token routed
to one of its top-k experts, so a layer routes global_batch·seq_len·top_k pairs):

  moe_tokens_per_expert_min / _max   the fewest / most pairs routed to one expert in one layer
                                     (the balanced count is global_batch·seq_len·top_k / n_experts)
  moe_tokens_per_expert_cv           coefficient of variation (population std / mean) of the pairs
                                     per expert, per layer, averaged over the MoE layers
  moe_tokens_per_expert_cv_max       the same, of the least balanced layer
  moe_dropped_pairs                  pairs dropped by the capacity factor, summed over the layers
                                     (0 when dropless)
  moe_dropped_frac                   moe_dropped_pairs over all routed pairs of all layers
  moe_aux_loss                       the load-balancing loss as the gradient sees it: Σ over layers
                                     of its mean over the step's micro-batches (aux_loss_coef
                                     included; 0 without one)
  moe_bias_spread                    sigmoid routers only: max - min of the balancing bias over the
                                     experts, of the layer where it is largest (the bias this
                                     step routed with)

Replicas: the tensor-parallel ranks of a layer route the same tokens (the MoE block runs whole on
each: ``TOKEN_REPLICAS``), so the loads are divided by tp; every rank holding a layer holds the
same bias, so its spread is divided by their number (world / pp).
"""

from __future__ import annotations

import torch

from plait.run.modules.moe import MoEFeedForward
from plait.spec.model import ModelSpec
from plait.spec.moe.parts import is_moe_layer

FIELDS = ("moe_tokens_per_expert_min", "moe_tokens_per_expert_max", "moe_tokens_per_expert_cv",
          "moe_tokens_per_expert_cv_max", "moe_dropped_pairs", "moe_dropped_frac", "moe_aux_loss", "moe_bias_spread")
SLOTS = 4  # per layer after the loads: dropped pairs, aux loss sum, forwards, bias spread


def moe_layer_indices(spec: ModelSpec) -> list[int]:
    """The block indices of the model's MoE layers, in order (a layer's slot is its position here)."""
    return [i for i in range(spec.n_layers) if is_moe_layer(spec, i)] if spec.moe is not None else []


def token_replicas(pdims) -> int:
    """How many ranks route the same tokens through a layer: its tensor-parallel ranks without
    sequence parallelism (the MoE block runs whole on each of them), 1 with it (each routes its
    own tokens: ``plait.run.parallel.moe_tensor``)."""
    return 1 if pdims.layout.sequence_parallel else pdims.layout.tp


def layer_holders(pdims) -> int:
    """How many ranks hold each layer (and its bias): all but the other pipeline stages."""
    return pdims.layout.world_size // pdims.layout.pp


@torch.no_grad()
def local_health(chunks, spec: ModelSpec, device: torch.device) -> torch.Tensor | None:
    """This rank's router figures since the last call as one fp32 vector: the (L, E) pairs per expert,
    then (SLOTS, L) [dropped pairs, aux loss sum, forwards, bias spread]; zero for the layers it does
    not hold. Zeroes the health buffers (``expert_load`` is the balancing step's: not touched). None for
    a model without MoE layers."""
    indices = moe_layer_indices(spec)
    if not indices:
        return None
    slot = {layer: k for k, layer in enumerate(indices)}
    layers, experts = len(indices), spec.moe.n_experts
    loads = torch.zeros(layers, experts, device=device, dtype=torch.float32)
    rest = torch.zeros(SLOTS, layers, device=device, dtype=torch.float32)
    for chunk in chunks:
        for module in chunk.modules():
            if isinstance(module, MoEFeedForward):
                k = slot[module.layer]
                loads[k] = module.expert_load
                rest[:3, k] = module.health
                if module.router_type == "sigmoid":
                    rest[3, k] = module.score_bias.max() - module.score_bias.min()
                module.health.zero_()
    return torch.cat([loads.flatten(), rest.flatten()])


@torch.no_grad()
def summarize(total: torch.Tensor, spec: ModelSpec, pdims) -> torch.Tensor:
    """``FIELDS`` (fp32, on the device) of ``local_health``'s vector summed over every rank."""
    layers, experts = len(moe_layer_indices(spec)), spec.moe.n_experts
    replicas = token_replicas(pdims)
    loads = total[:layers * experts].view(layers, experts) / replicas
    dropped, aux_sum, forwards, spread = total[layers * experts:].view(SLOTS, layers)
    mean = loads.mean(dim=1)
    cv = loads.std(dim=1, correction=0) / mean.clamp_min(torch.finfo(torch.float32).tiny)
    dropped_pairs = dropped.sum() / replicas
    return torch.stack([loads.min(), loads.max(), cv.mean(), cv.max(), dropped_pairs,
                        dropped_pairs / loads.sum().clamp_min(1.0), (aux_sum / forwards.clamp_min(1.0)).sum(),
                        (spread / layer_holders(pdims)).max()])


def health_fields(values: list[float], spec: ModelSpec) -> dict[str, float] | None:
    """The step record's router fields of ``summarize``'s values read on the host (None: none);
    ``moe_bias_spread`` only for a sigmoid router."""
    if not values:
        return None
    out = dict(zip(FIELDS, values, strict=True))
    if spec.moe.router != "sigmoid":
        del out["moe_bias_spread"]
    return out
