"""A layout that does not name its attention kernel trains with one the runtime runs the model with.

GPT-OSS's sinks (and Gemma-2's soft-capped scores) rule the default ``attn=flash`` out (rule
``runtime-attn-softcap``); ``plait train --layout "dp=2,ep=2,zero=3"`` must not stop on a key the
user never wrote. A kernel the user names is kept (and refused by the rule if it cannot run)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from plait.run.launcher.target import TrainTarget
from plait.spec.models import get_model


def _target(layout: str | None, model: str) -> TrainTarget:
    request = SimpleNamespace(plan=None, model=model, layout=layout, global_batch=8, seq_len=64)
    return TrainTarget.read(request)


@pytest.mark.parametrize("model, layout, expected", [
    ("tiny-gpt-oss", "dp=2,ep=2,zero=3", "flex"),   # sinks: flash cannot run it
    ("tiny-gpt-oss", None, "flex"),                  # no layout at all: dp over the processes
    ("tiny-gpt-oss", "dp=2,attn=eager", "eager"),     # named: kept
    ("tiny-gpt-oss", "dp=2,attn=flash", "flash"),     # named: kept, for the rule to refuse in one line
    ("tiny", "dp=2", "flash"),                        # a plain causal model keeps the default
])
def test_unnamed_attention_kernel_is_one_the_runtime_runs(model, layout, expected):
    target = _target(layout, model)
    trained = target.layout_for(get_model(model), world_size=2)
    assert trained.attn == expected
    assert trained.dp == 2
