"""The planner: memory, FLOPs, time and layout search as pure functions of the specs (never imports torch).

  params.py       CostParams: the software's numbers (kernel rates, overlaps), per stack
  calibration.py  the calibration file: format, reader, writer
  flops.py        model FLOPs and MFU (one definition)
  kernels.py      GEMM and attention kernel times
  attention_choice.py  the searched attention kernel: the fastest the runtime runs the model with
  comm.py         collective times on the cluster's links
  states.py       model states of ZeRO-sharded parameters
  activations.py  saved-activation bytes per layer, item by item
  memory.py       memory per rank: states, activations, buffers
  autocast.py     autocast's bf16 weight copies (no FSDP) alive at the peak
  cost.py         estimate_step: the step time as the sum of terms/
  terms/          one module per step-time mechanism
  context/        the context-parallel side: what each kernel sends, the searched kernel
  moe/            the mixture-of-experts side: memory and layer timing
  plan.py         Plan (a priced layout) and evaluate
  search.py       the layout search (with a step-time lower bound for the top plans)
  candidates.py   the layouts the search enumerates, grouped for the bound
  complete.py     a partial layout -> the fastest that fits, completed knobs named
  memo.py         planner functions cached by the layout fields they read
  coverage.py     a model's GEMM shapes, and whether a profile's measured range covers them
  compiled.py     a compiled block's element-wise work, from the model's shapes; who compiles
"""
