"""What a training run reports besides its step lines: the held-out loss (``evaluate``) and the
metrics sinks beside the JSONL log (``sinks``)."""
