"""Published mixture-of-experts runs (``shared/data/published_moe_runs.csv``): the row's model, GPU and
the source's FLOP counter.

Model (``moe_model_for_row``): a row whose dimensions (n_layers, hidden, n_heads, n_experts, top_k,
moe_ffn_hidden) are those of a MoE preset takes the preset (``plait.spec.moe.presets``: exact
head_dim, Q/K norms, MLA, sliding windows, biases, which the CSV does not carry), noted. Otherwise
``llama-moe`` rows are built from the columns (head_dim = hidden / n_heads, noted); ``deepseek-moe``
rows without a preset lack the MLA ranks and ``qwen3-next`` (linear/gated hybrid attention) is not
modelled: both are unsupported. ``moe_layer_freq`` is 1 (every layer) or Megatron's
``[0]*n+[1]*m`` (the first n dense).

GPU (``moe_gpu_type``): the sources' system names map to presets by ``plait.spec.gpu_names``, except
the Megatron-MoE-ModelZoo's "h100 (NVLink4, IB 8x50GB/s)": eight H100 on NVLink4 with one
400 Gb/s NIC each is the DGX/HGX H100 SXM5 node (H100 NVL, the PCIe card, pairs GPUs over bridges
and has no NVLink4 switch), so ``h100-sxm``, noted.

FLOP counter (``megatron_flops_per_token``): the sources report TFLOP/s from Megatron-Core's own
counter (``num_floating_point_operations`` in Megatron-LM's training.py): per token
    12·L·h·(ffn·1.5·dense/L + (f_e·k + f_s·n)·1.5·moe/L)            MLP, SwiGLU (3/2)
  + 12·L·h²·(1 + g/a + s/(2h))·(a·d/h)                              GQA attention, causal (s/2)
  + 6·L·(MLA projections + s·a·(d_qk + d_v)/2)                      MLA attention instead
  + 6·h·V                                                           logits
(L layers, s sequence, V vocabulary, g KV heads, d head_dim). Checked against the rows that report
both TFLOP/s and throughput: Qwen3-235B-A22B 245 TFLOP/s at 1663.4 tokens/s is 1.473e11 FLOPs per
token, the formula gives 1.480e11 (0.5%, the TFLOP/s are rounded). It differs from plait's model
FLOPs (``ModelSpec.model_flops_per_token``: 6 × the active matmul weights + causal attention) in
three places: plait counts the router GEMM (2·h·E per token forward), Megatron leaves it out;
plait counts a local layer's sliding window (GPT-OSS), Megatron the full causal square; and
Megatron's MLA projection count adds the latent norms as weights. For the MoE presets the
difference is under 2% (README, MoE validation).

CUDA graphs (``moe_graph_params``): which parts of the MoE layer the row's recipe captures in CUDA
graphs, read from the Megatron-Bridge performance configs at the row's container tag and from the
ModelZoo's command (``RECIPE_GRAPHS``, ``MODELZOO_GRAPHS``), become the cost parameters
``moe_router_graphed`` / ``moe_layer_graphed`` of ``plait.plan.moe.sync``; noted.
"""

from __future__ import annotations

import re

from plait.measure.validate.cells import precision_of, recompute_modules
from plait.spec.model import ModelSpec
from plait.spec.moe.parts import MoESpec
from plait.spec.moe.presets import MOE_PRESETS

MOE_ARCHS = ("llama-moe", "deepseek-moe", "gpt-oss", "qwen3-next")
GPU_TYPES = {"h100 (nvlink4, ib 8x50gb/s)": "h100-sxm"}  # module docstring


class MoERowError(Exception):
    """A MoE row plait cannot model (the reason as message); the caller maps it to its own status."""


def is_moe_row(row: dict) -> bool:
    arch = (row.get("arch") or "").strip().lower()
    return arch in MOE_ARCHS or bool((row.get("n_experts") or "").strip())


def moe_gpu_type(row: dict, notes: list[str]) -> str:
    """The GPU name to look up for a row (``GPU_TYPES`` first, noted)."""
    text = (row.get("gpu_type") or "").strip()
    mapped = GPU_TYPES.get(text.lower())
    if mapped:
        notes.append(f"gpu_type {text!r} read as {mapped} (NVLink4 x8 with 400 Gb/s NICs: the SXM5 node)")
        return mapped
    return text


def _int(row: dict, key: str) -> int | None:
    text = (row.get(key) or "").strip()
    try:
        return int(float(text)) if text else None
    except ValueError:
        return None


def _first_dense(text: str) -> int | None:
    """Leading dense layers from ``moe_layer_freq`` (1, or ``[0]*n+[1]*m``); None when not that form."""
    text = text.replace(" ", "")
    if text in ("", "1"):
        return 0
    match = re.fullmatch(r"\[0\]\*(\d+)\+\[1\]\*(\d+)", text)
    return int(match.group(1)) if match else None


