"""ep and edp are axes of the run's one mesh (``plait.run.parallel.mesh``): the dp·cp ranks of each
(pp, tp) position, flattened in the world mesh's order (outermost first: the reverse of
``order=``), unflattened into edp × ep with ep innermost. Each rank's groups are checked against
that rule worked out by hand for 4 ranks; the parity of training on them is tests/run/test_moe_parity.py.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import moe_tasks

# layout -> rank -> (ep group, edp group). Rank strides follow order= (innermost first; default
# tp-cp-dp-pp): dp=4: dp stride 1; dp=2,cp=2: cp stride 1, dp stride 2; dp=2,tp=2: tp stride 1,
# dp stride 2; order=dp-cp-tp-pp: dp stride 1, cp stride 2, so the flattened dp·cp index is
# (cp, dp) and ep's innermost ranks are the dp pairs.
EXPECTED = {
    "dp=4,ep=2": {0: ([0, 1], [0, 2]), 1: ([0, 1], [1, 3]), 2: ([2, 3], [0, 2]), 3: ([2, 3], [1, 3])},
    "dp=4,ep=4": {r: ([0, 1, 2, 3], [r]) for r in range(4)},
    "dp=2,cp=2,ep=2": {0: ([0, 1], [0, 2]), 1: ([0, 1], [1, 3]), 2: ([2, 3], [0, 2]), 3: ([2, 3], [1, 3])},
    "dp=2,cp=2,ep=2,order=dp-cp-tp-pp": {0: ([0, 1], [0, 2]), 1: ([0, 1], [1, 3]), 2: ([2, 3], [0, 2]),
                                         3: ([2, 3], [1, 3])},
    "dp=2,tp=2,ep=2": {0: ([0, 2], [0]), 1: ([1, 3], [1]), 2: ([0, 2], [2]), 3: ([1, 3], [3])},
    # etp=2: the (edp, ep, etp) view of the dp·cp·tp ranks, etp innermost: the same ep and edp groups
    "dp=2,tp=2,ep=2,etp=2": {0: ([0, 2], [0]), 1: ([1, 3], [1]), 2: ([0, 2], [2]), 3: ([1, 3], [3])},
    "pp=2,dp=2,ep=2,zero=3": {0: ([0, 1], [0]), 1: ([0, 1], [1]), 2: ([2, 3], [2]), 3: ([2, 3], [3])},
}


def test_expert_axes_are_views_of_the_one_mesh(dist_pool):
    layouts = list(EXPECTED)
    out = dist_pool(4).run(moe_tasks.expert_axes, layouts)
    for rank, results in enumerate(out):
        for layout, axes in zip(layouts, results, strict=True):
            ep, edp = EXPECTED[layout][rank]
            assert axes["ep"]["ranks"] == ep and axes["edp"]["ranks"] == edp, (layout, rank, axes)
            assert axes["ep"]["axis"] == ep and axes["edp"]["axis"] == edp, (layout, rank, axes)
            assert axes["ep"]["size"] == len(ep) and axes["edp"]["size"] == len(edp), (layout, rank)
            assert axes["ep"]["index"] == ep.index(rank) and axes["edp"]["index"] == edp.index(rank), (layout, rank)


def test_a_dense_run_has_size_one_ep_and_makes_no_expert_group(dist_pool):
    for rank in dist_pool(2).run(moe_tasks.dense_expert_axes, "dp=2,zero=3"):
        assert rank["ep"] == 1 and rank["edp"] == 2 and rank["expert_mesh"] is None
        assert "ep > 1" in rank["refusal"]
