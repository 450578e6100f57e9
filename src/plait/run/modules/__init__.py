"""Building blocks of plait's transformer (plait.run.model).

  layers.py  norms, rotary embeddings and the attention kernels with their options
  moe.py     the mixture-of-experts MLP: router, grouped-GEMM experts, shared experts, auxiliary loss
"""
