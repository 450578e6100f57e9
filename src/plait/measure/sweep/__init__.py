"""``plait sweep``: run layouts through ``plait train`` and record predicted vs measured per layout.

  cases.py     SweepSpec (the settings) and SweepCase (one layout): from a grid, a list or the planner's top K
  run_one.py   one layout as a ``plait train`` subprocess; how it ended from its RUN_DIR/outcome.json
  loop.py      all layouts round-robin (--repeats, --min-time), each row written when done, the summary JSON
  timing.py    warm-up left out, medians, spreads, the noisy flag
  threads.py   threads per CPU process and the oversubscription warning
  csv_file.py  the sweep CSV (SweepRow, writer, checked reader) and where its summary JSON goes
  stats.py     Spearman rank correlation, errors and the planner's top-1 check
"""
