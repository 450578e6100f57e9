"""Packed documents (``plait train --doc-mask``, plait.run.modules.documents).

  * One process: the doc-masked loss of a packed row equals the loss of its documents run one by
    one, each alone from position 0 (the token-weighted mean: every token's loss is the same
    function of its own document's tokens), for RoPE and learned positions, SDPA and eager
    attention, with a sliding window. Two computations of the same function that sum in another
    order: within ``tolerances.run_rtol`` of the loss (fp32 reductions over the widest sum, the
    vocabulary, through every layer). Without the mask the loss differs by far more than that.
  * The context-parallel kernels (ring, all-gather, Ulysses) given the rows' document ids equal
    SDPA with the whole rows' mask on each rank's tokens (``tolerances.attention_atol``).
  * Training on a packed token file with --doc-mask under cp=2 (ring and all-gather), pp=2 and
    tp=2 with sequence parallelism (also GPT's learned positions) matches the single-process doc-masked run
    (tests/run/test_runtime_parity.py's bars); that run differs from the unmasked one.
  * ``plait data prepare`` records the end-of-text id in the token file's header.
  * Refusals, one line each: --doc-mask on synthetic data, on a token file that records no
    end-of-text id, and with cp_impl=torch (rule runtime-doc-mask-cp-torch).
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest

torch = pytest.importorskip("torch")

import doc_mask_tasks
import tolerances
from test_runtime_parity import assert_same_training
from test_train_cli import run_inline

from plait.run.modules.documents import document_ids, document_positions
from plait.spec.models import get_model


def test_document_ids_and_positions_restart_after_each_end_of_text():
    eos = 3
    tokens = torch.tensor([[9, 3, 5, 6, 3, 3, 8], [3, 7, 7, 7, 7, 7, 7]])
    documents = document_ids(tokens, eos)
    assert documents.tolist() == [[0, 0, 1, 1, 1, 2, 3], [0, 1, 1, 1, 1, 1, 1]]  # eos closes its document
    assert document_positions(documents).tolist() == [[0, 1, 0, 1, 2, 0, 0], [0, 0, 1, 2, 3, 4, 5]]


CASES = [("tiny", "sdpa", 0), ("tiny", "eager", 0), ("tiny-gpt", "sdpa", 0), ("tiny", "sdpa", 4), ("tiny", "eager", 4)]


@pytest.mark.parametrize("name,attn,window", CASES, ids=[f"{n}-{a}-w{w}" for n, a, w in CASES])
def test_packed_loss_equals_the_documents_run_one_by_one(name, attn, window):
    import torch.nn.functional as F

    from plait.run.model import apply_kernels, build_model, init_weights

    spec = dataclasses.replace(get_model(name), n_layers=2, sliding_window=window)
    model = build_model(spec, "cpu")
    init_weights(model, spec, 0, "cpu")
    apply_kernels(model, attn, "fused")
    lengths = [5, 9, 1, 12, 5]  # 32 tokens; the last token is the label of the row's last input
    row = torch.from_numpy(doc_mask_tasks.packed_tokens(lengths + [1], seed=1)[:33]).long()[None]
    inputs, labels = row[:, :-1], row[:, 1:]

    def loss_sum(x, y, **kwargs):
        return F.cross_entropy(model(x, **kwargs).flatten(0, 1), y.flatten(), reduction="sum").item()

    with torch.no_grad():
        packed = loss_sum(inputs, labels, documents=document_ids(inputs, doc_mask_tasks.EOS)) / inputs.numel()
        starts = [sum(lengths[:i]) for i in range(len(lengths))]
        alone = sum(loss_sum(inputs[:, a:a + n], labels[:, a:a + n]) for a, n in zip(starts, lengths)) / inputs.numel()
        unmasked = loss_sum(inputs, labels) / inputs.numel()
    rtol = tolerances.run_rtol(spec.vocab, spec.n_layers)
    assert abs(packed - alone) <= rtol * alone, (packed, alone)
    assert abs(unmasked - alone) > 10 * rtol * alone  # the mask (and the positions) matter


@pytest.mark.parametrize("impl", ["ring", "allgather", "ulysses"])
def test_cp_kernels_carry_the_document_mask(dist_pool, impl):
    out = dist_pool(2).run(doc_mask_tasks.kernel_errors, impl, timeout=60)
    for rank, errors in enumerate(out):
        assert errors["documents"] >= 4 and errors["scale"] > 1e-2
        atol = tolerances.attention_atol(32, 8, max(errors["scale"], errors["inputs"]))
        for name in ("out", "dq", "dk", "dv"):
            assert errors[name] <= atol, f"{impl} rank {rank}: {name} differs by {errors[name]:.3g}"


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """(token file, the single-process doc-masked run on it)."""
    path = str(tmp_path_factory.mktemp("docs") / "packed.tok")
    doc_mask_tasks.packed_file(path)
    return path, doc_mask_tasks.reference_packed(path)


# tp: 2 micro-batches of 4 sequences (mbs=4), not 8 of 1: each row's documents are masked alike in either,
# and a tp micro-batch is ~50 gloo collectives
@pytest.mark.parametrize("layout", ["cp=2", "cp=2,cp_impl=allgather", "pp=2", "tp=2,mbs=4"])
def test_doc_masked_training_matches_one_process(dist_pool, packed, layout):
    path, reference = packed
    out = dist_pool(2).run(doc_mask_tasks.train_packed, layout, path, timeout=180)
    assert_same_training(out[0], reference, layout)


def test_doc_mask_refusals_are_one_line(capsys, tmp_path):
    from plait.run.data.token_format import TokenWriter

    base = ["train", "--model", "tiny", "--global-batch", "8", "--seq-len", "32", "--device", "cpu", "--dry-run",
            "--doc-mask"]
    path = tmp_path / "no-eos.tok"
    with TokenWriter(path, 512, "raw") as writer:  # as import_bin writes: no end-of-text id recorded
        writer.append(doc_mask_tasks.packed_tokens([8] * 20, 0))
    packed = tmp_path / "packed.tok"
    doc_mask_tasks.packed_file(str(packed), n_docs=40)
    for args, expected in (
            ([], "--doc-mask needs a token file (plait data prepare): synthetic data has no documents"),
            (["--data", str(path)], f"token file {path} records no end-of-text id"),
            (["--data", str(packed), "--layout", "cp=2,cp_impl=torch", "--nproc-per-node", "2"],
             "document masks (--doc-mask) with cp_impl=torch: PyTorch's ring attention takes no mask")):
        code, _, err = run_inline(capsys, *base, *args)
        assert code == 2 and expected in err and "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1, err


def test_learned_positions_restart_per_document_under_sequence_parallelism(dist_pool, packed):
    """GPT's position table is looked up per row; sp's plan splits its output along the sequence."""
    path, _ = packed
    out = dist_pool(2).run(doc_mask_tasks.train_packed, "tp=2,mbs=4", path, model="tiny-gpt", timeout=180)
    assert_same_training(out[0], doc_mask_tasks.reference_packed(path, model="tiny-gpt"), "tp=2,mbs=4 tiny-gpt")


def test_the_reference_run_masks_documents(packed):
    path, reference = packed
    unmasked = doc_mask_tasks.reference_unmasked(path)
    first = reference["losses"][0]
    assert abs(unmasked["losses"][0] - first) > 10 * tolerances.LOSS_RTOL * first


def test_prepare_records_the_end_of_text_id(tmp_path):
    from plait.run.data.tokens import TokenFile, prepare

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name, text in (("a.txt", "one two"), ("b.txt", "three"), ("c.txt", "four five six")):
        (corpus / name).write_text(text)
    summary = prepare([corpus], tmp_path / "out.tok")
    tokens = TokenFile(tmp_path / "out.tok")
    assert tokens.eos_id == summary["eos_id"] == 256  # the byte tokenizer's end of text
    assert tokens.mean_document_length() == round(summary["n_tokens"] / 3) == round((8 + 6 + 14) / 3)


def test_flex_block_mask_is_the_document_mask():
    """The CUDA kernel's block mask (FlexAttention, forward only: it has no backward on the CPU)
    selects the same pairs as SDPA's boolean mask, with and without a window; built once per
    rows and window."""
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    from plait.run.modules.documents import block_mask_of, row_mask

    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 64, 16, generator=generator) for _ in range(3))
    rows = torch.from_numpy(doc_mask_tasks.packed_tokens(doc_mask_tasks.document_lengths(40, 2, longest=30), 2)[:128])
    documents = document_ids(rows.view(2, 64), doc_mask_tasks.EOS)
    for window in (0, 5):
        with torch.no_grad(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*without torch.compile")  # eager: the reference path
            got = flex.flex_attention(q, k, v, block_mask=block_mask_of(documents, window, 64))
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=row_mask(documents, window))
        assert (got - want).abs().max() <= tolerances.attention_atol(64, 16, 4.0)
    assert block_mask_of(documents, 5, 64) is block_mask_of(documents, 5, 64)
