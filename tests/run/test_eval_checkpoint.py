"""An evaluation and a checkpoint on the same step, and on the last step, under every kind of layout
(issue 31, item 2): a forward with no backward leaves the ZeRO units that keep their parameters
gathered after a forward unsharded, and the save then looked up optimizer state under the gathered
tensors (``KeyError: 'exp_avg'``) and lost the last checkpoint. Each checkpoint written right after
an evaluation must verify and resume bit for bit."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import eval_tasks


@pytest.fixture(scope="module")
def eval_file(tmp_path_factory):
    return eval_tasks.write_token_file(tmp_path_factory.mktemp("eval") / "held_out.bin", 2000, 512, seed=3)


# tp=2: 2 micro-batches of 4 sequences (mbs=4), not 8 of 1 (the evaluation and the save do not see them,
# and a tp micro-batch is ~50 gloo collectives)
@pytest.mark.parametrize("layout", ["dp=2,zero=0", "dp=2,zero=1", "dp=2,zero=2", "dp=2,zero=3",
                                    "tp=2,mbs=4", "pp=2"])
def test_eval_and_checkpoint_on_the_same_step_and_the_last(dist_pool, eval_file, tmp_path, layout):
    out = dist_pool(2).run(eval_tasks.eval_and_save_then_resume, layout, eval_file, str(tmp_path), timeout=180)
    assert out[0]["saved"] == [1, 2]
    for rank in out:
        assert len(rank["first"]) == 2 and rank["resumed"] == rank["first"][1:]
