"""The experts' fp8 grouped GEMM pads each token group to 16 rows (``float8.aligned_token_groups``).

torch._scaled_grouped_mm needs every group's row count to be a multiple of 16, and torchao 0.17-0.18's
``_to_fp8_rowwise_then_scaled_grouped_mm`` asserts ``pad_token_groups_for_grouped_mm=False`` (its own
padding "is not yet supported"): the first GPU proof failed there. The padding runs on CPU, so it is
checked here against a reference grouped GEMM (one GEMM per group). The operands are small integers
in float64: every product and sum is exact, so padded and unpadded must agree bit for bit, in the
output and in both gradients.
"""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest
import torch

from plait.run.parallel.float8 import FP8_GROUP_ROWS, _torchao_grouped_mm, aligned_token_groups, fp8_grouped_mm


def grouped_reference(x: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """torch._grouped_mm's meaning, one GEMM per group; rows after the last group give zeros."""
    out, start = x.new_zeros(x.shape[0], weight.shape[-1]), 0
    for group, end in enumerate(offs.tolist()):
        out = out.index_copy(0, torch.arange(start, end), x[start:end] @ weight[group])
        start = end
    return out


def integers(*shape: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(-4, 5, shape, generator=generator).double()


CASES = {  # group sizes, rows after the last group
    "uneven and empty groups": ([300, 0, 17, 512, 64, 129, 1, 1025], 0),
    "already aligned": ([16, 32, 0, 48], 0),
    "one group": ([5], 0),
    "rows after the last group": ([3, 20], 7),
    "all empty": ([0, 0, 0], 4),
}


@pytest.mark.parametrize("name", CASES)
def test_padded_groups_hold_the_rows_in_order_then_zeros(name):
    sizes, extra = CASES[name]
    offs = torch.tensor(sizes, dtype=torch.int32).cumsum(0).to(torch.int32)
    x = integers(sum(sizes) + extra, 8, seed=1) + 10  # no zero rows among the tokens
    padded, padded_offs, rows = aligned_token_groups(x, offs)
    padded_sizes = torch.diff(padded_offs, prepend=padded_offs.new_zeros(1)).tolist()
    assert padded_sizes == [-(-n // FP8_GROUP_ROWS) * FP8_GROUP_ROWS for n in sizes]
    assert padded.shape[0] >= int(padded_offs[-1]) + extra
    assert torch.equal(padded.index_select(0, rows), x)
    start = padded_start = 0
    for n, padded_n in zip(sizes, padded_sizes):
        group = padded[padded_start:padded_start + padded_n]
        assert torch.equal(group[:n], x[start:start + n]) and not group[n:].any()
        start, padded_start = start + n, padded_start + padded_n
    assert torch.equal(rows[sum(sizes):], torch.arange(padded_start, padded_start + extra))


@pytest.mark.parametrize("name", CASES)
def test_padded_grouped_gemm_equals_the_unpadded_one_with_gradients(name):
    sizes, extra = CASES[name]
    offs = torch.tensor(sizes, dtype=torch.int32).cumsum(0).to(torch.int32)
    x = integers(sum(sizes) + extra, 16, seed=2).requires_grad_()
    weight = integers(len(sizes), 16, 32, seed=3).requires_grad_()
    upstream = integers(x.shape[0], 32, seed=4)
    upstream[sum(sizes):] = 0  # rows outside every group have no defined output

    direct = grouped_reference(x, weight, offs)
    (direct * upstream).sum().backward()
    want = (direct.detach(), x.grad.clone(), weight.grad.clone())
    x.grad = weight.grad = None

    padded, padded_offs, rows = aligned_token_groups(x, offs)
    out = grouped_reference(padded, weight, padded_offs).index_select(0, rows)
    (out * upstream).sum().backward()
    assert torch.equal(out[:sum(sizes)].detach(), want[0][:sum(sizes)])
    assert torch.equal(x.grad, want[1]) and torch.equal(weight.grad, want[2])


@pytest.mark.parametrize("own_padding", [True, False])
def test_fp8_grouped_mm_gives_torchao_aligned_groups_and_turns_its_padding_off(monkeypatch, own_padding):
    """The call into torchao (faked: it needs CUDA): aligned groups, column-major weights, and
    ``pad_token_groups_for_grouped_mm=False`` where that torchao has the argument."""
    seen = {}

    def fake(a, b_t, offs, out_dtype=None, float8_dtype=None, **kwargs):
        seen.update(kwargs, sizes=torch.diff(offs, prepend=offs.new_zeros(1)).tolist(),
                    column_major=b_t.stride(-2) == 1)
        return grouped_reference(a, b_t, offs).to(out_dtype)

    if own_padding:
        def grouped_mm(a, b_t, offs, out_dtype=None, float8_dtype=None, pad_token_groups_for_grouped_mm=True):
            return fake(a, b_t, offs, out_dtype, float8_dtype,
                        pad_token_groups_for_grouped_mm=pad_token_groups_for_grouped_mm)
    else:
        def grouped_mm(a, b_t, offs, out_dtype=None, float8_dtype=None):
            return fake(a, b_t, offs, out_dtype, float8_dtype)
    package = types.ModuleType("torchao.prototype.moe_training")
    package._to_fp8_rowwise_then_scaled_grouped_mm = grouped_mm
    monkeypatch.setitem(sys.modules, "torchao.prototype.moe_training", package)
    _torchao_grouped_mm.cache_clear()  # read once per process: here from the fake, then forgotten
    if importlib.util.find_spec("torchao") is None:  # the parents of the faked module, where torchao is absent
        monkeypatch.setitem(sys.modules, "torchao", types.ModuleType("torchao"))
        monkeypatch.setitem(sys.modules, "torchao.prototype", types.ModuleType("torchao.prototype"))

    sizes = [300, 0, 17, 3]
    offs = torch.tensor(sizes).cumsum(0).to(torch.int32)
    x, weight = integers(sum(sizes), 16, seed=5), integers(len(sizes), 16, 32, seed=6)
    try:
        out = fp8_grouped_mm(x, weight, offs)
    finally:
        _torchao_grouped_mm.cache_clear()
    assert torch.equal(out, grouped_reference(x, weight, offs))
    assert all(n % FP8_GROUP_ROWS == 0 for n in seen["sizes"]) and seen["column_major"]
    assert seen.get("pad_token_groups_for_grouped_mm", "absent") == (False if own_padding else "absent")
