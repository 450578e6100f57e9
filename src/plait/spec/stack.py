"""Software stacks as data: what the training software does, as opposed to what the hardware can.

The same layout on the same GPUs runs at different speeds under different software: Megatron-Core
with Transformer Engine fuses the norms into the next GEMM, runs cuDNN's fused attention, overlaps
the interleaved schedule's send/recv and shards the optimizer by default; plait's own runtime (PyTorch
eager modules, FSDP2, torch.distributed.pipelining) does less of that. A ``Stack`` names those
behaviours with a number and a source each, and the planner prices a layout *for* a stack
(``plait plan --stack NAME``; ``plait validate`` picks each published row's stack from its source).

A stack is a small TOML file (``plait/data/stacks/NAME.toml``, or any path given to ``--stack``)::

    name = "megatron-core"
    summary = "..."
    runtime = "megatron"        # whose saved activations and pipeline buffers: torch | megatron
    attention_kernel = "..."    # words, for people
    [attention_efficiency]      # by GPU generation (a100, h100, b200): fraction of the bf16 peak
    h100 = { value = 0.45, source = "..." }
    [params]                    # cost parameters that describe the software (``STACK_PARAMS``)
    elementwise_passes = { value = 20, source = "..." }
    [defaults]                  # the knobs a run leaves out (``STACK_DEFAULTS``)
    zero = { value = 1, source = "..." }
    [run]                       # what the software's own configs set for a run (``STACK_RUN``)
    seq_len = { value = 8192, source = "..." }

Every number carries its source: a stack is documentation of the software, not a fitted fudge
factor per run. Values are checked when the planner applies them (``plait.plan.params``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from plait.errors import PlaitError
from plait.spec.hardware import GPU_GENERATIONS as GENERATIONS, GpuSpec
from plait.spec.layout import CKPT_POLICIES, CP_IMPLS, RUNTIME_CP_IMPLS
from plait.spec.serialize import toml_module

STACKS_DIR = Path(__file__).resolve().parents[1] / "data" / "stacks"
DEFAULT_STACK = "plait"
RUNTIMES = ("torch", "megatron", "megatron-core")
# Cost parameters a stack may set: each describes what the software does (kernels it fuses, what it
# overlaps, what it launches per micro-batch), never what the hardware can (``plait.plan.params``).
STACK_PARAMS = ("elementwise_passes", "tp_comm_overlap", "tp_forward_overlap", "pp_comm_overlap", "dp_overlap", "microbatch_overhead_s",
                "step_overhead_s", "fp8_gemm_efficiency", "fp8_cast_passes", "zero3_collective_bandwidth",
                "zero3_live_params", "zero3_bucket_params", "loss_peak_bytes",
                "flash_backward_factor", "fragmentation", "moe_router_graphed", "moe_layer_graphed",
                "compiled_blocks", "compile_rules")
# Layout knobs a stack fills in when a run does not state them, and the values each may take.
STACK_DEFAULTS = {"zero": (0, 1, 2, 3), "ckpt": CKPT_POLICIES, "sp": (True, False), "cp_impl": CP_IMPLS}
# What the software's own configs set for a run that a published source describes without it (read by
# ``plait validate``): ``seq_len`` (tokens), ``pp_microbatches`` ("pp": a step's local batch is split into
# as many micro-batches as pipeline stages) and ``selective`` (what the word "selective" recompute means
# there: "op", per-op selective checkpointing, or "modules", Megatron's list of recomputed modules) and
# ``dropout`` (whether the software's model keeps its dropout layers: their masks and outputs are saved
# activations and their passes are priced, ``ModelSpec.dropout``).
STACK_RUN = {"seq_len": int, "pp_microbatches": ("pp",), "selective": ("op", "modules"), "dropout": (True, False)}
_TOP_KEYS = {"name", "summary", "runtime", "attention_kernel", "attention_efficiency", "params", "defaults", "cp_impls",
             "run"}



@dataclass(frozen=True)
class Sourced:
    """One number (or setting) of a stack and where it comes from."""

    value: object
    source: str


@dataclass(frozen=True)
class Stack:
    """A training software stack (see the module docstring).

    Attributes:
        name: how ``--stack`` and published rows name it.
        summary: one line for people.
        runtime: whose saved activations and pipeline buffers the memory model counts: ``torch``
            (PyTorch modules, torch.distributed.pipelining), ``megatron`` (Megatron-LM 2021-22) or
            ``megatron-core`` (Megatron-Core with Transformer Engine: ``plait.plan.activations``).
        attention_kernel: the fused attention kernel it runs, in words.
        attention_efficiency: {GPU generation: fraction of the bf16 peak its attention forward reaches};
            a generation not listed keeps the GPU preset's.
        params: {cost parameter: value} (``STACK_PARAMS``); the others keep the planner's defaults.
        defaults: {layout knob: value} for runs that leave the knob out (``STACK_DEFAULTS``).
        run: {setting: value} of the software's own run configs (``STACK_RUN``).
        cp_impls: the context-parallel kernels the software has (the search picks the fastest of them).
        path: the file it was read from.
    """

    name: str
    summary: str
    runtime: str = "torch"
    attention_kernel: str = ""
    attention_efficiency: dict = field(default_factory=dict, hash=False, compare=False)
    params: dict = field(default_factory=dict, hash=False, compare=False)
    defaults: dict = field(default_factory=dict, hash=False, compare=False)
    cp_impls: tuple[str, ...] = RUNTIME_CP_IMPLS
    path: str = ""
    run: dict = field(default_factory=dict, hash=False, compare=False)

    @property
    def is_plait(self) -> bool:
        """Whether this is plait's own stack (the built-in file), whose layouts plait train runs."""
        return Path(self.path).resolve() == (STACKS_DIR / f"{DEFAULT_STACK}.toml").resolve()

    def param_values(self) -> dict[str, float]:
        return {name: float(item.value) for name, item in self.params.items()}

    def default_values(self) -> dict[str, object]:
        return {name: item.value for name, item in self.defaults.items()}

    def run_value(self, name: str):
        """The software's own setting ``name`` (``STACK_RUN``) and its source, or (None, "")."""
        item = self.run.get(name)
        return (None, "") if item is None else (item.value, item.source)

    def gpu(self, gpu: GpuSpec) -> GpuSpec:
        """``gpu`` with this stack's attention efficiency for its generation, times the part's
        ``power_derate`` (unchanged if none is given)."""
        item = self.attention_efficiency.get(generation_of(gpu.name) or "")
        return gpu if item is None else replace(gpu, attention_efficiency=float(item.value) * gpu.power_derate)

    def sources(self) -> dict[str, str]:
        """{what: where it comes from} for every number and default of the stack."""
        out = {f"attention_efficiency[{g}]": i.source for g, i in self.attention_efficiency.items()}
        out.update({f"params.{n}": i.source for n, i in self.params.items()})
        out.update({f"defaults.{n}": i.source for n, i in self.defaults.items()})
        out.update({f"run.{n}": i.source for n, i in self.run.items()})
        return out


