"""Context parallelism: which tokens a rank holds and the attention kernels that exchange K/V.

  shard.py       which tokens a rank holds (load-balanced chunks) and their positions
  ring.py        ring attention (K/V passed around the ring); cp_kernel, apply_context_parallel
  allgather.py   all-gather attention (K/V gathered, masked by global position)
  masks.py       block masks by global position (window, documents) and the blocks they hide whole
  ops.py         the per-block math: partial forward with log-sum-exp, the merge, the exact backward
  torch_ring.py  PyTorch's own ring attention
  ulysses.py     all-to-all of heads (DeepSpeed-Ulysses)
"""
