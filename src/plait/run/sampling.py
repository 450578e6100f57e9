"""How ``plait generate`` picks each new token: the options and their checks (no torch, so the
command line builds without it; ``plait.run.generate`` does the sampling)."""

from __future__ import annotations

from dataclasses import dataclass

from plait.errors import PlaitError


@dataclass(frozen=True)
class SamplingOptions:
    """How ``generate`` picks each new token (see the module doc)."""

    max_new_tokens: int = 32
    temperature: float = 1.0  # logits are divided by it; 0: greedy
    top_k: int = 0  # keep the k most likely tokens; 0: all
    top_p: float = 1.0  # nucleus: the smallest set of most likely tokens with probability >= top_p
    seed: int = 0


def check_sampling(options: SamplingOptions) -> None:
    """PlaitError naming the first sampling value out of range."""
    if options.max_new_tokens < 1:
        raise PlaitError(f"--max-new-tokens {options.max_new_tokens}: must be at least 1")
    if not options.temperature >= 0:  # also refuses NaN
        raise PlaitError(f"--temperature {options.temperature}: must be >= 0 (0: greedy)")
    if options.top_k < 0:
        raise PlaitError(f"--top-k {options.top_k}: must be >= 0 (0: no top-k cut)")
    if not 0 < options.top_p <= 1:
        raise PlaitError(f"--top-p {options.top_p}: must be in (0, 1] (1: no nucleus cut)")
