"""Building blocks of plait's transformer (plait.run.model): norms, rotary embeddings, attention kernels."""