def moe_model_for_row(row: dict, seq_len: int, notes: list[str]) -> ModelSpec:
    """The model of a MoE row (module docstring); raises MoERowError when plait cannot model it."""
    arch = (row.get("arch") or "").strip().lower()
    if arch == "qwen3-next":
        raise MoERowError("qwen3-next's hybrid linear/gated attention is not modelled")
    dims = {k: _int(row, k) for k in ("n_layers", "hidden", "n_heads", "n_experts", "top_k", "moe_ffn_hidden")}
    missing = [k for k, v in dims.items() if v is None]
    if missing:
        raise MoERowError(f"MoE dimensions not given ({', '.join(missing)})")
    for preset in MOE_PRESETS:
        moe = preset.moe
        if (preset.n_layers, preset.hidden, preset.n_heads, moe.n_experts, moe.top_k, moe.expert_ffn) == (
                dims["n_layers"], dims["hidden"], dims["n_heads"], dims["n_experts"], dims["top_k"],
                dims["moe_ffn_hidden"]):
            notes.append(f"model: preset {preset.name} (same dimensions; head_dim, norms, MLA and windows from it)")
            return preset
    if arch == "deepseek-moe":
        raise MoERowError("an MLA model without a preset: the CSV has no MLA ranks")
    first_dense = _first_dense(row.get("moe_layer_freq") or "")
    if first_dense is None:
        raise MoERowError(f"moe_layer_freq {row.get('moe_layer_freq')!r} is not 1 or [0]*n+[1]*m")
    shared = _int(row, "n_shared_experts") or 0
    heads = dims["n_heads"]
    notes.append("head_dim = hidden / n_heads assumed (no preset with these dimensions)")
    return ModelSpec(
        name=row["id"], arch="llama", n_layers=dims["n_layers"], hidden=dims["hidden"],
        ffn_hidden=_int(row, "ffn_hidden") or dims["moe_ffn_hidden"], n_heads=heads,
        n_kv_heads=_int(row, "n_kv_heads") or heads, vocab=_int(row, "vocab") or 32000, max_seq_len=max(seq_len, 2048),
        moe=MoESpec(dims["n_experts"], dims["top_k"], dims["moe_ffn_hidden"], n_shared=shared, first_dense=first_dense),
    )


def megatron_flops_per_token(model: ModelSpec, seq_len: int) -> float:
    """Megatron-Core's model FLOPs per token for ``model`` (module docstring)."""
    from plait.spec.moe.parts import moe_layer_count

    layers, h, s, a = model.n_layers, model.hidden, seq_len, model.n_heads
    moe = model.moe
    n_moe = moe_layer_count(model) if moe is not None else 0
    dense_ffn = model.ffn_hidden * 1.5 * (layers - n_moe) / layers
    routed = (moe.expert_ffn * moe.top_k + moe.shared_width * moe.n_shared) * 1.5 * n_moe / layers if moe else 0.0
    mlp = 12.0 * layers * h * (dense_ffn + routed)
    mla = model.mla
    if mla is not None:
        q = (mla.q_lora_rank * (h + a * mla.qk_head_dim + 1) if mla.q_lora_rank else h * a * mla.qk_head_dim)
        kv = mla.kv_lora_rank * (h + a * (mla.qk_nope_head_dim + mla.v_head_dim) + 1) + h * mla.qk_rope_head_dim
        core = s * a * mla.qk_head_dim / 2.0 + s * a * mla.v_head_dim / 2.0
        attention = 6.0 * layers * (q + kv + a * mla.v_head_dim * h + core)
    else:
        ratio = model.q_hidden / h
        attention = 12.0 * layers * h * h * (1 + model.n_kv_heads / a + s / h / 2.0) * ratio
    return mlp + attention + 6.0 * h * model.vocab


NVL72_GPUS_PER_DOMAIN = 64  # GB200 NVL72: a 72-GPU NVLink domain, of which jobs use 64 (powers of two)


def nvlink_domain(row: dict, gpu_name: str, notes: list[str]) -> int | None:
    """GPUs per NVLink domain of a GB200 or GB300 row: NVL72's rack (64 of its 72 GPUs per job; a job whose
    size 64 does not divide, 8), whatever ``gpus_per_node`` says (the recipes' 4 is the compute tray: its GPUs reach
    the rest of the rack over NVLink too); None for other GPUs (the row's own value or the default)."""
    if gpu_name not in ("gb200", "gb300"):
        return None
    n_gpus = _int(row, "n_gpus") or NVL72_GPUS_PER_DOMAIN
    per_domain = NVL72_GPUS_PER_DOMAIN if n_gpus % NVL72_GPUS_PER_DOMAIN == 0 else min(n_gpus, 8)
    stated = (row.get("gpus_per_node") or "").strip()
    said = f" (gpus_per_node {stated} is the compute tray)" if stated else " (gpus_per_node not stated)"
    notes.append(f"{gpu_name.upper()} NVL72: {per_domain} GPUs per NVLink domain{said}")
    return per_domain


