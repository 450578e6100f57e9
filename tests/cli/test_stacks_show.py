"""``plait stacks --show NAME`` prints every number, default and run setting of each built-in stack with
its source (a ``[run]`` setting, such as Megatron's dropout, had raised a KeyError)."""

from __future__ import annotations

import pytest

from plait.cli import main
from plait.spec.stack import get_stack, stack_names


@pytest.mark.parametrize("name", stack_names())
def test_every_stack_shows_each_of_its_settings(name, capsys):
    assert main(["stacks", "--show", name]) == 0
    out = capsys.readouterr().out
    for what in get_stack(name).sources():
        assert what.split("[")[0] in out, what
