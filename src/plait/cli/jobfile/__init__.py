"""Job files: ``plait train --config run.toml`` and ``plait plan --config run.toml``.

A job file sets flags in TOML. Its keys are the command's long flag names without the leading
dashes, written with dashes or underscores (``global-batch`` or ``global_batch``), at the top
level or in a table named after the flag's help group (``[optimizer]``, ``[checkpoints]``, ...:
the first word of the group's title in ``--help``). Flags given on the command line override the
file. What may be set, and as what type, is read from the command's argparse definitions
(``flags``): nothing here lists flags a second time.

  flags.py   the settable flags of a parser: key -> action and table; a TOML value checked as the flag's
  read.py    parse a command line whose ``--config FILE`` supplies defaults
  write.py   the resolved flags as a job file
  toml_text.py  a small TOML writer: scalars, lists, one level of tables
"""
