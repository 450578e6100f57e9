"""plait: plan, run and measure parallelization layouts for LLM training.

Package layout, each layer importing only those above it:
  errors.py    PlaitError (one line, exit 2), RunStopped; the one error vocabulary
  progress.py  the one progress bar
  atomic.py    the one atomic writer (renames over a regular file, writes through a device or FIFO)
  spec/        model, hardware, layout and job as plain frozen dataclasses (no torch)
  plan/        memory, FLOPs, cost model and layout search (no torch)
  run/         the torch runtime
  measure/     published-run validation, profile, calibrate, sweep and report (one folder each)
  cli/         one module per command (plait.cli:main is the entry point)
  data/        package data: built-in stacks, published runs, the held-out validation record

The tree, the data flow of ``plait plan`` and ``plait train`` and where to add things: docs/architecture.md.
"""

__version__ = "0.1.0"
