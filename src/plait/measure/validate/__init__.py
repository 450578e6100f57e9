"""``plait validate``'s library side: published training runs predicted and compared with what was reported.

  runs.py   read a published-runs CSV, predict each row, compare on one MFU basis (``predict_runs``,
            ``error_summary``, ``shipped_accuracy``)
  specs.py  one CSV row -> the planner's inputs (model, cluster, job, layout), completing what the
            source omits and noting it (``row_specs``)
  moe.py    the mixture-of-experts rows: the model, the GPU and Megatron-Core's FLOP counter
  stacks.py which software stack a row ran (its stack column, else its source's words)
  cells.py  how a row's cells in words are read (numbers, ZeRO stage, recompute, precision, ...)
  cross.py  leave-one-source-out: fit the defaults without a code base, predict it
  compiled.py  whether a row ran torch.compile (its notes), on a stack that can
  loss.py   whether a row's recipe ran Transformer Engine's cross entropy (its source)
"""
