"""The torch runtime: applies a Layout to a plain model and trains it (``plait train``).

  config.py    RunConfig and its sections (job, optimizer, checkpoints, runtime, logs, evaluation)
  settings.py  setting(): a plait train setting declared once on its section's field
  worker.py    the rank's entry point under torchrun: start-up, same config everywhere, resume
  env.py       RankEnv, read once from torchrun's environment
  device.py    the one GPU-or-CPU decision, for the launcher and the ranks (no torch at import)
  trainer.py   build the parallel model and run the loop
  step.py      train_step: one optimizer step over the micro-batches
  pending.py   StepLedger: the device-side values read at sync steps
  model.py     plait's transformer (dense, MoE, MLA parts) on plain modules (modules/)
  loss.py      the token loss (chunked cross entropy for loss=fused)
  optim.py     AdamW and the learning-rate schedule
  metrics.py   step metrics: tokens/s, MFU, memory
  faults.py    FaultPlan: injected failures for tests and drills
  replan.py    a new layout for a resumed run on another world size
  generate.py  plait generate: sample tokens from a checkpoint or a Hugging Face directory, one process
  sampling.py  plait generate's sampling options and their checks (no torch: the parser reads them)
  modules/     the transformer's building blocks (norms, RoPE, attention, the MoE MLP)
  parallel/    parallelism, one module per dimension, and the one mesh
  memory/      activation checkpointing and offload
  checkpoint/  the checkpoint format, DCP save/load, the lock, the Hugging Face interchange
  data/        token files, tokenizers, synthetic data
  observe/     the metrics log, the sinks beside it, the held-out loss
  launcher/    the plait train side: request -> run, torchrun, outcome (rank code never imports it)
"""
