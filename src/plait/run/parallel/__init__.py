"""Parallelism applied to a plain model, one module per dimension.

  mesh.py         ParallelDims: the one mesh, its dense axes and the expert views (ep, edp)
  parallelize.py  applies the others in the documented order
  tensor.py       tensor and sequence parallelism (DTensor)
  expert.py       expert parallelism: the experts' all-to-all over the ep axis
  expert_overlap.py  moe_overlap chunked/shared: async all-to-alls behind expert GEMMs or shared experts
  moe_tensor.py   MoE under tp/sp and cp: each rank's tokens, the aux statistics, etp
  data.py         DDP, FSDP2 and hybrid sharding
  pipeline.py     torch.distributed.pipelining stages and schedules
  compile.py      per-block torch.compile (and async TP)
  float8.py       precision=fp8/mxfp8 linears through torchao
  context/        context-parallel attention
"""
