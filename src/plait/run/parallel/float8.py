"""fp8 training (``Layout.precision`` = ``fp8`` or ``mxfp8``) with torchao's float8 converters.

``convert_to_float8(model, device, tp)`` swaps the ``nn.Linear`` layers of the transformer
blocks (attention wq/wk/wv/wo, MLP w1/w2/w3) for torchao's ``Float8Linear``; the token
embedding and the LM head stay in high precision, as in torchtitan. A layer is converted only
when both of its dimensions, divided by tp, are multiples of 16 (what ``torch._scaled_mm``
needs of an fp8 operand).

The recipe is torchao's tensor-wise dynamic scaling: each of a layer's three GEMMs (output,
input gradient, weight gradient) casts its operands to fp8 - activations and weights to e4m3,
the incoming gradient to e5m2 - with one scale per tensor from its current max-abs value.
plait rounds the scales down to powers of 2 (``round_scales_to_power_of_2``): an fp8 value's
mantissa then does not depend on its scale, so how a batch is split over data-parallel ranks
(each computes the max-abs of its own share) does not change the rounding, and a dp=2 run's
first step equals the one-process run's to fp32 rounding. Weights, gradients, optimizer states
and their reductions stay as without fp8 (fp32 masters; bf16 or fp32 elsewhere).

On a GPU with fp8 tensor cores (compute capability 8.9 or newer: L4, L40, H100, H200, B200)
the GEMMs run in fp8 (``torch._scaled_mm``). Elsewhere - CPU, older GPUs - torchao emulates
them: the operands are rounded to fp8 exactly as on the GPU, then multiplied in fp32 (so a CPU
run shows fp8's numerics, not its speed).

Order (``parallelize.py``): convert right after building on the meta device, before tensor
parallelism and FSDP2, as torchao requires. Tensor parallelism keeps torch's plain
``ColwiseParallel``/``RowwiseParallel`` styles: a sharded ``Float8Linear`` weight is a DTensor
whose max-abs is taken over the whole tensor, so the scales are those of one process.
Left out on purpose: torchao's ``Float8ColwiseParallel``/``Float8RowwiseParallel`` (they
all-gather fp8 activations, which gloo cannot move - "Invalid scalar type" - and compute scales
that are not powers of 2) and FSDP2's fp8 all-gather (``enable_fsdp_float8_all_gather``; in
torchao 0.18 its weight scales ignore ``round_scales_to_power_of_2``, and the planner charges
bf16 all-gathers). Both only save communication on GPU.

``precision=mxfp8`` converts the same layers with torchao's prototype MXFP8 recipe (one scale
per 32 elements; ``mxfp8_config``): MX GEMMs on B200, emulated on CPU, refused on GPUs without
MX tensor cores and, by rule ``runtime-mxfp8-tp``, with tensor parallelism.

Mixture-of-experts (``convert_experts``): the routed experts' grouped GEMMs run torchao's fp8
grouped GEMM (``torchao.prototype.moe_training``'s ``_to_fp8_rowwise_then_scaled_grouped_mm``: row-wise
scales, ``torch._scaled_grouped_mm``) on CUDA GPUs of compute capability 9.0 or newer; elsewhere
(CPU, older GPUs, dimensions not multiples of 16) the experts stay in the compute dtype (bf16, fp32
on CPU) and ``plait train`` says so at startup (``ModelParts.notes``): torchao has no emulated fp8
grouped GEMM. The router and the shared experts' gate stay in high precision (``HIGH_PRECISION``,
as torchtitan keeps them: routing decisions are not rounded to fp8); the shared experts are
linear layers and convert as the dense MLP's.

torchao is optional (the ``cpu`` and ``gpu`` extras install it); without it the runtime rule
``runtime-fp8`` refuses ``precision=fp8`` and ``mxfp8`` before launching.
"""

from __future__ import annotations

import functools
import logging

import torch
from torch import nn

from plait.errors import PlaitError
from plait.spec.capabilities import FP8_ALIGNMENT

FP8_MIN_CAPABILITY = (8, 9)  # CUDA compute capability with fp8 tensor cores (Ada, Hopper, Blackwell)
MX_BLOCK = 32  # mxfp8: one power-of-2 (e8m0) scale per 32 consecutive elements of the reduction dimension
MX_MIN_CAPABILITY = (10, 0)  # MX tensor cores (Blackwell: B200)
# What importing torchao logs on a machine without its CUDA kernels (harmless: float8 training
# uses torch._scaled_mm, not these libraries): "Failed to load <...>/torchao/_C....so: ..." on the
# ``torchao`` logger, and a torch deprecation notice for each enum torchao registers with pytree
# ("<enum 'KernelPreference'> is an Enum subclass and is now natively supported ...") on
# ``torch.utils._pytree``. torchao imports some of its modules lazily, after plait's import, so the
# filters stay on once installed; each drops those records only, every other one still shows.
TORCHAO_LOGGER, PYTREE_LOGGER = "torchao", "torch.utils._pytree"
ENUM_NOTICE = "is an Enum subclass and is now natively supported"


