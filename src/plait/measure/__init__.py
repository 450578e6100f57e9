"""Measuring the planner against reality; one folder per command, all above ``plait.run``.

  validate/     ``plait validate``: predict published training runs (``shared/data`` CSV) and compare
  profile/      ``plait profile``: micro-benchmark this machine, write a calibration file
  calibrate/    ``plait calibrate fit``: fit cost-model parameters to published or swept runs
  sweep/        ``plait sweep``: run layouts through ``plait train``, predicted vs measured in a CSV
  report/       ``plait report``: a sweep (and plans, published runs) as HTML/Markdown with plots

The command-line side of each (flags, printing) is in ``plait.cli``.
"""
