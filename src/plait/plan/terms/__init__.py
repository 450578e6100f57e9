"""The step-time model's mechanisms, one module each, named like the runtime's (``plait.run.parallel``,
``plait.run.memory``); ``plait.plan.cost.estimate_step`` adds them up. Seconds.

- ``items``: the breakdown items (``StepBreakdown``'s fields), each declared once with what it holds.
- ``tensor``: tensor/sequence-parallel collectives per layer.
- ``recompute``: what activation checkpointing repeats per checkpointed layer.
- ``offload``: activation traffic over the host link per micro-batch.
- ``pipeline``: send/recv per micro-batch and the schedule's bubble.
- ``expert``: the MoE all-to-all and per-layer routing cost per micro-batch.
- ``data``: data-parallel and ZeRO communication per step (FSDP units at ZeRO-3, experts' own group).
- ``optimizer``: the optimizer step, on the GPU or offloaded to the host.
- ``host``: the runtime's host time per layer and at the model's ends, and per micro-batch.
- ``overlap``: the overlap rule, what of a communication stays on the critical path.
- ``zero3``: ZeRO-3's per-unit gathers and reduce-scatters, priced unit by unit as FSDP2 shards.
"""
