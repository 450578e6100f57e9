"""``plait profile``: micro-benchmark the machine at hand and fit the planner's fields to it.

  machine.py       what to measure, where (device, processes), running the workers, the calibration file
  worker.py        the process torchrun starts on every rank (``-m plait.measure.profile.worker DIR``)
  bench.py         the micro-benchmarks themselves (GEMMs, attention, copies, launches, collectives; torch)
  runtime_cost.py  host time of the runtime per layer and how much communication hides (torch)
  fit.py           raw measurements -> calibration fields, with the planner's own formulas (no torch)
  cpu_fit.py       what a CPU profile writes beyond kernel rates and links (no torch)
  gemm_fit.py      the GEMM roofline (compute, bytes, launch) fitted to the measured GEMMs (no torch)
"""
