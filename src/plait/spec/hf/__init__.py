"""Hugging Face configs.

  families.py   each family's defaults and the keys a config.json may carry; RoPE scaling's types and keys
  autoconfig.py transformers' own reader, when it is installed
  writer.py     a ModelSpec as a config.json (the inverse of plait.spec.hf_config)
"""
