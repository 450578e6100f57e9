"""Activation memory and the host side of training memory.

  recompute.py        activation checkpointing policies, as the planner models them
  offload.py          activation offload to host memory or disk (saved-tensor hooks)
  offload_handles.py  what the offload hooks keep: counters, storage and view handles
  offload_dir.py      checks of the offload directory before training (no torch)
  counted.py          the peak tensor bytes of a CPU step, for comparison with the planner
  host_gc.py          Python's garbage collector off in training, a collection every N steps
"""
