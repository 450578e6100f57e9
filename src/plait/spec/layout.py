"""Layout (how one training step is split over GPUs) and JobSpec (what is trained), as data.

``Layout.parse("dp=8,tp=4,pp=2,mbs=1,ckpt=selective")`` and ``str(layout)`` round-trip.
Keys (an omitted degree is 1; other keys take the defaults below):

  dp, tp, pp, cp   data, tensor, pipeline and context parallel degrees
  vpp              virtual pipeline stages per GPU (interleaved schedule); default 1
  mbs              micro-batch size in sequences; default 1
  zero             0 = DDP, 1 = optimizer states sharded, 2 = + gradients, 3 = + parameters
                   (FSDP); default 0
  hsdp             replicate degree of hybrid sharding: ZeRO shards inside groups of dp/hsdp
                   ranks, groups are replicas; default 1 (shard over all of dp)
  reshard          ZeRO-3: free gathered parameters after forward (1) or keep them (0); default 1
  sp               sequence parallel with tensor parallel (1/0); default 1
  ckpt             activation checkpointing none | selective | balanced | full; ``ckpt=full:4``
                   checkpoints 4 layers per pipeline stage (same as ``ckpt_layers=4``); default none
  schedule         gpipe | 1f1b | interleaved-1f1b | zero-bubble; default 1f1b
                   (interleaved-1f1b when vpp > 1)
  split            even (pp·vpp divides n_layers) | uneven (the most loaded stage takes the
                   ceiling); default even
  offload          fraction of a stage's layers whose activations go to host memory, or
                   ``cpu:0.5`` / ``disk:0.5`` for the target; default 0
  opt_offload      optimizer states and step on the host (1/0); default 0
  precision        bf16 | fp8 (fp8 GEMMs, bf16 elsewhere); default bf16
  attn             flash | eager (eager materializes the s×s scores); default flash
  order            rank order, innermost dimension first; default tp-cp-dp-pp
  cp_impl          how the runtime's context-parallel attention exchanges K/V: ring (send/recv
                   around the cp ring) | allgather | torch (PyTorch's own ring attention) |
                   ulysses (all-to-all of heads; cp must divide n_kv_heads/tp); default ring
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from plait.errors import PlaitError
from plait.spec.serialize import dataclass_from_dict

CKPT_POLICIES = ("none", "selective", "balanced", "full")
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zero-bubble")
SCHEDULE_ALIASES = {"interleaved": "interleaved-1f1b", "zb": "zero-bubble", "zbh1": "zero-bubble",
                    "zero_bubble": "zero-bubble", "interleaved_1f1b": "interleaved-1f1b"}
OFFLOAD_TARGETS = ("cpu", "disk")
PRECISIONS = ("bf16", "fp8")
ATTENTION_KERNELS = ("flash", "eager")
CP_IMPLS = ("ring", "allgather", "torch", "ulysses")
PARALLEL_DIMS = ("tp", "cp", "dp", "pp")
_TRUE = {"1", "true", "yes", "on", "y"}
_FALSE = {"0", "false", "no", "off", "n"}


@dataclass(frozen=True)
class Layout:
    """One parallelization layout. See the module docstring for every key."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    vpp: int = 1
    mbs: int = 1
    zero: int = 0
    hsdp: int = 1
    reshard: bool = True
    sp: bool = True
    ckpt: str = "none"
    ckpt_layers: int = 0  # 0: every layer of the stage
    schedule: str = "1f1b"
    split: str = "even"
    offload: float = 0.0
    offload_target: str = "cpu"
    opt_offload: bool = False
    precision: str = "bf16"
    attn: str = "flash"
    order: str = "tp-cp-dp-pp"
    cp_impl: str = "ring"

    def __post_init__(self) -> None:
        problems = []
        for key in ("dp", "tp", "pp", "cp", "vpp", "mbs", "hsdp"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                problems.append(f"{key}={value!r} must be a positive integer")
        if self.zero not in (0, 1, 2, 3):
            problems.append(f"zero={self.zero!r} must be 0, 1, 2 or 3")
        if self.ckpt not in CKPT_POLICIES:
            problems.append(f"ckpt={self.ckpt!r} must be one of {', '.join(CKPT_POLICIES)}")
        if not isinstance(self.ckpt_layers, int) or self.ckpt_layers < 0:
            problems.append(f"ckpt_layers={self.ckpt_layers!r} must be a non-negative integer")
        if self.schedule not in SCHEDULES:
            problems.append(f"schedule={self.schedule!r} must be one of {', '.join(SCHEDULES)}")
        if self.split not in ("even", "uneven"):
            problems.append(f"split={self.split!r} must be even or uneven")
        if not (0.0 <= float(self.offload) <= 1.0):
            problems.append(f"offload={self.offload!r} must be a fraction between 0 and 1")
        if self.offload_target not in OFFLOAD_TARGETS:
            problems.append(f"offload target {self.offload_target!r} must be cpu or disk")
        if self.precision not in PRECISIONS:
            problems.append(f"precision={self.precision!r} must be one of {', '.join(PRECISIONS)}")
        if self.attn not in ATTENTION_KERNELS:
            problems.append(f"attn={self.attn!r} must be flash or eager")
        if self.cp_impl not in CP_IMPLS:
            problems.append(f"cp_impl={self.cp_impl!r} must be one of {', '.join(CP_IMPLS)}")
        if sorted(self.order.split("-")) != sorted(PARALLEL_DIMS):
            problems.append(f"order={self.order!r} must list each of {', '.join(PARALLEL_DIMS)} once, e.g. tp-cp-dp-pp")
        if problems:
            raise PlaitError("invalid layout: " + "; ".join(problems))

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

    def micro_batches(self, global_batch: int) -> int:
        """Micro-batches per optimizer step on each data-parallel rank (gradient accumulation)."""
        return max(1, global_batch // (self.dp * self.mbs))

    # ---------------------------------------------------------------- strings
    def __str__(self) -> str:
        return self.to_string()

    def to_string(self) -> str:
        """Canonical ``key=value`` text: the degrees always, other keys when not default."""
        defaults = Layout()
        parts = [f"dp={self.dp}", f"tp={self.tp}", f"pp={self.pp}", f"cp={self.cp}"]
        if self.vpp != 1:
            parts.append(f"vpp={self.vpp}")
        parts.append(f"mbs={self.mbs}")
        if self.zero:
            parts.append(f"zero={self.zero}")
        if self.hsdp != 1:
            parts.append(f"hsdp={self.hsdp}")
        if not self.reshard:
            parts.append("reshard=0")
        if not self.sp:
            parts.append("sp=0")
        if self.ckpt != "none" or self.ckpt_layers:
            parts.append(f"ckpt={self.ckpt}" + (f":{self.ckpt_layers}" if self.ckpt_layers else ""))
        if self.schedule != _default_schedule(self.vpp):
            parts.append(f"schedule={self.schedule}")
        if self.split != defaults.split:
            parts.append(f"split={self.split}")
        if self.offload or self.offload_target != defaults.offload_target:
            parts.append(f"offload={self.offload_target}:{float(self.offload)!r}")
        if self.opt_offload:
            parts.append("opt_offload=1")
        if self.precision != defaults.precision:
            parts.append(f"precision={self.precision}")
        if self.attn != defaults.attn:
            parts.append(f"attn={self.attn}")
        if self.order != defaults.order:
            parts.append(f"order={self.order}")
        if self.cp_impl != defaults.cp_impl:
            parts.append(f"cp_impl={self.cp_impl}")
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
            if key in values or (key == "ckpt" and "ckpt_layers" in values):
                raise PlaitError(f"layout key {key!r} given twice")
            values.update(_parse_item(key, raw.lower()))
        if not values:
            raise PlaitError("empty layout: give key=value items, e.g. dp=8,tp=4,pp=2")
        if "schedule" not in values:
            values["schedule"] = _default_schedule(values.get("vpp", 1))
        return cls(**values)

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
        return cls.from_dict(json.loads(text))


def _default_schedule(vpp: int) -> str:
    return "interleaved-1f1b" if vpp > 1 else "1f1b"


def _as_int(key: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise PlaitError(f"layout key {key}={raw!r} must be an integer") from None


def _as_bool(key: str, raw: str) -> bool:
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise PlaitError(f"layout key {key}={raw!r} must be 1/0 (or true/false)")


def _parse_item(key: str, raw: str) -> dict:
    if key in ("dp", "tp", "pp", "cp", "vpp", "mbs", "zero", "hsdp", "ckpt_layers"):
        return {key: _as_int(key, raw)}
    if key in ("sp", "reshard", "opt_offload"):
        return {key: _as_bool(key, raw)}
    if key == "ckpt":
        policy, _, layers = raw.partition(":")
        out = {"ckpt": policy}
        if layers:
            out["ckpt_layers"] = _as_int("ckpt layers", layers)
        return out
    if key == "schedule":
        return {"schedule": SCHEDULE_ALIASES.get(raw, raw)}
    if key == "offload":
        target, _, fraction = raw.rpartition(":")
        try:
            value = float(fraction)
        except ValueError:
            raise PlaitError(f"offload={raw!r} must be a fraction, or cpu:FRACTION / disk:FRACTION") from None
        return {"offload": value, "offload_target": target or "cpu"}
    if key in ("precision", "attn", "order", "split", "cp_impl"):
        return {key: raw}
    raise PlaitError(
        f"unknown layout key {key!r}; known keys: dp, tp, pp, cp, vpp, mbs, zero, hsdp, reshard, sp, "
        "ckpt, ckpt_layers, schedule, split, offload, opt_offload, precision, attn, order, cp_impl"
    )


@dataclass(frozen=True)
class JobSpec:
    """What one optimizer step trains: ``global_batch`` sequences of ``seq_len`` tokens."""

    global_batch: int
    seq_len: int

    def __post_init__(self) -> None:
        for key in ("global_batch", "seq_len"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise PlaitError(f"{key}={value!r} must be a positive integer")

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

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
    """Placement of the tp, cp, dp and pp groups for ``layout.order`` (innermost first).

    Ranks are numbered node by node, so a dimension whose stride · size reaches past
    ``gpus_per_node`` spans nodes. Computed for the group that holds rank 0 (all groups of a
    dimension are alike when the degrees divide the node size or are multiples of it).
    """
    out: dict[str, GroupPlacement] = {}
    stride = 1
    for dim in layout.order.split("-"):
        size = getattr(layout, dim)
        nodes = len({(i * stride) // gpus_per_node for i in range(size)}) if size > 1 else 1
        out[dim] = GroupPlacement(size, stride, nodes, max(1, size // nodes))
        stride *= size
    return out


def group_of(layout: Layout, gpus_per_node: int, dims: tuple[str, ...], inner_dp: int | None = None,
             dp_step: int = 1) -> GroupPlacement:
    """Placement of the group holding rank 0 that varies the dimensions ``dims`` together.

    ``inner_dp`` limits the dp extent to its first ``inner_dp`` indices (a hybrid-sharding shard
    group); ``dp_step`` takes every ``dp_step``-th dp index (a hybrid-sharding replica group).
    """
    strides, stride = {}, 1
    for dim in layout.order.split("-"):
        strides[dim] = stride
        stride *= getattr(layout, dim)
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
