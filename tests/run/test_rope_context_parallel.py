"""A RoPE model trained past its config's max_position_embeddings under context parallelism matches
one process (gloo, CPU, fp32; tests/run/test_runtime_parity.py's bars): every cp rank builds the
RoPE tables for the whole sequence's length (``Transformer.sequence_parts``), not its shard's, which
dynamic NTK scaling (frequencies set by the sequence length) and positions past the config's table
both need."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("torch")

import runtime_tasks
from test_runtime_parity import assert_same_training

from plait.spec.models import get_model


@pytest.mark.parametrize("scaling", [{"rope_type": "dynamic", "factor": 2.0}, {}], ids=["dynamic", "plain"])
def test_rope_past_max_positions_with_cp_matches_one_process(dist_pool, references, tmp_path_factory, scaling):
    spec = dataclasses.replace(get_model("tiny"), name="tiny-short", max_seq_len=16, rope_scaling=scaling)
    path = tmp_path_factory.mktemp("model") / "tiny-short.json"  # trained at seq_len 32: twice its 16 positions
    path.write_text(spec.to_json())
    out = dist_pool(2).run(runtime_tasks.train_layout, "cp=2", model=str(path), timeout=240)
    assert_same_training(out[0], references(str(path)), "cp=2")
