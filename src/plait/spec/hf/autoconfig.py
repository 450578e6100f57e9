"""Read a config.json through transformers' config class for its ``model_type`` (local data only).

Importing transformers imports torch: the planner never comes here (``plait.spec.hf_config``
reads with its plain reader unless asked for ``reader="transformers"``).
"""

from __future__ import annotations

from pathlib import Path

from plait.errors import PlaitError


def autoconfig_getter(config: dict, family: str, source: Path):
    """``get(key)`` over transformers' config object built from ``config`` (no file or network access)."""
    try:
        from transformers import AutoConfig
    except ImportError:
        raise PlaitError("reading config.json with transformers needs it installed: pip install transformers") from None
    values = {k: v for k, v in config.items() if k not in ("model_type", "_name_or_path")}
    try:
        hf = AutoConfig.for_model(family, **values)
    except (ValueError, TypeError, KeyError) as exc:
        raise PlaitError(f"{source}: transformers cannot read this {family} config: {exc}") from None

    def get(key: str):
        if key == "rope_parameters":
            return getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", None)
        return getattr(hf, key, None)

    return get