# The recompute of the Megatron-Bridge performance recipes, for rows whose recompute cell is blank, by
# (system, model words, precision or None, first container), as ``RECIPE_GRAPHS``: the recipe's
# recompute_modules in Megatron's cell syntax. Read in NVIDIA-NeMo/Megatron-Bridge
# scripts/performance/configs/gpt_oss/*workload_base_configs.py at v0.2.0 (25.11), v0.3.0, v0.4.0,
# v0.4.2 and v0.5.0 (26.06): GPT-OSS 120B on H100, B200 and GB200 recomputes ["layernorm", "moe_act"]
# (the FP8 presets alias the BF16 ones), except GB200's FP8_MX_V2 of v0.5.0 on, which sets
# recompute_modules=[] (first match wins).
RECIPE_RECOMPUTE = (
    ("gb200", ("gpt-oss",), "mxfp8", (26, 6), "none"),
    ("gb200", ("gpt-oss",), None, (25, 11), "selective(layernorm, moe_act)"),
    ("b200", ("gpt-oss",), None, (25, 11), "selective(layernorm, moe_act)"),
    ("h100", ("gpt-oss",), None, (25, 11), "selective(layernorm, moe_act)"),
)


def recipe_recompute(row: dict, notes: list[str]) -> str:
    """The recompute cell of a Megatron-Bridge row's recipe (``RECIPE_RECOMPUTE``, first match), noted;
    "" where no recipe is known (the cell stays blank: the stack's default, or searched)."""
    release = container_release(row)
    if release is None:
        return ""
    gpu = (row.get("gpu_type") or "").strip().lower()  # "h100-sxm (DGX-H100)": the system first
    precision = precision_of(row.get("precision") or "")
    for system, words, mode, first, cell in RECIPE_RECOMPUTE:
        if _recipe_applies((system, words, mode, first), row, gpu, precision, release):
            notes.append(f"recompute {cell!r}: the Megatron-Bridge {release[0]}.{release[1]:02d} recipe for {system} "
                         "(recompute blank in the row)")
            return cell
    return ""


def _recipe_applies(entry: tuple, row: dict, gpu: str, precision: str, release: tuple[int, int]) -> bool:
    """Whether a recipe table's (system, model words or None, precision or None, first container)
    covers a Megatron-Bridge row of ``gpu`` (a name that starts with the system's), ``precision`` (the
    layout's) and container ``release``."""
    system, words, mode, first = entry
    model = (row.get("model_name") or "").lower().replace(" ", "-")
    return gpu.startswith(system) and release >= first and (mode is None or precision == mode) \
        and (words is None or any(w in model for w in words))


def moe_given(row: dict, notes: list[str]) -> dict:
    """Layout keys a MoE row states in words: Megatron's fine-grained recompute modules and the
    expert all-to-all overlap.

    ``selective(norm, act)`` (Megatron ``--recompute-modules layernorm moe_act``: norms and the
    experts' activation functions recomputed, GEMM outputs kept) is plait's ``balanced``;
    ``selective(layernorm, moe)`` or ``(..., mlp)`` (the MoE or MLP block recomputed from its input,
    the norms too, attention kept) is plait's ``mlp``, which keeps the attention norm's output that
    Megatron's ``layernorm`` module recomputes (``attn_norm_output``: 2·(s/cp)·b·h/tp bytes per layer
    more, said in the row's notes); "1f1b overlap" (one micro-batch's all-to-all behind another's
    compute) is ``moe_overlap=chunked``.
    """
    out: dict = {}
    text = (row.get("recompute") or "").strip().lower() or recipe_recompute(row, notes)
    modules = recompute_modules(text)
    if text.startswith("selective(") and modules & {"moe", "mlp"}:
        out.update(ckpt="mlp", ckpt_layers=0, _op_level=False)
        note = f"recompute {text!r} (the MoE/MLP block recomputed, attention kept) read as ckpt=mlp"
        if "layernorm" in modules:
            tokens = (_int(row, "seq_len") or 0) / (_int(row, "cp") or 1) * (_int(row, "mbs") or 1)
            extra = 2 * tokens * (_int(row, "hidden") or 0) / (_int(row, "tp") or 1) / 2**20
            note += (f"; plait keeps the attention norm's output that Megatron's layernorm module recomputes "
                     f"({extra:.0f} MiB per layer and micro-batch)")
        notes.append(note)
    elif text.startswith("selective(") and modules & {"act", "moe_act"}:
        out.update(ckpt="balanced", ckpt_layers=0, _op_level=False)
        notes.append(f"recompute {text!r} (norms and activations recomputed) read as ckpt=balanced")
    elif text == "none":
        out.update(ckpt="none", ckpt_layers=0, _op_level=False)
    if "1f1b overlap" in (row.get("notes") or "").lower():
        out["moe_overlap"] = "chunked"
        notes.append("EP all-to-all overlapped with another micro-batch's compute: moe_overlap=chunked")
    return out


