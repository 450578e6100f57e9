"""GPU names as sources write them -> plait's GPU preset names (``plait.spec.hardware.GPUS``).

Published runs name the same part many ways ("H100 80GB HBM3", "H100 SXM5", "NVIDIA A100-SXM4-40GB",
"A100 80GB PCIe", "h100 (96GB HBM2e, 500W)"). ``preset_name`` reads the family word and the
variant words (memory size, form factor, power cap) by explicit rules, in this order:

  ==============================================  ==================
  words in the name                               preset
  ==============================================  ==================
  a preset name itself (``h100-sxm``)             that preset
  mi300x / mi250x                                 mi300x / mi250x
  gb200 / gb300                                   gb200 / gb300
  b200                                            b200
  h200 / h800 / a800                              h200 / h800 / a800
  h100 with nvl or 94gb                           h100-nvl
  h100 with 95gb/96gb, hbm2e, 500w or lower-tdp   h100-96g-500w
  h100 with pcie                                  h100-pcie
  h100 otherwise (sxm, sxm5, 80gb, hbm3)          h100-sxm
  a100 with 40gb/40g                              a100-40g
  a100 with pcie                                  a100-80g-pcie
  a100 otherwise (sxm4, 80gb)                     a100-80g
  v100 with 16gb / otherwise                      v100-16g / v100-32g
  ==============================================  ==================

A name with none of these family words is unknown (None): the caller says so, never guesses.
"""

from __future__ import annotations

import re


def _words(text: str) -> str:
    """Lower case, ``nvidia``/``amd`` dropped, separators as single spaces: 'a100 sxm4 40gb'."""
    text = re.sub(r"[^a-z0-9.]+", " ", text.lower())
    return " ".join(w for w in text.split() if w not in ("nvidia", "amd", "instinct", "tesla"))


def _has(words: str, *needles: str) -> bool:
    return any(re.search(rf"(^|\s){re.escape(n)}", words) for n in needles)


def preset_name(text: str, presets=()) -> str | None:
    """The preset for a GPU name as a source writes it (see the module table), or None."""
    raw = text.strip().lower()
    if raw in presets:
        return raw
    words = _words(text)
    for family in ("mi300x", "mi250x", "gb200", "gb300"):
        if family in words:
            return family
    if _has(words, "b200"):
        return "b200"
    for family in ("h200", "h800", "a800"):
        if _has(words, family):
            return family
    if _has(words, "h100"):
        if _has(words, "nvl", "94gb", "94 gb") or "h100 nvl" in words or "h100nvl" in words:
            return "h100-nvl"
        if _has(words, "95gb", "96gb", "hbm2e", "500w", "lower tdp") or re.search(r"\b9[56] ?gb", words):
            return "h100-96g-500w"
        if "pcie" in words:
            return "h100-pcie"
        return "h100-sxm"
    if _has(words, "a100"):
        if re.search(r"\b40 ?gb?\b", words) or re.search(r"\b40g", words):
            return "a100-40g"
        if "pcie" in words:
            return "a100-80g-pcie"
        return "a100-80g"
    if _has(words, "v100"):
        return "v100-16g" if re.search(r"\b16 ?gb?\b", words) else "v100-32g"
    return None
