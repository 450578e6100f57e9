"""Memoized planner functions, keyed by the layout fields they read (no torch).

The search prices tens of thousands of layouts that differ in a few knobs; most of a layout's
memory (a layer's saved tensors, the states of a stage's parameters) depends on a handful of its
fields. ``by_layout_fields`` caches a function of ``(model, layout, *args)`` under the model, the
named fields of the layout and the other arguments (all hashable), so two layouts that agree on those fields
share one computation.

The fields named must be every field the function reads, directly or through a property; a field
left out would hand one layout another's result. ``tests/plan/test_memo.py`` prices layouts warm
(after others filled the caches) and cold (caches cleared) and requires the same bytes and seconds.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

MAX_ENTRIES = 1 << 16  # per function; a full cache is emptied and refilled (search-sized working sets)
_CACHES: list[dict] = []


def by_layout_fields(*fields: str) -> Callable:
    """Decorator: cache ``fn(model, layout, *args, **kwargs)`` under (model, the layout's ``fields``,
    args, kwargs). A ``dict`` result is copied on the way out, so a caller may change its copy."""

    def wrap(fn: Callable) -> Callable:
        cache: dict = {}
        _CACHES.append(cache)

        @functools.wraps(fn)
        def cached(model, layout, *args, **kwargs):
            # the model by identity (hashing a ModelSpec field by field costs more than most of these
            # functions); the entry holds the model, so its id cannot pass to another while cached
            key = (id(model), tuple([getattr(layout, name) for name in fields]), args,
                   tuple(kwargs.items()) if kwargs else ())
            entry = cache.get(key)
            if entry is None or entry[0] is not model:
                if len(cache) >= MAX_ENTRIES:
                    cache.clear()
                entry = cache[key] = (model, fn(model, layout, *args, **kwargs))
            value = entry[1]
            return dict(value) if isinstance(value, dict) else value

        cached.uncached = fn
        return cached

    return wrap


def clear_caches() -> None:
    """Empty every cache of this module's decorator (a benchmark's cold start; the memo test)."""
    for cache in _CACHES:
        cache.clear()
