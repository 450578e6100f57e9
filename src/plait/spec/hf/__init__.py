"""Hugging Face configs.

  families.py   each family's defaults and the keys a config.json may carry; RoPE scaling's types and keys
  autoconfig.py transformers' own reader, when it is installed
  writer.py     a ModelSpec as a config.json (the inverse of plait.spec.hf_config)
  values.py     config values that change outputs and that plait's runtime runs one way of (swiglu_limit,
                the MoE families' hidden_act, DeepSeek's scoring_func...): refused otherwise, for every reader
"""
