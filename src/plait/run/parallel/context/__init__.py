"""Context parallelism: which tokens a rank holds (shard) and the attention kernels that exchange K/V
(ring, all-gather, PyTorch's ring attention in torch_ring, all-to-all of heads in ulysses)."""