class _TorchaoImportNoise(logging.Filter):
    """Drops torchao's own "Failed to load" of its ``_C*.so`` libraries and torch's Enum notice for
    torchao's enums; passes every other record."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == TORCHAO_LOGGER:
            message = record.getMessage()
            return not (message.startswith("Failed to load ") and "torchao" in message and ".so" in message)
        if record.name == PYTREE_LOGGER and ENUM_NOTICE in str(record.msg):
            cls = record.args[0] if isinstance(record.args, tuple) and record.args else None
            return not getattr(cls, "__module__", "").startswith("torchao")
        return True


_FILTER = _TorchaoImportNoise()


def quiet_torchao() -> None:
    """Install the filter of torchao's import noise (idempotent): call before importing torchao."""
    for name in (TORCHAO_LOGGER, PYTREE_LOGGER):
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)


def import_float8():
    """The ``torchao.float8`` module, imported without its CPU-machine warnings."""
    quiet_torchao()
    import torchao.float8
    return torchao.float8


def has_fp8_gemms(device: torch.device) -> bool:
    """Whether ``device`` multiplies in fp8 (else torchao emulates the fp8 GEMMs in fp32)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= FP8_MIN_CAPABILITY


def float8_config(device: torch.device):
    """torchao's ``Float8LinearConfig`` for ``device``: tensor-wise dynamic scaling with power-of-2
    scales, emulated where the device has no fp8 GEMMs."""
    return import_float8().Float8LinearConfig(emulate=not has_fp8_gemms(device), round_scales_to_power_of_2=True)


HIGH_PRECISION = ("router", "shared_gate")  # MoE routing stays in high precision (as torchtitan keeps it)


def converts(name: str, module: nn.Module, tp: int, precision: str = "fp8") -> bool:
    """Whether layer ``name`` of a (stage) model becomes fp8: a linear layer of a block whose two
    dimensions, each divided by ``tp``, are multiples of 16 (of 32, the MX block, for mxfp8)."""
    if not name.startswith("layers.") or not isinstance(module, nn.Linear) or name.endswith(HIGH_PRECISION):
        return False
    alignment = MX_BLOCK if precision == "mxfp8" else FP8_ALIGNMENT
    return all(dim % (alignment * tp) == 0 for dim in (module.in_features, module.out_features))


def convert_to_float8(model: nn.Module, device: torch.device, tp: int, precision: str = "fp8") -> list[str]:
    """Swap the block linears of ``model`` (built on the meta device; before tensor parallelism and
    FSDP) for ``Float8Linear`` (``precision`` fp8) or give them MXFP8 weights (mxfp8), in place;
    returns the names of the converted layers. Parameter names and values are unchanged
    (an fp8 checkpoint resumes exactly in fp8, and in bf16)."""
    converted = [name for name, module in model.named_modules() if converts(name, module, tp, precision)]
    chosen = set(converted)
    if precision == "mxfp8":
        quiet_torchao()
        from torchao.quantization import quantize_
        quantize_(model, mxfp8_config(device), filter_fn=lambda module, name: name in chosen)
    else:
        import_float8().convert_to_float8_training(model, config=float8_config(device),
                                                   module_filter_fn=lambda module, name: name in chosen)
    return converted


def mxfp8_config(device: torch.device):
    """torchao's MXFP8 training config: MX kernels on a GPU with MX tensor cores, emulated on CPU.

    MXFP8 (``precision=mxfp8``, torchao's prototype ``MXFP8TrainingOpConfig``) casts every GEMM
    operand, gradients included, to e4m3 with one power-of-2 scale per 32 elements. A linear
    layer keeps its class; its weight becomes torchao's ``MXFP8TrainingWeightWrapperTensor``,
    which routes ``linear``/``mm`` to MXFP8 GEMMs. Not with tensor parallelism (the wrapper does
    not survive DTensor sharding: rule ``runtime-mxfp8-tp``).
    """
    quiet_torchao()
    from torchao.prototype.moe_training.config import MXFP8TrainingOpConfig
    from torchao.quantization.quantize_.common.kernel_preference import KernelPreference
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < MX_MIN_CAPABILITY:
        raise PlaitError(f"precision=mxfp8 needs MX tensor cores (compute capability 10.0, B200); "
                         f"{torch.cuda.get_device_name(device)} has none; use precision=fp8")
    emulated = device.type != "cuda"
    return MXFP8TrainingOpConfig(kernel_preference=KernelPreference.EMULATED if emulated else KernelPreference.AUTO)


FP8_GROUPED_MIN_CAPABILITY = (9, 0)  # torch._scaled_grouped_mm: Hopper and newer


def experts_fp8_blocker(device: torch.device, precision: str, hidden: int, ffn: int) -> str | None:
    """Why the routed experts (hidden, ffn: the local expert widths) stay in the compute dtype under
    ``precision`` (None: they run torchao's fp8 grouped GEMM; module docstring)."""
    if precision != "fp8":
        return None if precision == "bf16" else f"precision={precision} has no grouped GEMM here"
    if device.type != "cuda":
        return (f"torchao's fp8 grouped GEMM (torch._scaled_grouped_mm) runs on CUDA only, and this is "
                f"{device.type}")
    if torch.cuda.get_device_capability(device) < FP8_GROUPED_MIN_CAPABILITY:
        return (f"torchao's fp8 grouped GEMM (torch._scaled_grouped_mm) needs compute capability 9.0; "
                f"{torch.cuda.get_device_name(device)} has {torch.cuda.get_device_capability(device)}")
    if hidden % FP8_ALIGNMENT or ffn % FP8_ALIGNMENT:
        return f"the experts' widths (hidden {hidden}, ffn {ffn}) are not multiples of {FP8_ALIGNMENT}"
    return None


FP8_GROUP_ROWS = 16  # torch._scaled_grouped_mm: each group's row count a multiple of 16 (torchao asserts it)


def aligned_token_groups(x: torch.Tensor, offs: torch.Tensor,
                         align: int = FP8_GROUP_ROWS) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The rows ``x`` (rows, k), grouped by the cumulative group ends ``offs`` (int32), with each
    group padded by zero rows to a multiple of ``align``: (padded rows, their group ends, the padded
    row of each original row). Device ops only (no host sync: the padded size is the static bound
    rows + groups·(align - 1)); rows after ``offs[-1]`` stay after the last group. A grouped GEMM of
    the padded rows, read back with ``index_select(0, rows)``, is the GEMM of ``x``: padding rows are
    zero, so they add nothing to a weight gradient either."""
    sizes = torch.diff(offs, prepend=offs.new_zeros(1))
    padded_sizes = (sizes + (align - 1)) // align * align
    padded_ends = torch.cumsum(padded_sizes, 0, dtype=offs.dtype)
    shift = torch.cat([padded_ends - padded_sizes - (offs - sizes), (padded_ends[-1:] - offs[-1:])])
    index = torch.arange(x.shape[0], device=x.device, dtype=offs.dtype)
    rows = (index + shift[torch.searchsorted(offs, index, right=True)]).long()
    bound = -(-(x.shape[0] + offs.numel() * (align - 1)) // align) * align
    padded = x.new_zeros(bound, x.shape[1]).index_copy(0, rows, x)
    return padded, padded_ends, rows


def fp8_grouped_mm(x: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """``torch._grouped_mm(x, weight, offs=offs)`` with fp8 operands (row-wise scales; torchao):
    x (rows, k) bf16, weight (groups, k, n), given to torchao column-major as it requires, the token
    groups padded to ``FP8_GROUP_ROWS`` rows (``aligned_token_groups``; torchao 0.17-0.18 refuse
    to pad them themselves)."""
    grouped_mm, options = _torchao_grouped_mm()
    column_major = weight.transpose(-2, -1).contiguous().transpose(-2, -1)
    padded, padded_offs, rows = aligned_token_groups(x, offs)
    out = grouped_mm(padded, column_major, padded_offs, out_dtype=torch.bfloat16, **options)
    return out.index_select(0, rows).to(x.dtype)


@functools.cache
def _torchao_grouped_mm():
    """torchao's fp8 grouped GEMM and the options plait passes it: its own token padding off, where
    that torchao has the argument (read once: every expert GEMM calls it)."""
    import inspect

    quiet_torchao()
    from torchao.prototype.moe_training import _to_fp8_rowwise_then_scaled_grouped_mm as grouped_mm

    own_padding = "pad_token_groups_for_grouped_mm" in inspect.signature(grouped_mm).parameters
    return grouped_mm, ({"pad_token_groups_for_grouped_mm": False} if own_padding else {})


def convert_experts(model: nn.Module, device: torch.device, precision: str,
                    etp: int = 1) -> tuple[list[str], list[str]]:
    """Give the routed experts of ``model`` the fp8 grouped GEMM where it runs (module docstring;
    ``etp``: the split of each expert's ffn); (names of the converted experts, notes of those left
    in the compute dtype, one per reason)."""
    from plait.run.modules.experts import GroupedExperts

    converted, notes = [], []
    for name, module in model.named_modules():
        if not isinstance(module, GroupedExperts):
            continue
        hidden, ffn = module.w1.shape[1], module.w1.shape[2] // etp
        why = experts_fp8_blocker(device, precision, hidden, ffn)
        if why is None:
            module.grouped_mm = fp8_grouped_mm
            converted.append(name)
        else:
            note = f"the routed experts stay in the compute dtype under precision={precision}: {why}"
            if note not in notes:
                notes.append(note)
    return converted, notes
