"""Memoized planner functions, keyed by the layout fields they read (no torch).

The search prices tens of thousands of layouts that differ in a few knobs; most of a layout's
memory and time (a layer's saved tensors, a stage's parameters, a layer's kernel times, the expert
all-to-all) depends on a handful of its fields. ``by_layout_fields`` caches such a function under
the named fields of its ``Layout`` argument and its other arguments, so layouts that agree on those
fields share one computation. Numbers and text are keyed by value; any other argument (a model, a
GPU, the cost parameters: frozen dataclasses that are slow to hash field by field) by identity, and
the cache entry holds it, so its id cannot pass to another object while the entry lives.

The fields named must be every field the function reads, directly or through a property or a
callee; a field left out would hand one layout another's result. ``tests/plan/test_memo.py`` prices
layouts warm (after others filled the caches) and cold (caches emptied) and requires the same bytes
and seconds.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable

from plait.spec.layout import Layout

MAX_ENTRIES = 1 << 16  # per function; a full cache is emptied and refilled (search-sized working sets)
_CACHES: list[dict] = []
_BY_VALUE = frozenset((int, float, str, bool, type(None)))


def by_layout_fields(*fields: str) -> Callable:
    """Decorator: cache ``fn(*args, **kwargs)`` under the ``fields`` of its ``Layout`` arguments, the
    value of its number/text arguments and the identity of the others. A ``dict`` result is copied on
    the way out, so a caller may change its copy."""
    read = operator.attrgetter(*fields) if len(fields) > 1 else \
        (lambda layout: getattr(layout, fields[0])) if fields else (lambda layout: ())

    def wrap(fn: Callable) -> Callable:
        cache: dict = {}
        _CACHES.append(cache)

        @functools.wraps(fn)
        def cached(*args, **kwargs):
            held = []  # arguments keyed by identity: the entry keeps them alive, so no other takes their id
            key = []
            for value in args:
                kind = type(value)
                if kind in _BY_VALUE:
                    key.append(value)
                elif kind is Layout:
                    key.append(read(value))
                else:
                    key.append(id(value))
                    held.append(value)
            if kwargs:
                key.append(tuple(kwargs.items()))
            key = tuple(key)
            entry = cache.get(key)
            if entry is None:
                if len(cache) >= MAX_ENTRIES:
                    cache.clear()
                entry = cache[key] = (held, fn(*args, **kwargs))
            value = entry[1]
            return dict(value) if type(value) is dict else value

        cached.uncached = fn
        return cached

    return wrap


def clear_caches() -> None:
    """Empty every cache of this module's decorator (a benchmark's cold start; the memo test)."""
    for cache in _CACHES:
        cache.clear()
