"""plait: plan, run and measure parallelization layouts for LLM training.

Package layout:
  spec/     model, hardware, layout and job as plain frozen dataclasses (no torch)
  plan/     memory, FLOPs, cost model and layout search (no torch)
  measure/  published-run validation, profile, calibrate, sweep and report (one folder each)
  run/      the torch runtime
  cli/      one module per command (plait.cli:main is the entry point)

The tree, the data flow of ``plait plan`` and ``plait train`` and where to add things: docs/architecture.md.
"""

__version__ = "0.1.0"
