"""One published-runs CSV row (``shared/data`` schema) -> the planner's inputs, completing what the source omits.

A row needs model dimensions (arch, n_layers, hidden, n_heads), a GPU type, a GPU count, the global
batch and the sequence length; without one of them it is ``incomplete``. Everything else is
completed and every completion is written in the row's notes:

* data fields, by documented defaults per architecture (``DATA_DEFAULTS``): ffn_hidden 4h (GPT)
  or 8h/3 rounded up to a multiple of 256 (Llama); n_kv_heads = n_heads; the vocabulary of a
  preset with the same dimensions (of the one the row's model name names, where several share
  them: Llama 2 and Llama 3 70B), else of the family (GPT 51200: GPT-2's 50257 padded as
  Megatron-LM pads it; Llama 3 128256; other Llama 32000); 8 GPUs per node; FlashAttention.
* layout knobs (``plait.plan.complete``): the missing one of tp/pp/dp is the GPU count's rest;
  anything else left open (the tp/pp split of a stated model-parallel size, micro-batch, ZeRO
  stage, recompute policy and layer count, sp, schedule and vpp, cp) is searched, and the fastest
  layout that fits is taken: ``completed: mbs=1, zero=1, ckpt=selective — fastest that fits``.

Cells in words are read where their meaning is clear (``zero_stage_of``, ``recompute_of``:
"1 (distributed optimizer)", "BF16Optimizer's own ZeRO-1", "full shard", "FSDP", "op-level SAC")
and otherwise treated as unknown (then searched, and the note says the cell was not understood).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Callable

from plait.errors import PlaitError
from plait.measure.validate.cells import (arch_of, fsdp_on, integer, local_batch_of, not_sharded, num,
                                          offloaded_layers, precision_of, recompute_of, schedule_of, zero_stage_of)
from plait.measure.validate.compiled import compile_params
from plait.measure.validate.loss import loss_params
from plait.measure.validate.moe import (MoERowError, is_moe_row, moe_given, moe_gpu_type, moe_graph_params,
                                         moe_model_for_row, nvlink_domain)
from plait.measure.validate.stacks import stack_of
from plait.plan.activations import BF16, layer_items
from plait.plan.complete import complete
from plait.plan.memory import MemoryBreakdown, estimate_memory, in_flight_microbatches
from plait.plan.params import DEFAULT_PARAMS, CostParams, measured_fields, params_for_stack
from plait.spec.hardware import ClusterSpec, cluster_for_gpu, get_gpu
from plait.spec.layout import JobSpec, Layout
from plait.spec.model import ModelSpec
from plait.spec.models import MODELS
from plait.spec.stack import Stack, generation_of, left_out_defaults
from plait.spec.validate import errors_of, stage_layers, validate

COUNT_COLUMNS = ("n_layers", "hidden", "ffn_hidden", "n_heads", "n_kv_heads", "vocab", "seq_len", "n_gpus", "tp",
                 "pp", "dp", "mbs", "gbs", "cp", "vpp", "ep", "gpus_per_node")
DATA_DEFAULTS = {"gpt_vocab": 51200, "llama3_vocab": 128256, "llama_vocab": 32000, "gpus_per_node": 8,
                 "llama_ffn_multiple": 256}


# zero-bubble is opt-in in every framework the sources ran: a source that does not name it ran 1F1B
# or, with virtual stages, interleaved 1F1B
SOURCE_SCHEDULES = ("1f1b", "interleaved-1f1b")


class IncompleteRow(Exception):
    """A published row lacks an input plait cannot complete (model dims, GPU, count, batch, seq_len)."""


class UnsupportedRow(Exception):
    """A published row describes something plait does not model (a GPU without a spec, EP, a broken rule)."""


def row_problem(row: dict) -> str | None:
    """Why a CSV row cannot be read (a short or long row, a count that is not a positive integer), or None."""
    if None in row or None in row.values():
        return f"the row has {'more' if None in row else 'fewer'} fields than the header"
    bad = [key for key in COUNT_COLUMNS if _count_text(row.get(key) or "") is False]
    return f"{bad[0]}={row[bad[0]].strip()!r} must be a positive integer" if bad else None


def _count_text(text: str) -> bool | None:
    """None when blank, else whether ``text`` is a positive integer (``8``, ``8.0``, ``1e3``)."""
    try:
        return float(text) >= 1 and float(text).is_integer() if text.strip() else None
    except ValueError:
        return False


def _llama_ffn(hidden: int) -> int:
    multiple = DATA_DEFAULTS["llama_ffn_multiple"]
    return -(-int(2 * 4 * hidden / 3) // multiple) * multiple


def same_dims_preset(arch: str, dims: dict, model_name: str):
    """The preset of ``arch`` with the dimensions ``dims``, or None; where several share them (Llama 2 and
    Llama 3 70B differ only in their vocabulary), the one whose name the row's ``model_name`` names
    ("LLAMA3_70B", "Llama 3.1 70B" -> llama3-70b; "Llama 2 70B" -> llama2-70b), else the first."""
    same = [m for m in MODELS.values() if m.arch == arch and all(getattr(m, k) == v for k, v in dims.items())]
    family = re.search(r"(llama|mixtral|qwen|mistral|gpt)[\s_.-]*(\d?)", model_name.lower())
    if family:
        stem = family.group(1) + family.group(2)
        named = [m for m in same if re.sub(r"[^a-z0-9]", "", m.name).startswith(stem)]
        same = named + [m for m in same if m not in named]
    return same[0] if same else None


def model_for_row(row: dict, seq_len: int, notes: list[str]) -> ModelSpec:
    """The model of a row; omitted ffn_hidden, n_kv_heads and vocab get ``DATA_DEFAULTS`` (noted)."""
    arch = (row.get("arch") or "").strip().lower()
    dims = dict(n_layers=integer(row, "n_layers"), hidden=integer(row, "hidden"), n_heads=integer(row, "n_heads"))
    missing = [k for k, v in dims.items() if v is None] + ([] if arch else ["arch"])
    if missing:
        raise IncompleteRow(f"model dimensions not given ({', '.join(missing)})")
    if arch not in ("gpt", "llama"):
        family = arch_of(arch)
        if family is None:
            raise UnsupportedRow(f"arch {arch!r} (plait models gpt and llama)")
        notes.append(f"arch {arch!r} read as {family}")
        arch = family
    ffn, kv = integer(row, "ffn_hidden"), integer(row, "n_kv_heads")
    if ffn is None:
        ffn = 4 * dims["hidden"] if arch == "gpt" else _llama_ffn(dims["hidden"])
        notes.append(f"ffn_hidden {ffn} by the {'GPT 4h' if arch == 'gpt' else 'Llama 8h/3 (rounded up to 256)'} rule")
    if kv is None:
        kv = dims["n_heads"]
        notes.append("n_kv_heads = n_heads assumed")
    dims.update(ffn_hidden=ffn, n_kv_heads=kv)
    vocab = integer(row, "vocab")
    if vocab is None:
        name = (row.get("model_name") or "").lower()
        llama3 = re.search(r"llama[\s-]*3", name) is not None
        preset = same_dims_preset(arch, dims, name)
        if preset is not None:
            vocab = preset.vocab
            notes.append(f"vocab {vocab} from preset {preset.name}")
        else:
            vocab = DATA_DEFAULTS["gpt_vocab" if arch == "gpt" else "llama3_vocab" if llama3 else "llama_vocab"]
            family = "GPT" if arch == "gpt" else "Llama 3" if llama3 else "Llama"
            notes.append(f"vocab {vocab} of the {family} family assumed")
    return ModelSpec(name=row["id"], arch=arch, vocab=vocab, max_seq_len=max(seq_len, 2048),
                     tied_embeddings=(arch == "gpt"), **dims)


def op_level_memory(model: ModelSpec, job: JobSpec, layout: Layout, memory: MemoryBreakdown,
                    params: CostParams, runtime: str) -> MemoryBreakdown:
    """``memory`` with the activations of torchtitan's op-level selective checkpointing on every layer.

    The policy saves the output of every second matmul of a layer (wq, wv, w1, w2 of
    q, k, v, o, w1, w3, w2), the attention kernel's output and log-sum-exp, and the layer input;
    it recomputes the rest. The layout's ``ckpt=full:L/2`` stands for its recompute time only.
    """
    items = layer_items(model, replace(layout, ckpt="none", ckpt_layers=0), job.seq_len, runtime=runtime)
    s_b = job.seq_len / layout.cp * layout.mbs
    kept = (items["attn_norm_input"] + items["q"] + items["kv"] / 2 + items["mlp_up"] / 2
            + BF16 * s_b * model.hidden / layout.tp + items["attn_out"] + items.get("attn_lse", 0.0))
    in_flight = in_flight_microbatches(layout, layout.micro_batches(job.global_batch))
    in_flight = in_flight if memory.stage in ("first", "only") or layout.schedule == "gpipe" else 1.0
    # every layer keeps ``kept``; the one being recomputed holds all of its tensors again
    activations = kept * stage_layers(model, layout) * layout.vpp * in_flight + sum(items.values()) - kept
    dynamic_old = memory.fragmentation / params.fragmentation if params.fragmentation else 0.0
    dynamic = dynamic_old - memory.activations + activations
    return replace(memory, activations=activations, fragmentation=params.fragmentation * dynamic)


@dataclass
class RowSpecs:
    model: ModelSpec
    cluster: ClusterSpec
    job: JobSpec
    layout: Layout
    runtime: str
    memory_of: Callable | None  # adjusts a predicted MemoryBreakdown (op-level SAC), or None
    stack: Stack | None = None  # the software the row ran (its cost parameters are in ``params``)
    params: CostParams = DEFAULT_PARAMS  # the caller's parameters with the stack's on top


def _required(row: dict, notes: list[str], stack: Stack) -> tuple[int, int, int]:
    """(seq_len, n_gpus, global batch). A blank seq_len is the stack's own run configs' (``Stack.run_value``);
    a blank global batch is dp times the local batch the notes state ("local batch size 8"; the software
    accumulates no gradients across steps then) or, without one, times one micro-batch."""
    seq_len, n_gpus, gbs = integer(row, "seq_len"), integer(row, "n_gpus"), integer(row, "gbs")
    dp, mbs = integer(row, "dp"), integer(row, "mbs")
    if seq_len is None and stack.run_value("seq_len")[0] is not None:
        seq_len = int(stack.run_value("seq_len")[0])
        notes.append(f"seq_len={seq_len} assumed: the {stack.name} stack's run configs ({stack.run_value('seq_len')[1]})")
    local = local_batch_of(row.get("notes") or "")
    if gbs is None and dp is not None and local is not None:
        gbs = dp * local
        notes.append(f"global batch = dp x the local batch size the notes state ({dp} x {local} = {gbs})")
    elif gbs is None and dp is not None and mbs is not None:
        gbs = dp * mbs
        notes.append(f"global batch not given: one micro-batch per rank ({gbs})")
    for value, what in ((seq_len, "seq_len"), (n_gpus, "n_gpus"), (gbs, "global batch (gbs)")):
        if value is None:
            raise IncompleteRow(f"{what} not given")
    if not (row.get("gpu_type") or "").strip():
        raise IncompleteRow("gpu_type not given")
    return seq_len, n_gpus, gbs


def row_specs(row: dict, notes: list[str], params: CostParams = DEFAULT_PARAMS) -> RowSpecs:
    """The planner's inputs for one row, completing what the source omits (each completion noted)."""
    stack, why = stack_of(row)
    seq_len, n_gpus, gbs = _required(row, notes, stack)
    if is_moe_row(row):  # mixture of experts: plait.measure.validate.moe
        try:
            model = moe_model_for_row(row, seq_len, notes)
        except MoERowError as exc:
            raise UnsupportedRow(str(exc)) from None
    else:
        model = model_for_row(row, seq_len, notes)
        if stack.run_value("dropout")[0] and not model.dropout:
            model = replace(model, dropout=True)
            notes.append(f"dropout: the {stack.name} stack's runs keep their model's dropout layers (its [run] dropout)")
    if (integer(row, "ep") or 1) > 1 and model.moe is None:
        raise UnsupportedRow("expert parallelism on a dense model")
    try:
        gpu = get_gpu(moe_gpu_type(row, notes))
    except PlaitError:
        raise UnsupportedRow(f"GPU {row['gpu_type']!r} has no spec") from None
    per_node = nvlink_domain(row, gpu.name, notes) or integer(row, "gpus_per_node")
    if per_node is None:
        per_node = DATA_DEFAULTS["gpus_per_node"]
        notes.append("8 GPUs per node assumed")
    cluster = cluster_for_gpu(gpu.name, n_gpus, per_node)
    notes.append(f"stack {stack.name} ({why})")
    params = params_for_stack(stack, params, keep=measured_fields(params))  # a calibration's numbers win
    if generation_of(gpu.name) in stack.attention_efficiency:
        cluster = replace(cluster, gpu=stack.gpu(cluster.gpu))
        notes.append(f"attention: {stack.attention_kernel}, {cluster.gpu.attention_efficiency:g} of the peak")
    job = JobSpec(global_batch=gbs, seq_len=seq_len)
    runtime = stack.runtime
    given = _given_knobs(row, model, n_gpus, notes, stack)
    _pipeline_microbatches(given, gbs, stack, notes)
    op_level = given.pop("_op_level", False)
    if model.moe is not None:  # the CUDA graphs of the row's recipe
        params = replace(params, **moe_graph_params(row, gpu.name, given.get("precision", "bf16"), notes))
    params = replace(params, **compile_params(row, stack, notes))  # torch.compile, where the notes say so
    params = replace(params, **loss_params(row, stack, notes))  # the recipe's cross-entropy kernel

    def memory_of(layout: Layout, memory: MemoryBreakdown) -> MemoryBreakdown:
        return op_level_memory(model, job, layout, memory, params, runtime)

    adjust = memory_of if op_level else None
    assumed_ckpt = given.pop("_stack_ckpt", False)
    layout, fits, note = _layout_of(model, cluster, job, given, params, runtime, adjust)
    if assumed_ckpt and not fits:
        # the stack's recompute default is a library's; a recipe that does not fit without recompute had its
        # own: the row's recompute is searched with its other open knobs (the data's rule for a blank cell)
        given.pop("ckpt"), given.pop("ckpt_layers", None)
        notes[:] = [n for n in notes if not n.startswith("completed: ckpt=")]
        notes.append(f"the {stack.name} stack's ckpt={layout.ckpt} does not fit: recompute searched")
        layout, fits, note = _layout_of(model, cluster, job, given, params, runtime, adjust)
    if note is not None:
        notes.append(note)
    errs = errors_of(validate(model, cluster, job, layout))
    if errs:
        raise UnsupportedRow("; ".join(e.message for e in errs))
    return RowSpecs(model, cluster, job, layout, runtime, adjust, stack, params)


