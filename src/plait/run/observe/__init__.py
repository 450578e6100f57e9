"""What a training run reports besides its console: the metrics JSONL file (``jsonl``: its records,
the writer and the one reader), the metrics sinks beside it (``sinks``: TensorBoard, W&B, MLflow)
and the held-out loss (``evaluate``)."""
