"""Activation memory: recompute (activation checkpointing policies) and offload to host memory or disk."""
