"""``plait calibrate fit``: fit a few cost-model parameters to measured or published runs. No torch.

  fit.py        the fit: usable cases, the bounded coordinate search, held-out errors
  cases.py      FitCase, one run the fit scores
  from_sweep.py fit cases from a ``plait sweep`` CSV
  families.py   layout families and leave-one-family-out
  output.py     the calibration JSON it writes (``FORMAT``) and the tables it prints
"""
