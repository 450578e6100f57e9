"""Per-layer choices of a mixture-of-experts ``config.json``, as transformers 5.24 builds each family
(no torch): which layers have routed experts, and which attend within a sliding window.

Experts (``moe_placement`` -> ``MoESpec.first_dense`` and ``every``: layers first_dense,
first_dense + every, ... have experts):
  qwen2_moe, qwen3_moe  layer i has experts when i is not in ``mlp_only_layers`` and
                        (i + 1) % decoder_sparse_step == 0 (step 2: layers 1, 3, 5, ...)
  deepseek_v2/3         every layer from ``first_k_dense_replace`` on (``moe_layer_freq`` is refused
                        unless 1: ``plait.spec.hf.values``)
  mixtral, olmoe, gpt_oss  every layer
A set of expert layers that is not "from one layer on, every n-th" is refused with the layers.

Sliding windows (``attention_windows`` -> the ModelSpec's ``sliding_window``, ``local_layers``):
  mixtral    ``sliding_window`` on every layer (null: none)
  qwen3_moe  ``sliding_window`` on every layer when ``use_sliding_window`` (max_window_layers is not
             read by transformers' Qwen3-MoE)
  qwen2_moe  ``layer_types``, by default the even layers below ``max_window_layers`` when
             ``use_sliding_window``
  gpt_oss    ``layer_types``, by default the even layers; window ``sliding_window``
  olmoe, deepseek_v2/3  none
``layer_types`` entries other than ``sliding_attention`` and ``full_attention`` are refused, as is a
pattern other than all, the even layers, or none.
"""

from __future__ import annotations

from pathlib import Path

from plait.errors import PlaitError

LAYER_TYPES = ("sliding_attention", "full_attention")


def expert_layers(config: dict, kind: str, n_layers: int) -> list[int]:
    """The layers with routed experts in transformers' model of ``config`` (defaults filled in)."""
    if kind in ("qwen2_moe", "qwen3_moe"):
        dense = set(config.get("mlp_only_layers") or [])
        step = config.get("decoder_sparse_step") or 1
        return [i for i in range(n_layers) if i not in dense and (i + 1) % step == 0]
    if kind in ("deepseek_v2", "deepseek_v3"):
        return list(range(config.get("first_k_dense_replace") or 0, n_layers))
    return list(range(n_layers))


def moe_placement(config: dict, kind: str, n_layers: int, source: Path) -> tuple[int, int]:
    """(first_dense, every) of ``MoESpec`` giving the expert layers of ``expert_layers``; PlaitError
    naming them when no such pair does."""
    step = config.get("decoder_sparse_step")
    if kind in ("qwen2_moe", "qwen3_moe") and (isinstance(step, bool) or not isinstance(step, int) or step < 1):
        raise PlaitError(f"{source}: decoder_sparse_step={step!r} must be an integer >= 1")
    dense = config.get("mlp_only_layers")
    if kind in ("qwen2_moe", "qwen3_moe") and dense is not None and not (
            isinstance(dense, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in dense)):
        raise PlaitError(f"{source}: mlp_only_layers={dense!r} must be a list of layer numbers")
    first_dense = config.get("first_k_dense_replace")
    if kind in ("deepseek_v2", "deepseek_v3") and (isinstance(first_dense, bool) or not isinstance(first_dense, int)
                                                   or first_dense < 0):
        raise PlaitError(f"{source}: first_k_dense_replace={first_dense!r} must be an integer >= 0")
    layers = expert_layers(config, kind, n_layers)
    if not layers:
        raise PlaitError(f"{source}: no layer of {n_layers} has experts (decoder_sparse_step, mlp_only_layers or "
                         "first_k_dense_replace leave none); read it as a dense model's config")
    first = layers[0]
    every = layers[1] - first if len(layers) > 1 else n_layers - first
    if layers != list(range(first, n_layers, every)):
        keys = "mlp_only_layers and decoder_sparse_step" if kind.startswith("qwen") else "its keys"
        shown = ", ".join(map(str, layers[:8])) + (f", ... ({len(layers)} layers)" if len(layers) > 8 else "")
        raise PlaitError(f"{source}: {keys} put experts on layers {shown}; plait's MoESpec puts them on "
                         "layers first_dense, first_dense + every, ... to the last")
    return first, every


def attention_windows(config: dict, kind: str, n_layers: int, source: Path) -> dict:
    """{"sliding_window": tokens (0: none), "local_layers": "all" or "even"} of ``config`` (defaults
    filled in), as the ModelSpec records them."""
    window = config.get("sliding_window") or 0
    if kind == "mixtral":
        return {"sliding_window": window, "local_layers": "all"}
    if kind == "qwen3_moe":
        return {"sliding_window": window if config.get("use_sliding_window") else 0, "local_layers": "all"}
    if kind not in ("qwen2_moe", "gpt_oss"):
        return {"sliding_window": 0, "local_layers": "all"}
    types = config.get("layer_types")
    if types is None:
        below = config.get("max_window_layers", n_layers) if kind == "qwen2_moe" else n_layers
        on = config.get("use_sliding_window", True) if kind == "qwen2_moe" else True  # GPT-OSS: always windowed
        types = [LAYER_TYPES[0] if i % 2 == 0 and i < below and on else LAYER_TYPES[1] for i in range(n_layers)]
    unknown = [t for t in types if t not in LAYER_TYPES]
    if unknown or len(types) != n_layers:
        what = f"holds {unknown[0]!r}" if unknown else f"has {len(types)} entries"
        raise PlaitError(f"{source}: layer_types {what}; plait reads {n_layers} entries of "
                         f"{' / '.join(LAYER_TYPES)}")
    local = [i for i, t in enumerate(types) if t == LAYER_TYPES[0]]
    if kind == "qwen2_moe" and local and not config.get("use_sliding_window"):
        raise PlaitError(f"{source}: layer_types has sliding_attention layers but use_sliding_window is false "
                         "(transformers' window is then 0 tokens)")
    if not local or not window:
        return {"sliding_window": 0, "local_layers": "all"}
    if local == list(range(n_layers)):
        return {"sliding_window": window, "local_layers": "all"}
    if local == list(range(0, n_layers, 2)):
        return {"sliding_window": window, "local_layers": "even"}
    raise PlaitError(f"{source}: layer_types puts sliding windows on layers {local}; plait models all layers "
                     "or the even ones (0, 2, ...)")
