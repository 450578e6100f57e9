"""``plait profile``: micro-benchmark the machine at hand and fit the planner's fields to it.

  machine.py  what to measure, where (device, processes), running the workers, the calibration file
  worker.py   the process torchrun starts on every rank (``-m plait.measure.profile.worker DIR``)
  bench.py    the micro-benchmarks themselves (GEMMs, attention, copies, launches, collectives; torch)
  fit.py      raw measurements -> calibration fields, with the planner's own formulas (no torch)
"""
