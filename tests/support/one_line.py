"""The message of a PlaitError, checked to be one non-empty line (what the CLI prints)."""

from __future__ import annotations

import pytest

from plait.errors import PlaitError


def error_of(fn, *args, **kwargs) -> str:
    """Call ``fn`` expecting a PlaitError; return its message after checking it is one line."""
    with pytest.raises(PlaitError) as info:
        fn(*args, **kwargs)
    message = str(info.value)
    assert message and "\n" not in message
    return message