def generation_of(gpu_name: str) -> str | None:
    """The GPU generation (``GENERATIONS``) of a preset name, or None (a CPU profile, an AMD part)."""
    return next((g for g, names in GENERATIONS.items() if gpu_name in names), None)


def left_out_defaults(stack: Stack, given, moot=()) -> dict[str, object]:
    """{knob: value}: ``stack``'s defaults (its ``[defaults]`` table, in the file's order) for the layout
    knobs a run leaves out: not in ``given`` (the knobs the run states) nor in ``moot`` (knobs its degrees
    make meaningless or that the caller decides itself). A ``ckpt`` default comes with ``ckpt_layers=0``:
    the stack's recompute policy covers every layer. The one place ``plait plan --layout`` and
    ``plait validate`` take a stack's defaults from."""
    out: dict[str, object] = {}
    for knob, value in stack.default_values().items():
        if knob in given or knob in moot:
            continue
        out[knob] = value
        if knob == "ckpt":
            out["ckpt_layers"] = 0
    return out


def stack_names() -> list[str]:
    """The built-in stacks, sorted."""
    return sorted(p.stem for p in STACKS_DIR.glob("*.toml"))


def get_stack(name_or_path: str | None) -> Stack:
    """A built-in stack by name, or a stack TOML file by path; None gives ``DEFAULT_STACK``."""
    text = name_or_path or DEFAULT_STACK
    path = STACKS_DIR / f"{text}.toml"
    if not path.is_file():
        path = Path(text)
        if not (text.endswith(".toml") and path.is_file()):
            raise PlaitError(f"unknown stack {text!r}; built-in stacks: {', '.join(stack_names())} "
                             "(or the path of a stack .toml file)")
    return _cached(str(path.resolve()))


