"""Parallelism applied to a plain model, one module per dimension: mesh (the rank grid), tensor, data
(DDP/FSDP2/HSDP), pipeline, context/ (context parallel attention); parallelize applies them in order."""