# CUDA graphs of the Megatron-Bridge performance recipes, by (system, model words, precision or None,
# first container): the cost parameters they set (``plait.plan.moe.sync``). Read in
# NVIDIA-NeMo/Megatron-Bridge scripts/performance/configs/{qwen3,qwen,deepseek,gpt_oss}/
# *workload_base_configs.py at the tags of the containers (v0.2.0 = 25.11, v0.3.0 = 26.02,
# v0.4.0 = 26.04, v0.5.0 = 26.06): GB200 Qwen3 and DeepSeek-V3 set cuda_graph_impl="transformer_engine"
# with cuda_graph_scope [("attn",) "moe_router", "moe_preprocess"] from v0.2.0 on (GPT-OSS does not),
# and so does B200 Qwen3-30B (the others on B200 do not); the GB200 FP8_MX configs of all four models set
# cuda_graph_impl="full_iteration" from v0.5.0 (GPT-OSS's V2, the row's GBS 1280), and so does GB300's
# DeepSeek-V3 FP8_MX (deepseek_workload_base_configs.py at 0426418: V2 and its GBS15360 variant, the
# rows' two batch sizes). Rows of other
# sources, systems or containers run eager (the parameters' defaults).
RECIPE_PARAMS = ("moe_router_graphed", "moe_layer_graphed")  # what a row's recipe sets (never fitted)
RECIPE_GRAPHS = (
    ("gb200", None, "mxfp8", (26, 6), {"moe_layer_graphed": 1.0}, "whole-iteration CUDA graph"),
    ("gb300", ("deepseek",), "mxfp8", (26, 6), {"moe_layer_graphed": 1.0}, "whole-iteration CUDA graph"),
    ("gb200", ("qwen3", "deepseek"), None, (25, 11), {"moe_router_graphed": 1.0},
     "CUDA graphs over the router and the dispatcher's preprocessing"),
    ("b200", ("qwen3-30b",), None, (25, 11), {"moe_router_graphed": 1.0},
     "CUDA graphs over the router and the dispatcher's preprocessing"),
)


def container_release(row: dict) -> tuple[int, int] | None:
    """(year, month) of the NeMo container a Megatron-Bridge row names ("26.04.01 NeMo Container"), or None."""
    if "megatron-bridge" not in (row.get("source") or "").lower():
        return None
    match = re.search(r"\b(\d\d)\.(\d\d)(?:\.\d\d)? NeMo Container", row.get("table_or_section") or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


# Megatron-MoE-ModelZoo rows whose notes name the run: its command in the source sets the graphs.
# best_practice/qwen3/run_h100_235b.sh at 020b8136b3bc (the commit the rows were read at), the
# H100 cross-node-EP run (DeepEP, TP2 PP8 VPP4 EP32): "--cuda-graph-impl transformer_engine
# --cuda-graph-scope moe_router moe_preprocess". The ModelZoo's other H100 rows give no command
# with graphs (the long-context command has none): eager.
MODELZOO_GRAPHS = (("cross-node ep strategy", {"moe_router_graphed": 1.0},
                    "CUDA graphs over the router and the dispatcher's preprocessing (run_h100_235b.sh)"),)


def moe_graph_params(row: dict, gpu_name: str, precision: str, notes: list[str]) -> dict:
    """Cost parameters of the CUDA graphs a MoE row's recipe runs (``RECIPE_GRAPHS`` for
    Megatron-Bridge, first match; ``MODELZOO_GRAPHS`` by the row's notes), noted; {} for eager rows."""
    if "modelzoo" in (row.get("source") or "").lower():
        text = (row.get("notes") or "").lower()
        for words, params, what in MODELZOO_GRAPHS:
            if words in text:
                notes.append(f"{what}: " + ", ".join(f"{k}={v:g}" for k, v in params.items()))
                return dict(params)
        return {}
    release = container_release(row)
    if release is None:
        return {}
    for system, words, mode, first, params, what in RECIPE_GRAPHS:
        if _recipe_applies((system, words, mode, first), row, gpu_name, precision, release):
            notes.append(f"{what} (Megatron-Bridge {release[0]}.{release[1]:02d} recipe for {system}): "
                         + ", ".join(f"{k}={v:g}" for k, v in params.items()))
            return dict(params)
    return {}
