"""The planner's context-parallel side (no torch).

  exchange  what each ``cp_impl`` sends per layer and micro-batch, and what of it is exposed
  choice    the kernel a searched cp > 1 layout gets (the fastest, as priced)

The attention work of each kernel is ``plait.plan.kernels`` (``ring_attention_times``,
``cp_keys_per_query``).
"""
