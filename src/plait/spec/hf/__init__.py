"""Hugging Face config reading: each family's defaults and keys (families), transformers' reader (autoconfig)."""
