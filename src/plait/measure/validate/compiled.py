"""Whether a published row ran torch.compile: a row fact read from its notes (``plait validate``). No torch.

Only stacks that declare ``compiled_blocks`` (their software can compile: torchtitan, plait) read it;
Megatron-Core, Megatron-LM, llm-foundry and DeepSpeed fuse their own kernels, priced by their stack
numbers. A row compiles when its notes say so in one of the sources' phrasings (``COMPILED_PHRASES``:
"torch.compile on", "FSDP + torch.compile", "--training.compile", "compile" as an item of a list of
the run's features); anything else keeps the stack's default (torchtitan: eager, its job config's
``compile = False``). The torchtitan 2024-08 rows (docs/performance.md at 3faaa1a0d) ran eager: the
Llama 2/3 A100 runs with the train configs of 1ea476e9f (2024-04-24: every ``compile = false``), the
405B row is the one whose "Optimizations" column says "None" (the Float8 and Async TP rows, not
entered, are the compiled ones).
"""

from __future__ import annotations

import re

COMPILED_PHRASES = (
    r"torch\.compile on",
    r"\+ torch\.compile",
    r"--training\.compile\b",
    r"(?:^|[,;] )compile[,;.]",
)
_COMPILED = re.compile("|".join(COMPILED_PHRASES), re.IGNORECASE)
COMPILE_PARAMS = ("compiled_blocks",)  # what a row's notes set (never fitted: plait.measure.calibrate.fit)


def row_compiles(notes: str) -> bool:
    """Whether ``notes`` say the run compiled its model (``COMPILED_PHRASES``)."""
    return bool(_COMPILED.search(notes or ""))


def compile_params(row: dict, stack, notes: list[str]) -> dict:
    """{"compiled_blocks": 1.0} for a row whose notes say it compiled, on a stack that can (noted);
    {} otherwise (the stack's default holds)."""
    if "compiled_blocks" not in stack.params or not row_compiles(row.get("notes") or ""):
        return {}
    notes.append("torch.compile (notes): compiled_blocks=1, the blocks' element-wise work as inductor's fused regions")
    return {"compiled_blocks": 1.0}
