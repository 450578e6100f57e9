"""Which Hugging Face tensor holds which plait parameter: the registry of the families' name tables.

Each family's table (rows: ``plait.run.checkpoint.hf.rows``; conversions:
``plait.run.checkpoint.hf.codecs``) lives in a module of its family group (``dense_rows``,
``moe_rows``); ``FAMILIES`` lists the ``Family`` objects that import and export look up by the
checkpoint's ``model_type`` (``family_of_model_type``). A new family adds its table in a module of
its own (or its group's) and one entry to ``FAMILIES`` (export also needs its config.json writer,
``plait.spec.hf.writer``). Import
(``plait.run.checkpoint.hf.load``) asks for the row of each plait parameter a rank holds
(``row_for``); export (``plait.run.checkpoint.hf.export``) walks the rows of the whole model. A plait
parameter without a row, or a Hugging Face tensor that no row reads, is an error naming it: nothing
is silently dropped.

GPT-OSS's table (sinks, biased router, fused biased experts) is ``plait.run.checkpoint.hf.gpt_oss``.
DeepSeek-V2 (trained from scratch; its attention weights are not mapped) has no table:
``family_of_model_type`` refuses it by name (``NO_TABLE``).

No module here imports torch at import time, so that ``plait train`` can ask
``family_of_model_type`` before any worker starts.
"""

from __future__ import annotations

import re

from plait.errors import PlaitError
from plait.run.checkpoint.hf.dense_rows import GEMMA2, GPT2, GPT_BIGCODE, LLAMA, OLMO2, PHI3
from plait.run.checkpoint.hf.gpt_oss import GPT_OSS
from plait.run.checkpoint.hf.moe_rows import DEEPSEEK_V3, MIXTRAL, QWEN_MOE
from plait.run.checkpoint.hf.rows import LAYER, Family, Row

FAMILIES: tuple[Family, ...] = (LLAMA, OLMO2, GEMMA2, PHI3, GPT2, GPT_BIGCODE, MIXTRAL, QWEN_MOE, DEEPSEEK_V3,
                                GPT_OSS)
NO_TABLE = {  # why a family plait reads has no table (the rest of plait's message: "plait's ...")
    "deepseek_v2": "runtime trains DeepSeek-V2's configs from scratch (its router, group-limited or not, is "
                   "the runtime's), but transformers' DeepseekV2Attention (complex-number RoPE) is not mapped "
                   "to plait's or checked against it; only DeepSeek-V3's weights "
                   "(deepseek_v3) are"}


def family_of_model_type(model_type: str) -> Family:
    """The table that reads a Hugging Face checkpoint of ``model_type`` (config.json); PlaitError otherwise."""
    for family in FAMILIES:
        if model_type in family.model_types:
            return family
    known = ", ".join(t for family in FAMILIES for t in family.model_types)
    if model_type in NO_TABLE:
        raise PlaitError(f"Hugging Face model_type {model_type!r} has no weight-name table in plait: plait's "
                         f"{NO_TABLE[model_type]} (tables for: {known})")
    raise PlaitError(f"Hugging Face model_type {model_type!r} has no weight-name table in plait "
                     f"(plait.run.checkpoint.hf.map; tables for: {known})")


_LAYER = re.compile(r"^layers\.(\d+)\.")


def layer_pattern(name: str) -> tuple[str, str | None]:
    """(``name`` with its layer index replaced by ``{i}``, the index) of a plait parameter name."""
    match = _LAYER.match(name)
    if not match:
        return name, None
    return LAYER + name[match.end():], match.group(1)


def rows_by_plait(family: Family) -> dict[str, tuple[Row, int]]:
    """{plait name pattern: (its row, its position among the row's plait tensors)}."""
    return {plait: (row, k) for row in family.rows for k, plait in enumerate(row.plait)}


def row_for(family: Family, name: str) -> tuple[Row, int, str | None]:
    """(row, position in the row, layer index) of plait parameter ``name``; PlaitError when no row has it."""
    pattern, layer = layer_pattern(name)
    found = rows_by_plait(family).get(pattern)
    if found is None:
        raise PlaitError(f"plait parameter {name} has no Hugging Face name in the {family.name} table "
                         "(add a row to its table: plait.run.checkpoint.hf.map lists them)")
    return found[0], found[1], layer


def concrete(pattern: str, layer: str | None) -> str:
    """A row's name pattern for one layer (``{i}`` replaced; names outside the layers unchanged)."""
    return pattern.replace("{i}", layer) if layer is not None else pattern
