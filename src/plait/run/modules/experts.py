"""The routed experts of an MoE layer (``plait.run.modules.moe``): expert-major weights, optional
per-expert biases, and their forward as a grouped GEMM.

Expert e of E (hidden h, expert ffn f) on its rows x (n, h):
  gate = x·W1_e + b1_e,  up = x·W3_e + b3_e  (n, f);  out = act(gate, up)·W2_e + b2_e  (n, h)
where ``act`` is
  * ``silu`` (SwiGLU): silu(gate) ⊙ up;
  * ``oai`` (GPT-OSS's clamped SwiGLU, transformers' ``GptOssExperts``): gate clamped to at most
    ``OAI_LIMIT``, up clamped to [-``OAI_LIMIT``, ``OAI_LIMIT``], then
    (up + 1) ⊙ gate ⊙ sigmoid(``OAI_ALPHA``·gate).
The biases b1, b3 (E, f) and b2 (E, h) exist when ``MoESpec.expert_bias`` (GPT-OSS) and start at zero.

Layout: ``w1`` / ``w3`` (E, h, f), ``w2`` (E, f, h), ``w1_bias`` / ``w3_bias`` (E, f), ``w2_bias``
(E, h): every tensor is expert-major, so expert parallelism (``plait.run.parallel.expert``) shards
all of them on dim 0. Hugging Face's GPT-OSS stores gate and up fused, with interleaved columns
(gate = column 2j, up = column 2j + 1); that layout exists only at the checkpoint boundary
(``plait.run.checkpoint.hf.gpt_oss``).

Grouped GEMM: ``torch._grouped_mm`` on CUDA (Hopper or newer) in bf16, else one GEMM per expert (the CPU path; every
expert runs, also with no rows, so every expert weight gets a gradient).
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from torch import nn

from plait.spec.capabilities import GROUPED_MM_ALIGN_BYTES, GROUPED_MM_MIN_CAPABILITY
from plait.spec.moe.parts import OAI_ALPHA, OAI_LIMIT

ACTIVATIONS = ("silu", "oai")  # plait.spec.moe.parts.EXPERT_ACTIVATIONS


def grouped_mm_aligned(*tensors: torch.Tensor) -> bool:
    """Whether every stride but the last of every tensor is a multiple of ``GROUPED_MM_ALIGN_BYTES``,
    as CUDA's grouped GEMM requires (torch's ``ATen/native/GroupedMMUtils.h``): in bf16 the hidden
    width and the expert ffn (after etp) multiples of 8."""
    return all(stride * t.element_size() % GROUPED_MM_ALIGN_BYTES == 0 for t in tensors for stride in t.stride()[:-1])


def use_grouped_mm(x: torch.Tensor, *weights: torch.Tensor) -> bool:
    """Whether ``expert_forward`` runs ``torch._grouped_mm`` on rows ``x`` and ``weights`` by default:
    CUDA of compute capability ``GROUPED_MM_MIN_CAPABILITY`` or newer (torch's fallback on older GPUs
    syncs with the host and loops), bf16, a torch that has it, and aligned operands
    (``grouped_mm_aligned``; the widths of an imported config that are not take the per-expert loop).
    The planner reads the same rule (``plait.spec.capabilities.plait_grouped_experts``)."""
    return (x.is_cuda and x.dtype == torch.bfloat16 and hasattr(torch, "_grouped_mm")
            and torch.cuda.get_device_capability(x.device) >= GROUPED_MM_MIN_CAPABILITY
            and grouped_mm_aligned(x, *weights))


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the experts' GEMMs run in: autocast's where it is on for ``x``'s device (the rows
    arrive in the fp32 residual stream's dtype, and autocast would cast them again for every GEMM),
    else ``x``'s."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


def glu(gate: torch.Tensor, up: torch.Tensor, activation: str = "silu") -> torch.Tensor:
    """The gated unit of the experts' ``activation`` (module docstring), element-wise on (n, f)."""
    if activation == "oai":
        gate = gate.clamp(max=OAI_LIMIT)
        up = up.clamp(min=-OAI_LIMIT, max=OAI_LIMIT)
        return (up + 1) * (gate * torch.sigmoid(gate * OAI_ALPHA))
    return F.silu(gate) * up


def _plus_bias(out: torch.Tensor, bias: torch.Tensor | None, counts_t: torch.Tensor) -> torch.Tensor:
    """``out`` (rows grouped by expert) plus each expert's bias repeated over its rows; ``out`` itself
    without a bias (no extra op)."""
    if bias is None:
        return out
    return out + bias.repeat_interleave(counts_t, dim=0, output_size=out.shape[0])


