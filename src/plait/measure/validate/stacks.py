"""Which software stack a published row ran (``plait validate``): the row's ``stack`` column, else its
source's words (``SOURCE_STACKS``), else plait's own runtime. No torch."""

from __future__ import annotations

from plait.measure.validate.cells import integer
from plait.spec.stack import DEFAULT_STACK, Stack, get_stack


# Which software each source ran (``plait.spec.stack``), first match wins: words of the row's source
# (or, for DeepSpeed, its notes) -> stack. A row's own ``stack`` column overrides this table.
SOURCE_STACKS = (
    (("megatron-bridge", "nemo", "megatron-moe-modelzoo", "megatron-core"), "megatron-core"),
    (("narayanan", "korthikanti", "megatron-lm"), "megatron-lm"),
    (("torchtitan",), "torchtitan"),
    (("llm-foundry", "mosaicml"), "llm-foundry"),
    (("megatron", "mt-nlg"), "megatron-lm"),  # any other Megatron (Megatron-DeepSpeed, MT-NLG): Megatron's own kernels
)


def stack_of(row: dict) -> tuple[Stack, str]:
    """(the stack a row ran, why): its ``stack`` column; DeepSpeed's 2021 ZeRO-3 where the notes name
    DeepSpeed on a ZeRO-3 row of 2021 or before (Narayanan et al.'s Table 2 baseline); else by
    ``SOURCE_STACKS``; else plait's runtime (noted as unknown)."""
    given = (row.get("stack") or "").strip()
    if given:
        return get_stack(given), "the row's stack column"
    text = f"{row.get('notes', '')} {row.get('source', '')}".lower()
    year = integer(row, "year") or 0
    if integer(row, "zero_stage") == 3 and "deepspeed" in text and year <= 2021:
        return get_stack("deepspeed"), "ZeRO-3 by DeepSpeed in 2021 (notes)"
    source = (row.get("source") or "").lower()
    for words, name in SOURCE_STACKS:
        if any(word in source for word in words):
            return get_stack(name), "from its source"
    return get_stack(DEFAULT_STACK), "source not known to run another stack"
