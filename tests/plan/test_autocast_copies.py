"""Autocast's bf16 weight copies (``plait.plan.autocast``): the planner's item against the bytes counted.

Without FSDP plait's runtime computes under ``torch.autocast(bf16)`` with fp32 weights; each linear
layer's bf16 copy is saved for the backward. The whole runtime model (2 blocks, the LM head) runs
one forward under CPU autocast with ``saved_tensors_hooks``: the distinct storages saved that are
autocast's casts of a parameter (``is_parameter``'s ``ToCopyBackward`` rule) are the copies, counted
in bytes. The planner's ``autocast_copy_bytes`` for the same model and layout must equal them:
every block's and the head's without checkpointing; under ``ckpt=full`` the head's (saved) and then
one block's (its recompute), never together: the most alive at once in the backward, followed by a
dispatch mode; under fp8 (torchao's ``Float8Linear``, emulated on CPU) the
blocks cast to fp8 themselves and only the head's copy is left. The first GPU proof's eager sweep
is what it explains (module docstring).
"""

from __future__ import annotations

import dataclasses
import weakref

import pytest

torch = pytest.importorskip("torch")

from torch.autograd.graph import saved_tensors_hooks  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from plait.plan.autocast import autocast_copy_bytes  # noqa: E402
from plait.plan.params import DEFAULT_PARAMS  # noqa: E402
from plait.run.memory.offload_handles import is_parameter  # noqa: E402
from plait.run.memory.recompute import apply_activation_checkpointing  # noqa: E402
from plait.run.model import apply_kernels, build_model, rope_tables  # noqa: E402
from plait.spec.layout import Layout  # noqa: E402
from plait.spec.models import get_model  # noqa: E402

SPEC = dataclasses.replace(get_model("tiny"), n_layers=2)  # hidden 128, SwiGLU 384, tied head
SEQ, MBS = 32, 2


def runtime_model(layout: Layout):
    model = build_model(SPEC)
    apply_kernels(model, layout.attn, layout.norm)
    if layout.precision != "bf16":
        from plait.run.parallel.float8 import convert_to_float8

        convert_to_float8(model, torch.device("cpu"), layout.tp)
    apply_activation_checkpointing([model], layout)
    model.to_empty(device="cpu")
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
    model.rope_cos, model.rope_sin = rope_tables(SPEC.head_dim, SPEC.max_seq_len, "cpu")
    return model.train()


class CastCopies(TorchDispatchMode):
    """Follows every bf16 ``_to_copy`` of a parameter (autocast's casts) and, while ``watching``, the most
    bytes of them alive at once."""

    def __init__(self):
        super().__init__()
        self.copies: list[tuple[weakref.ref, int]] = []
        self.watching, self.peak = False, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if (func is torch.ops.aten._to_copy.default and isinstance(args[0], torch.nn.Parameter)
                and out.dtype == torch.bfloat16):
            self.copies.append((weakref.ref(out), out.untyped_storage().nbytes()))
        if self.watching:
            self.peak = max(self.peak, sum(n for ref, n in self.copies if ref() is not None))
        return out


def counted_copy_bytes(layout: Layout) -> tuple[int, int]:
    """(bytes of autocast's parameter copies saved for the backward, distinct storages counted with
    ``saved_tensors_hooks``; the most bytes of such copies alive at once during the backward)."""
    model = runtime_model(layout)
    saved: dict[int, int] = {}

    def pack(t):
        if t.dtype == torch.bfloat16 and is_parameter(t) and not isinstance(t, torch.nn.Parameter):
            storage = t.untyped_storage()
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    tokens = torch.randint(0, SPEC.vocab, (MBS, SEQ), generator=torch.Generator().manual_seed(1))
    mode = CastCopies()
    with mode, saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(tokens)
        loss = logits.float().logsumexp(-1).mean()
        del logits
        mode.watching = True
        loss.backward()
    return sum(saved.values()), mode.peak


@pytest.mark.parametrize("layout_text", ["dp=1,mbs=2", "dp=1,mbs=2,ckpt=full", "dp=1,mbs=2,precision=fp8"])
def test_autocast_copies_are_the_bytes_counted(layout_text):
    layout = Layout.parse(layout_text)
    saved, peak = counted_copy_bytes(layout)
    want = autocast_copy_bytes(SPEC, layout, DEFAULT_PARAMS, SPEC.n_layers, True, 2)
    assert peak == want, (saved, peak, want)  # alive at once in the backward (a recompute's copies too)
    assert saved == (2 * SPEC.vocab * SPEC.hidden if layout.ckpt == "full" else want)  # checkpointed: the head's
    head = 2 * SPEC.vocab * SPEC.hidden
    block = 2 * SPEC.layer_matmul_params()
    expected = {"dp=1,mbs=2": SPEC.n_layers * block + head, "dp=1,mbs=2,ckpt=full": max(block, head),
                "dp=1,mbs=2,precision=fp8": head}[layout_text]
    assert want == expected


@pytest.mark.parametrize("layout_text,element_bytes", [("dp=2,zero=3,mbs=2", 2), ("dp=2,zero=1,mbs=2", 2),
                                                       ("dp=1,mbs=2", 4)])
def test_no_copies_with_fsdp_or_on_a_cpu(layout_text, element_bytes):
    """FSDP gathers bf16 weights (no cast); a CPU computes in fp32 (no autocast)."""
    assert autocast_copy_bytes(SPEC, Layout.parse(layout_text), DEFAULT_PARAMS, 2, True, element_bytes) == 0.0


def test_compiled_blocks_keep_only_the_heads_copy():
    params = dataclasses.replace(DEFAULT_PARAMS, compiled_blocks=1.0)
    assert autocast_copy_bytes(SPEC, Layout.parse("dp=1,mbs=2"), params, 2, True, 2) == 2 * SPEC.vocab * SPEC.hidden
