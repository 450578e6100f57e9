"""What a training run reports besides its console: the metrics JSONL file (``jsonl``: its records,
the writer and the one reader), the metrics sinks beside it (``sinks``: TensorBoard, W&B, MLflow),
the held-out loss (``evaluate``) and the MoE routers' health in the step records (``router``)."""