def _layout_of(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, given: dict, params: CostParams, runtime: str,
               memory_of) -> tuple[Layout, bool, str | None]:
    """The row's layout, whether it fits (an invalid stated layout counts as fitting: its error is the row's),
    and the completion's note (None when every knob was stated). A completion searches the open knobs
    (``plait.plan.complete`` with the sources' schedules); its refusal is the row's."""
    if all(k in given for k in ("tp", "pp", "dp", "cp", "mbs", "zero", "ckpt", "sp", "vpp")):
        split = given.get("split") or ("even" if model.n_layers % (given["pp"] * given["vpp"]) == 0 else "uneven")
        layout = Layout(**dict(given, split=split))
        fits = bool(errors_of(validate(model, cluster, job, layout))) or \
            estimate_memory(model, cluster, job, layout, params, runtime=runtime).fits
        return layout, fits, None
    try:
        completion = complete(model, cluster, job, given, params, runtime=runtime, memory_of=memory_of,
                              schedules=SOURCE_SCHEDULES)
    except PlaitError as exc:
        raise UnsupportedRow(str(exc)) from None
    return completion.layout, completion.fits, completion.note()


def _pipeline_microbatches(given: dict, gbs: int, stack: Stack, notes: list[str]) -> None:
    """A blank micro-batch size under pipeline parallelism: the local batch split into as many micro-batches as
    the stack's run configs say (``pp_microbatches`` = "pp": one per pipeline stage)."""
    pp, dp = given.get("pp", 1), given.get("dp")
    if "mbs" in given or pp <= 1 or dp is None or stack.run_value("pp_microbatches")[0] != "pp":
        return
    local = gbs // dp
    if gbs % dp == 0 and local % pp == 0:
        given["mbs"] = local // pp
        notes.append(f"mbs={given['mbs']}: the local batch of {local} in {pp} micro-batches, one per pipeline stage "
                     f"(the {stack.name} stack's run configs)")