def expert_forward(x: torch.Tensor, counts: list[int], w1: torch.Tensor, w3: torch.Tensor,
                   w2: torch.Tensor, grouped: bool | None = None, biases: tuple | None = None,
                   activation: str = "silu", mm=None) -> torch.Tensor:
    """The experts on rows ``x`` (grouped: ``counts[e]`` rows for local expert e) through w1, w3
    (E_l, h, f) and w2 (E_l, f, h), with ``biases`` (b1, b3, b2) or None; one output row per input
    row, in ``compute_dtype`` (autocast's bf16 under autocast). ``grouped``: one
    ``torch._grouped_mm`` per projection (None: ``use_grouped_mm``), else one
    GEMM per expert. ``mm``: another grouped GEMM (fp8: ``plait.run.parallel.float8.fp8_grouped_mm``),
    always used."""
    if mm is None:  # under autocast: the rows cast once, so that CUDA takes the bf16 grouped GEMM
        x = x.to(compute_dtype(x))
    w1, w3, w2 = (w.to(x.dtype) for w in (w1, w3, w2))  # fp32 master weights under bf16 compute
    b1, b3, b2 = (b.to(x.dtype) for b in biases) if biases is not None else (None, None, None)
    if mm is not None or (use_grouped_mm(x, w1, w3, w2) if grouped is None else grouped):
        mm = mm or torch._grouped_mm
        # from the host's counts, copied without a stream sync (a blocking copy would drain the queue)
        counts_t = torch.tensor(counts).to(x.device, non_blocking=True)
        offsets = torch.tensor(list(itertools.accumulate(counts)), dtype=torch.int32).to(x.device, non_blocking=True)
        gate = _plus_bias(mm(x, w1, offs=offsets), b1, counts_t)
        up = _plus_bias(mm(x, w3, offs=offsets), b3, counts_t)
        return _plus_bias(mm(glu(gate, up, activation), w2, offs=offsets), b2, counts_t)
    # one view per expert from one unbind: the backward stacks the experts' gradients once per weight
    # (indexing w[e] per expert would build and sum a whole zero-padded weight gradient per expert)
    w1, w3, w2 = w1.unbind(0), w3.unbind(0), w2.unbind(0)
    b1, b3, b2 = (b.unbind(0) for b in (b1, b3, b2)) if b1 is not None else (None, None, None)
    outs = []
    for e, rows in enumerate(x.split(counts)):  # an expert with no rows still runs (its weights get a zero gradient)
        gate, up = rows @ w1[e], rows @ w3[e]
        if b1 is not None:
            gate, up = gate + b1[e], up + b3[e]
        out = glu(gate, up, activation) @ w2[e]
        outs.append(out + b2[e] if b2 is not None else out)
    return torch.cat(outs)


class GroupedExperts(nn.Module):
    """The routed experts' weights (and biases when ``bias``), expert-major (module docstring). Under
    expert parallelism they are DTensors sharded on dim 0 over the ep mesh; ``local_weights`` gives
    this rank's."""

    def __init__(self, n_experts: int, hidden: int, ffn: int, bias: bool = False, activation: str = "silu"):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"expert activation {activation!r} is not one of {ACTIVATIONS}")
        self.activation = activation
        self.w1 = nn.Parameter(torch.empty(n_experts, hidden, ffn))
        self.w3 = nn.Parameter(torch.empty(n_experts, hidden, ffn))
        self.w2 = nn.Parameter(torch.empty(n_experts, ffn, hidden))
        self.bias = bias
        self.grouped_mm = None  # fp8: plait.run.parallel.float8.convert_experts sets its grouped GEMM
        if bias:
            self.w1_bias = nn.Parameter(torch.empty(n_experts, ffn))
            self.w3_bias = nn.Parameter(torch.empty(n_experts, ffn))
            self.w2_bias = nn.Parameter(torch.empty(n_experts, hidden))

    @staticmethod
    def _local(w: torch.Tensor) -> torch.Tensor:
        return w.to_local() if hasattr(w, "to_local") else w

    def local_weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return tuple(self._local(w) for w in (self.w1, self.w3, self.w2))

    def local_biases(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """This rank's (b1, b3, b2), or None without biases."""
        if not self.bias:
            return None
        return tuple(self._local(b) for b in (self.w1_bias, self.w3_bias, self.w2_bias))

    def forward(self, x: torch.Tensor, counts: list[int] | None = None, over_chunks=None):
        """The experts on rows ``x`` grouped by ``counts`` (``expert_forward``); or, given
        ``over_chunks`` (``run_chunked``), what ``over_chunks(x, experts)`` returns."""
        if over_chunks is not None:
            return over_chunks(x, self._cast(compute_dtype(x)))
        return expert_forward(x, counts, *self.local_weights(), biases=self.local_biases(),
                              activation=self.activation, mm=self.grouped_mm)

    def run_chunked(self, rows: torch.Tensor, over_chunks) -> torch.Tensor:
        """``over_chunks(rows, experts)``: a caller that runs these experts (``experts``, a function of
        (rows, counts)) on several chunks of ``rows`` (moe_overlap=chunked), inside one call of this
        module. So FSDP gathers the weights before it and reduces their gradients after the chunks'
        backward once, as for one call (the weights a chunk reads from outside a call of the module
        would be the sharded ones under ZeRO); and the weights and biases are cast to the compute
        dtype once for all chunks: a cast per call would cast every chunk's gradient back, so the
        chunks' gradients would be summed in fp32; with one cast they are summed in that dtype, as
        the planner counts them (``plait.plan.moe.timing.chunk_gradient_sums``)."""
        return self(rows, over_chunks=over_chunks)

    def _cast(self, dtype: torch.dtype):
        """These experts as a function of (rows, counts), their weights and biases cast to ``dtype`` once
        (``run_chunked``; the fp8 grouped GEMM too takes them in the compute dtype)."""
        weights = tuple(w.to(dtype) for w in self.local_weights())
        biases = self.local_biases()
        biases = tuple(b.to(dtype) for b in biases) if biases is not None else None
        return lambda x, counts: expert_forward(x, counts, *weights, biases=biases, activation=self.activation,
                                                mm=self.grouped_mm)
