"""The planner's mixture-of-experts side (no torch).

  memory    parameters per rank, expert model states, the MoE block's saved activations
  timing    MoE/MLA/sliding-window layer kernel times, the expert all-to-all and its overlap
  sync      the dropless dispatcher's per-layer sync: token-count exchange, host copy, exposed launches
"""
