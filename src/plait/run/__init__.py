"""The torch runtime: model, parallelism from a Layout, training loop, launcher (``plait train``)."""