def _given_knobs(row: dict, model: ModelSpec, n_gpus: int, notes: list[str], stack: Stack) -> dict:
    """The layout keys the row states ({Layout field: value}), then ``stack``'s defaults for the knobs
    it leaves out (each noted); the others are left to completion."""
    given: dict = {k: v for k in ("tp", "pp", "dp", "cp", "vpp", "mbs", "ep", "etp") if (v := integer(row, k)) is not None}
    if model.moe is not None and "etp" not in given:
        given["etp"] = 1
        notes.append("etp=1 assumed (not stated)")
    degrees = ("tp", "pp", "dp")
    if "cp" not in given and all(k in given for k in degrees):
        product = given["tp"] * given["pp"] * given["dp"]
        if n_gpus % product == 0:
            given["cp"] = n_gpus // product
    missing = [k for k in degrees if k not in given]
    if len(missing) == 1 and "cp" in given:
        rest = math.prod(given[k] for k in degrees if k in given) * given["cp"]
        if n_gpus % rest == 0:
            given[missing[0]] = n_gpus // rest
            notes.append(f"{missing[0]}={given[missing[0]]} from n_gpus/({'·'.join(k for k in degrees if k != missing[0])}·cp)")
    schedule = schedule_of(row.get("notes") or "") if given.get("pp", 1) > 1 and "vpp" not in given else None
    if schedule == "1f1b":  # a schedule the source names: one stage per rank
        given["vpp"] = 1
        notes.append("vpp=1: the notes name the 1F1B schedule")
    if "vpp" in given:
        given["schedule"] = "interleaved-1f1b" if given["vpp"] > 1 else "1f1b"
    elif given.get("pp") == 1:
        given.update(vpp=1, schedule="1f1b")
    if "pp" in given and given["pp"] > 1:  # Megatron counting the embedding and the loss as pipeline layers
        chunks = given["pp"] * given.get("vpp", 1)
        stated = "account_for_embedding" in (row.get("notes") or "")
        if stated or (stack.name == "megatron-core" and model.n_layers % chunks and (model.n_layers + 2) % chunks == 0):
            given["split"] = "ends"
            notes.append("split=ends: the embedding and the loss take one pipeline layer's place each ("
                         + ("the notes" if stated else "pp·vpp divides n_layers + 2, as Megatron-Bridge's recipes "
                            "set account_for_embedding/loss_in_pipeline_split") + ")")
    defaults = stack.default_values()
    text = (row.get("zero_stage") or "").strip()
    if not text and fsdp_on(row.get("notes") or ""):
        text = "fsdp"  # the source's FSDP column: Megatron-FSDP runs optim_grads_params (cells.fsdp_on)
        notes.append("zero=3: FSDP=On in the notes (Megatron-FSDP shards parameters, gradients and optimizer)")
    zero = zero_stage_of(text)
    if zero is not None:
        given["zero"] = zero[0]
        if not zero[1]:
            given["hsdp"] = 1
    elif not_sharded(text):  # DDP: Megatron's with its distributed optimizer (ZeRO-1), else plain (0)
        given["zero"] = 1 if defaults.get("zero") == 1 else 0
        notes.append(f"zero_stage {text!r} (no FSDP): zero={given['zero']}"
                     + (f", the {stack.name} stack's distributed optimizer" if given["zero"] else ""))
    elif text:
        notes.append(f"zero_stage {text!r} not understood: searched")
    per_stage = -(-model.n_layers // given["pp"]) if "pp" in given else model.n_layers
    selective = stack.run_value("selective")[0] or "modules"
    recompute = recompute_of(row.get("recompute") or "", per_stage, selective)
    if recompute is not None and recompute[2] and selective == "op" and (row.get("recompute") or "").strip().lower() == "selective":
        notes.append(f"recompute 'selective' read as per-op selective checkpointing: the {stack.name} stack's run configs")
    if recompute is not None:
        given.update(ckpt=recompute[0], ckpt_layers=recompute[1], _op_level=recompute[2])
    elif (row.get("recompute") or "").strip():
        notes.append(f"recompute {row['recompute'].strip()!r} not understood: searched")
    if model.moe is not None:  # Megatron's recompute modules, the all-to-all overlap
        given.update(moe_given(row, notes))
    sp = (row.get("seq_parallel") or "").strip().lower()
    if sp in ("yes", "no") or given.get("tp") == 1:
        given["sp"] = sp == "yes" or given.get("tp") == 1
    flash = (row.get("flash_attn") or "").strip().lower()
    if not flash:
        notes.append("FlashAttention assumed")
    given["attn"] = "eager" if flash == "no" else "flash"
    if given.get("cp", 1) > 1:  # ring attention with fused kernels per block (Transformer Engine,
        # PyTorch's): plait's cp_impl=torch, not its fp32 reference kernel (plait.plan.context.exchange)
        given["cp_impl"] = defaults.get("cp_impl", "torch")
    given["precision"] = precision_of(row.get("precision") or "")
    offloaded = offloaded_layers(row.get("notes") or "")
    if offloaded:
        given["offload"] = min(1.0, offloaded / model.n_layers)
        notes.append(f"activation offload of {offloaded} layers (notes): offload=cpu:{given['offload']:.3g}")
    # what the stack does where the row is silent; cp_impl is decided above, sp without a stated tp is searched
    taken = left_out_defaults(stack, given, moot=("cp_impl", *(() if "tp" in given else ("sp",))))
    given.update(taken)
    if "ckpt" in taken:
        given["_stack_ckpt"] = True
    notes.extend(f"completed: {knob}={value} (the {stack.name} stack's default)"
                 for knob, value in taken.items() if knob != "ckpt_layers")
    return given
