"""Layout (how one training step is split over GPUs) and JobSpec (what is trained), as data.

``Layout.parse("dp=8,tp=4,pp=2,mbs=1,ckpt=selective")`` and ``str(layout)`` round-trip. Every key
is declared once, as a field of ``Layout`` with its ``KeySpec`` (``plait.spec.layout_keys``): its
kind, allowed values, default and meaning, from which parsing, printing, validation and the
documentation (``layout_keys_markdown()``, docs/layout-keys.md) follow. An omitted degree is 1.
Special syntaxes: ``ckpt=full:4`` (policy and ``ckpt_layers``), ``offload=cpu:0.5`` /
``disk:0.5`` / ``0.5`` (fraction and target), schedule aliases (``zb``, ``interleaved``), and a
default schedule of interleaved-1f1b when vpp > 1.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass

from plait.errors import PlaitError
from plait.spec.ckpt import CKPT_DOC, CKPT_POLICIES, format_ckpt, parse_ckpt
from plait.spec.layout_keys import (
    changed_problems,
    fields_set_by,
    format_value,
    key_specs,
    keys_markdown,
    layout_key,
    parse_value,
    parseable_keys,
    problems,
)
from plait.spec.serialize import dataclass_from_dict, parse_json

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zero-bubble")
SCHEDULE_ALIASES = {"interleaved": "interleaved-1f1b", "zb": "zero-bubble", "zbh1": "zero-bubble",
                    "zero_bubble": "zero-bubble", "interleaved_1f1b": "interleaved-1f1b"}
OFFLOAD_TARGETS = ("cpu", "disk")
PRECISIONS = ("bf16", "fp8", "mxfp8", "nvfp4")
# GEMMs below bf16: fp8 and mxfp8 at the fp8 peak, nvfp4 (NVIDIA's 4-bit with a scale per 16 elements,
# B200/GB200) at the fp4 peak; plait's runtime runs fp8 and mxfp8 (torchao), the planner prices all three
FP8_PRECISIONS = ("fp8", "mxfp8", "nvfp4")
# bytes per element of a tensor stored in each low precision, its scales included: fp8 1; mxfp8 1 and
# an e8m0 scale per 32 elements; nvfp4 4 bits and an fp8 scale per 16 elements
PRECISION_STORED_BYTES = {"fp8": 1.0, "mxfp8": 1.0 + 1.0 / 32, "nvfp4": 0.5 + 1.0 / 16}
ATTENTION_KERNELS = ("flash", "sdpa", "flex", "eager")
NORM_KERNELS = ("fused", "unfused")
LOSS_KERNELS = ("fused", "unfused")
LOSS_CHUNK_TOKENS = 1024  # loss=fused: tokens per cross-entropy chunk (runtime and planner)
CP_IMPLS = ("ring", "allgather", "torch", "ulysses", "p2p")
# the context-parallel kernels plait's runtime runs (``p2p``, Transformer Engine's ring, is planned only)
RUNTIME_CP_IMPLS = ("ring", "allgather", "torch", "ulysses")
PARALLEL_DIMS = ("tp", "cp", "dp", "pp")
SPLITS = ("even", "uneven", "ends")
MOE_OVERLAPS = ("none", "shared", "chunked")


def _default_schedule(vpp: int) -> str:
    return "interleaved-1f1b" if vpp > 1 else "1f1b"


def _parse_offload(raw: str) -> dict:
    target, _, fraction = raw.rpartition(":")
    try:
        value = float(fraction)
    except ValueError:
        raise PlaitError(f"offload={raw!r} must be a fraction, or cpu:FRACTION / disk:FRACTION") from None
    return {"offload": value, "offload_target": target or "cpu"}


def _format_offload(layout: Layout) -> str | None:
    if not layout.offload and layout.offload_target == "cpu":
        return None
    return f"offload={layout.offload_target}:{float(layout.offload)!r}"


def _check_order(order: str) -> str | None:
    if isinstance(order, str) and sorted(order.split("-")) == sorted(PARALLEL_DIMS):
        return None
    return f"must list each of {', '.join(PARALLEL_DIMS)} once, e.g. tp-cp-dp-pp"


def _degree(doc: str):
    return layout_key(1, "int", doc, always=True)


@dataclass(frozen=True)
class Layout:
    """One parallelization layout. Each field's ``KeySpec`` (its metadata) says what it means."""

    dp: int = _degree("data-parallel degree")
    tp: int = _degree("tensor-parallel degree")
    pp: int = _degree("pipeline-parallel degree")
    cp: int = _degree("context-parallel degree")
    vpp: int = layout_key(1, "int", "virtual pipeline stages per GPU (interleaved 1F1B)")
    mbs: int = layout_key(1, "int", "micro-batch size in sequences; gradient accumulation = global batch / (dp·mbs)",
                          always=True)
    zero: int = layout_key(0, "int", "0 DDP, 1 optimizer states sharded, 2 + gradients, 3 + parameters (FSDP)",
                           choices=(0, 1, 2, 3))
    hsdp: int = layout_key(1, "int", "hybrid sharding: replicas; ZeRO shards inside groups of dp/hsdp ranks "
                                     "(1: shard over all of dp)")
    reshard: bool = layout_key(True, "bool", "ZeRO-3 frees gathered parameters after forward (1) or keeps them (0)")
    sp: bool = layout_key(True, "bool", "sequence parallel with tp > 1")
    ckpt: str = layout_key("none", "choice", CKPT_DOC, choices=CKPT_POLICIES, parse=parse_ckpt, format=format_ckpt)
    ckpt_layers: int = layout_key(0, "int", "layers per pipeline stage that `ckpt` checkpoints (0: every layer)",
                                  minimum=0, printed_by="ckpt")
    schedule: str = layout_key("1f1b", "choice", "pipeline schedule", choices=SCHEDULES,
                               aliases=tuple(SCHEDULE_ALIASES.items()),
                               default_from=lambda values: _default_schedule(values.get("vpp", 1)),
                               default_doc="1f1b (interleaved-1f1b when vpp > 1)")
    split: str = layout_key("even", "choice", "`even` (pp·vpp divides n_layers), `uneven` (the most loaded "
                            "stage takes the ceiling) or `ends` (Megatron's account_for_embedding/loss_in_pipeline_"
                            "split: the embedding and the loss each take one layer's place, pp·vpp divides "
                            "n_layers + 2; planned, not run by plait train)", choices=SPLITS)
    offload: float = layout_key(0.0, "fraction", "fraction α of the first stage's layers whose activations go to "
                                "host memory (`cpu:α`) or local disk (`disk:α`); later stages offload less",
                                parse=_parse_offload, format=_format_offload,
                                values_doc="0 to 1, or `cpu:α`, `disk:α`", default_doc="0")
    offload_target: str = layout_key("cpu", "choice", "where offloaded activations go", choices=OFFLOAD_TARGETS,
                                     own_key=False, printed_by="offload", label="offload target")
    opt_offload: bool = layout_key(False, "bool", "optimizer states and step on the host", runtime=False)
    precision: str = layout_key("bf16", "choice", "GEMM precision (`fp8`: the blocks' linear layers in fp8 "
                                "through torchao, tensor-wise scaling; `mxfp8`: the same with a scale per 32 "
                                "elements, MX tensor cores (B200); `nvfp4`: 4-bit GEMMs at the fp4 peak "
                                "(B200/GB200; planned, not run by plait train); embedding, LM head and the rest bf16; "
                                "emulated on CPU)", choices=PRECISIONS)
    attn: str = layout_key("flash", "choice", "attention kernel: `flash` (FlashAttention-2), `sdpa` (what torch's "
                           "scaled_dot_product_attention picks on the device; a sliding window passes it a mask), "
                           "`flex` (FlexAttention: soft-caps, windows, sinks and document masks fused, blocks "
                           "outside the mask skipped), `eager` (materializes the s×s scores); the search picks "
                           "the fastest that runs the model; see docs/planner.md, kernel knobs",
                           choices=ATTENTION_KERNELS)
    norm: str = layout_key("fused", "choice", "RMSNorm/LayerNorm kernel: `fused` (one kernel, saves input + "
                           "statistics) or `unfused` (the eager fp32 op chain)", choices=NORM_KERNELS)
    loss: str = layout_key("unfused", "choice", "cross entropy: `unfused` (full fp32 logits) or `fused` (chunks "
                           f"of {LOSS_CHUNK_TOKENS} tokens, logits recomputed in the backward)",
                           choices=LOSS_KERNELS)
    order: str = layout_key("tp-cp-dp-pp", "special", "rank order, innermost dimension first: decides which "
                            "groups stay inside a node", check=_check_order,
                            values_doc="the four of tp, cp, dp, pp joined by `-`")
    cp_impl: str = layout_key("ring", "choice", "how the runtime's context-parallel attention exchanges K/V: "
                              "`ring` (send/recv around the cp ring; fp32 scores materialized: exact, slow), "
                              "`allgather`, `torch` (PyTorch's ring attention, fused kernels), `ulysses` (all-to-all "
                              "of heads; cp divides n_kv_heads/tp), `p2p` (Transformer Engine's ring: fused kernels, "
                              "K/V at their own heads in bf16; planned, not run by plait train); the planner prices "
                              "each as it runs and the search gives a cp > 1 layout the fastest its stack runs", choices=CP_IMPLS)
    # mixture of experts (plait.spec.moe.parts, plait.plan.moe.memory): ep·etp ranks carved out of tp·cp·dp
    ep: int = layout_key(1, "int", "expert-parallel degree: each MoE layer's routed experts are split over ep "
                         "ranks carved out of tp·cp·dp (Megatron-Core's expert mesh: etp innermost, then ep, then "
                         "expert data parallel = tp·cp·dp/(ep·etp)); 1 for a dense model; plait train carves it out of dp·cp")
    etp: int = layout_key(1, "int", "tensor-parallel degree inside each routed expert (its ffn split by etp); "
                          "plait train runs etp=1 or etp=tp (the etp ranks are the tp ranks)")
    moe_overlap: str = layout_key("none", "choice", "how the expert all-to-all overlaps computation: `none`, "
                                  "`shared` (the dispatch behind the shared experts of the same layer), "
                                  "`chunked` (Comet/FSMoE-style: micro-batch chunks, one chunk's dispatch and "
                                  "combine behind another's expert GEMMs); see plait.plan.moe.timing and "
                                  "plait.run.parallel.expert_overlap", choices=MOE_OVERLAPS)

    def __post_init__(self) -> None:
        wrong = problems(self, LAYOUT_KEYS)
        if wrong:
            raise PlaitError("invalid layout: " + "; ".join(wrong))

    def variant(self, **changes) -> Layout:
        """``dataclasses.replace`` checking only the changed keys (each key on its own, as ``__post_init__``
        does): the search makes ~10^5 layouts that differ from a checked one in a few keys."""
        wrong = changed_problems(changes, LAYOUT_KEYS)
        if wrong:
            raise PlaitError("invalid layout: " + "; ".join(wrong))
        copy = object.__new__(Layout)
        copy.__dict__.update(self.__dict__)
        copy.__dict__.update(changes)
        return copy

    # ------------------------------------------------------------ derived sizes
    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp * self.cp

    @property
    def shard_degree(self) -> int:
        """Ranks that one ZeRO shard group spans (dp / hsdp)."""
        return max(1, self.dp // self.hsdp)

    @property
    def sequence_parallel(self) -> bool:
        return self.sp and self.tp > 1

    @property
    def uses_fsdp(self) -> bool:
        """Whether plait's runtime runs data parallelism through FSDP2 (else DDP, or none): any ZeRO
        stage, and plain data parallelism combined with tp, pp or ep (DDP does not take DTensors)."""
        return self.zero > 0 or (self.dp * self.cp > 1 and (self.tp > 1 or self.pp > 1 or self.ep > 1))

    def micro_batches(self, global_batch: int) -> int:
        """Micro-batches per optimizer step on each data-parallel rank (gradient accumulation)."""
        return max(1, global_batch // (self.dp * self.mbs))

    # ---------------------------------------------------------------- strings
    def __str__(self) -> str:
        return self.to_string()

    def to_string(self) -> str:
        """Canonical ``key=value`` text: the degrees and mbs always, other keys when not default."""
        values = dataclasses.asdict(self)
        parts = []
        for name, (spec, default) in LAYOUT_KEYS.items():
            if spec.printed_by:
                continue
            if spec.format is not None:
                text = spec.format(self)
            else:
                default = spec.default_from(values) if spec.default_from else default
                text = format_value(name, spec, values[name], default)
            if text is not None:
                parts.append(text)
        return ",".join(parts)

    @classmethod
    def parse(cls, text: str) -> Layout:
        """Parse ``"dp=8,tp=4,pp=2,mbs=1,ckpt=selective"`` (see the module docstring)."""
        values: dict = {}
        for item in (part.strip() for part in text.replace(" ", ",").split(",")):
            if not item:
                continue
            if "=" not in item:
                raise PlaitError(f"layout item {item!r} is not key=value (e.g. tp=4)")
            key, raw = (s.strip() for s in item.split("=", 1))
            key = key.lower().replace("-", "_")
            if key not in parseable_keys(LAYOUT_KEYS):
                raise PlaitError(f"unknown layout key {key!r}; known keys: {', '.join(parseable_keys(LAYOUT_KEYS))}")
            if any(name in values for name in fields_set_by(LAYOUT_KEYS, key)):
                raise PlaitError(f"layout key {key!r} given twice")
            values.update(parse_value(key, LAYOUT_KEYS[key][0], raw.lower()))
        if not values:
            raise PlaitError("empty layout: give key=value items, e.g. dp=8,tp=4,pp=2")
        for name, (spec, _) in LAYOUT_KEYS.items():
            if spec.default_from is not None and name not in values:
                values[name] = spec.default_from(values)
        return cls(**values)

    @classmethod
    def parse_fixed(cls, items: list[str]) -> tuple[tuple[str, object], ...]:
        """``plait plan --fix KEY=VALUE`` items as sorted (key, value) pairs for ``SearchConstraints.fixed``.

        Each item is parsed as a layout (so key and value are checked); ``ckpt=full:4`` pins the
        policy only; offload cannot be pinned (the search adds it only where nothing else fits).
        """
        fixed = {}
        for item in items:
            parsed = cls.parse(item)
            key = item.split("=", 1)[0].strip().lower().replace("-", "_")
            if key == "offload":
                raise PlaitError("--fix offload is not supported; evaluate the layout with --layout")
            fixed[key] = getattr(parsed, key)
        return tuple(sorted(fixed.items()))

    # ----------------------------------------------------------- JSON / dict
    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Layout:
        return dataclass_from_dict(cls, data, "layout")

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> Layout:
        return cls.from_dict(parse_json(text))


LAYOUT_KEYS = key_specs(Layout)  # {field: (KeySpec, default)}, read-only


def layout_keys_markdown() -> str:
    """The Markdown table of every layout key (key, values, default, meaning), from the declaration."""
    return keys_markdown(LAYOUT_KEYS)


@dataclass(frozen=True)
class JobSpec:
    """What one optimizer step trains: ``global_batch`` sequences of ``seq_len`` tokens.

    ``doc_len``: packed documents with a document mask (``plait train --doc-mask``, ``plait plan
    --doc-len``): each sequence holds documents of this mean length (tokens), and a token attends
    only within its own; 0 (the default): attention spans the whole sequence."""

    global_batch: int
    seq_len: int
    doc_len: int = 0

    def __post_init__(self) -> None:
        for key, most in (("global_batch", 2**24), ("seq_len", 2**31)):  # 16.7 M sequences, 2.1 G tokens
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise PlaitError(f"{key}={value!r} must be a positive integer")
            if value > most:
                raise PlaitError(f"{key}={value} is more than {most}")
        if not isinstance(self.doc_len, int) or isinstance(self.doc_len, bool) or self.doc_len < 0:
            raise PlaitError(f"doc_len={self.doc_len!r} must be a non-negative integer (0: no document mask)")

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        if not self.doc_len:  # plans without documents read as before
            del data["doc_len"]
        return data

    @classmethod
    def from_dict(cls, data: dict) -> JobSpec:
        return dataclass_from_dict(cls, data, "job")


@dataclass(frozen=True)
class GroupPlacement:
    """Where one parallel dimension's process group lies on the nodes."""

    size: int  # ranks in the group
    stride: int  # distance between consecutive ranks of the group
    nodes: int  # nodes the group touches
    ranks_per_node: int  # ranks of the group inside one node

    @property
    def spans_nodes(self) -> bool:
        return self.nodes > 1


def placement(layout: Layout, gpus_per_node: int) -> dict[str, GroupPlacement]:
    """Placement of the tp, cp, dp and pp groups for ``layout.order`` (innermost first). Ranks are
    numbered node by node, so a dimension whose stride · size reaches past ``gpus_per_node`` spans
    nodes. Computed for the group that holds rank 0 (all groups of a dimension are alike when the
    degrees divide the node size or are multiples of it)."""
    dims = layout.order.split("-")
    return dict(zip(dims, _placements(tuple(getattr(layout, dim) for dim in dims), gpus_per_node)))


@functools.lru_cache(maxsize=4096)
def _placements(sizes: tuple[int, ...], gpus_per_node: int) -> tuple[GroupPlacement, ...]:
    """``placement``'s groups for dimension sizes innermost first (the search asks for the same few)."""
    out, stride = [], 1
    for size in sizes:
        nodes = len({(i * stride) // gpus_per_node for i in range(size)}) if size > 1 else 1
        out.append(GroupPlacement(size, stride, nodes, max(1, size // nodes)))
        stride *= size
    return tuple(out)


def rank_strides(layout: Layout) -> dict[str, int]:
    """{dimension: distance between consecutive ranks along it} in ``layout.order`` (innermost first)."""
    strides, stride = {}, 1
    for dim in layout.order.split("-"):
        strides[dim] = stride
        stride *= getattr(layout, dim)
    return strides


def group_of(layout: Layout, gpus_per_node: int, dims: tuple[str, ...], inner_dp: int | None = None,
             dp_step: int = 1) -> GroupPlacement:
    """Placement of the group holding rank 0 that varies the dimensions ``dims`` together:
    ``inner_dp`` limits the dp extent to its first ``inner_dp`` indices (a hybrid-sharding shard
    group); ``dp_step`` takes every ``dp_step``-th dp index (a hybrid-sharding replica group)."""
    strides = rank_strides(layout)
    ranks = [0]
    for dim in dims:
        count = getattr(layout, dim)
        step = 1
        if dim == "dp":
            count = inner_dp if inner_dp is not None else count // dp_step
            step = dp_step
        ranks = [r + k * step * strides[dim] for r in ranks for k in range(count)]
    size = len(ranks)
    nodes = len({r // gpus_per_node for r in ranks}) if size > 1 else 1
    first_stride = strides[dims[0]] if dims else 1
    return GroupPlacement(size, first_stride, nodes, max(1, size // nodes))
