"""The planner's itemized memory of every pipeline stage, not only the most loaded one. No torch.

``plait.plan.memory.estimate_memory`` evaluates the first and the last stage and keeps the larger;
``stage_memories`` asks the same rule (``plait.plan.memory.rank_memory``) for each of the pp ranks,
so that a picture can show all of them against the capacity. Stage 0 holds the embedding and its
output, the last stage the final norm, the LM head and the logits; every stage holds its layers'
model states and activations, with the micro-batches in flight that its schedule keeps there
(``plait.plan.memory.rank_in_flight``). Bytes throughout.
"""

from __future__ import annotations

import dataclasses

from plait.plan.memory import MemoryBreakdown, estimate_memory, rank_memory
from plait.plan.params import DEFAULT_PARAMS, CostParams
from plait.spec.hardware import ClusterSpec
from plait.spec.layout import JobSpec, Layout
from plait.spec.model import ModelSpec


def stage_memories(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, layout: Layout,
                   params: CostParams = DEFAULT_PARAMS) -> list[MemoryBreakdown]:
    """One breakdown per pipeline rank (index = rank; ``stage`` names it "0", "1", ...); with pp = 1
    the planner's single breakdown. The largest total equals ``estimate_memory``'s."""
    if layout.pp == 1:
        return [estimate_memory(model, cluster, job, layout, params)]
    return [dataclasses.replace(rank_memory(model, cluster, job, layout, rank, params), stage=str(rank))
            for rank in range(layout.pp)]
