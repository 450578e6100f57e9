"""The planner: memory, FLOPs, time and layout search as pure functions of the specs (never imports torch)."""