_LOADED: dict[str, Stack] = {}


def _cached(path: str) -> Stack:
    if path not in _LOADED:
        _LOADED[path] = read_stack(path)
    return _LOADED[path]


def read_stack(path: str | Path) -> Stack:
    """Read and check one stack file; every problem is one PlaitError naming the file and the key."""
    toml = toml_module("stack file")
    try:
        data = toml.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise PlaitError(f"cannot read stack file {path}: {exc}") from None
    except toml.TOMLDecodeError as exc:
        raise PlaitError(f"stack file {path} is not valid TOML: {exc}") from None
    where = f"stack file {path}"
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise PlaitError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(_TOP_KEYS))}")
    for key in ("name", "summary"):
        if not isinstance(data.get(key), str) or not data[key].strip():
            raise PlaitError(f"{where}: {key} must be a non-empty string")
    runtime = data.get("runtime", "torch")
    if runtime not in RUNTIMES:
        raise PlaitError(f"{where}: runtime={runtime!r} must be one of {', '.join(RUNTIMES)}")
    efficiency = _sourced_table(data, "attention_efficiency", tuple(GENERATIONS), where)
    for gen, item in efficiency.items():
        if not _number(item.value) or not 0 < item.value <= 1:
            raise PlaitError(f"{where}: attention_efficiency.{gen}={item.value!r} must be a number in (0, 1]")
    params = _sourced_table(data, "params", STACK_PARAMS, where)
    for name, item in params.items():
        if not _number(item.value) or item.value < 0:
            raise PlaitError(f"{where}: params.{name}={item.value!r} must be a number >= 0")
    defaults = _sourced_table(data, "defaults", tuple(STACK_DEFAULTS), where)
    for name, item in defaults.items():
        if item.value not in STACK_DEFAULTS[name] or type(item.value) is not type(STACK_DEFAULTS[name][0]):
            allowed = ", ".join(repr(v) for v in STACK_DEFAULTS[name])
            raise PlaitError(f"{where}: defaults.{name}={item.value!r} must be one of {allowed}")
    run = _sourced_table(data, "run", tuple(STACK_RUN), where)
    for name, item in run.items():
        kind = STACK_RUN[name]
        ok = (_number(item.value) and item.value == int(item.value) and item.value > 0) if kind is int \
            else item.value in kind and type(item.value) is type(kind[0])
        if not ok:
            allowed = "a positive whole number" if kind is int else "one of " + ", ".join(repr(v) for v in kind)
            raise PlaitError(f"{where}: run.{name}={item.value!r} must be {allowed}")
    cp_impls = data.get("cp_impls", list(RUNTIME_CP_IMPLS))
    allowed = STACK_DEFAULTS["cp_impl"]
    if not isinstance(cp_impls, list) or not cp_impls or any(i not in allowed for i in cp_impls):
        raise PlaitError(f"{where}: cp_impls={cp_impls!r} must be a non-empty list of {', '.join(allowed)}")
    if "cp_impl" in defaults and defaults["cp_impl"].value not in cp_impls:
        raise PlaitError(f"{where}: defaults.cp_impl={defaults['cp_impl'].value!r} is not one of its cp_impls "
                         f"({', '.join(cp_impls)})")
    return Stack(name=data["name"].strip(), summary=data["summary"].strip(), runtime=runtime,
                 attention_kernel=str(data.get("attention_kernel", "")), attention_efficiency=efficiency,
                 params=params, defaults=defaults, cp_impls=tuple(cp_impls), path=str(path), run=run)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value and abs(value) != float("inf")


def _sourced_table(data: dict, key: str, allowed: tuple[str, ...], where: str) -> dict[str, Sourced]:
    table = data.get(key, {})
    if not isinstance(table, dict):
        raise PlaitError(f"{where}: {key} must be a table")
    out = {}
    for name, entry in table.items():
        if name not in allowed:
            raise PlaitError(f"{where}: {key}.{name} is not one a stack may set; allowed: {', '.join(allowed)}")
        if not isinstance(entry, dict) or set(entry) != {"value", "source"}:
            raise PlaitError(f"{where}: {key}.{name} must be {{ value = ..., source = \"...\" }}")
        if not isinstance(entry["source"], str) or not entry["source"].strip():
            raise PlaitError(f"{where}: {key}.{name} needs a source (where the number comes from)")
        out[name] = Sourced(entry["value"], entry["source"].strip())
    return out
