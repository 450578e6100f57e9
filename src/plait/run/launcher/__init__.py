"""The ``plait train`` side (no torch at import). Rank code never imports this folder; the one GPU-or-CPU
decision, which the ranks make too, is ``plait.run.device``.

  request.py         TrainRequest, generated from the declared settings
  target.py          TrainTarget: the plan file, or model + layout + batch, read once
  resolve.py         request -> RunConfig (fresh, from a plan, resumed, re-planned)
  micro_batch.py     --layout without mbs: choose it and say which
  preflight.py       the checks before launch (rules, capabilities, token file, memory)
  host_memory.py     host memory the run needs (offload, pinned buffers) against what the machine has
  checkpoint_dir.py  the checkpoint directory taken before launch: locked, failed saves cleaned
  environment.py     the environment torchrun and the ranks get
  launch.py          LaunchOptions and torchrun
  outcome.py         RUN_DIR/outcome.json: how the run ended
  deaths.py          which rank died, and how
  restarts.py        torchrun's restart notes
"""
