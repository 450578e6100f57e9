"""Mixture-of-experts models as plain data (no torch).

  parts     MoESpec, MLASpec: the optional parts of a ModelSpec, and their accessors
  counts    exact parameter, active-parameter and FLOP counts of a model with those parts
  layout    expert parallelism on a layout: the validator's rules, the expert groups' placement
  presets   Mixtral, Qwen3-MoE, OLMoE, DeepSeek-V3, GPT-OSS and tiny-moe, with sources
  hf        a Hugging Face mixture-of-experts config.json -> ModelSpec
  hf_defaults  transformers' defaults of the keys an MoE config.json leaves out, and their aliases
  hf_layers which layers have experts and which slide, as transformers builds each MoE family
  hf_write  a mixture-of-experts ModelSpec -> config.json (Mixtral, Qwen2/3-MoE, OLMoE), for plait export
"""
