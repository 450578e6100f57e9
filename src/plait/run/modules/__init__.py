"""Building blocks of plait's transformer (plait.run.model).

  layers.py     norms, rotary embeddings and the attention kernels with their options
  documents.py  packed documents (--doc-mask): document ids, positions per document, their masks
  mla.py        multi-head latent attention (DeepSeek-V2/V3): latent queries and keys/values, the shared RoPE key
  flex.py       attn=flex: FlexAttention with soft-cap, window, sinks and documents, and its fallbacks
  moe.py        the mixture-of-experts MLP: router, grouped-GEMM experts, shared experts, auxiliary loss
  experts.py    the routed experts: expert-major weights and biases, SwiGLU or GPT-OSS's clamped SwiGLU
"""
