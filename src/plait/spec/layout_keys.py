"""How a ``Layout`` key is declared: one ``KeySpec`` per field, from which parsing, printing,
validation, error texts and the key documentation all follow (no torch).

A field is declared with ``layout_key(default, kind, doc, ...)``, which stores its ``KeySpec`` in
the field's metadata. Kinds:

  int       an integer >= ``minimum``, or one of ``choices`` when they are given (``zero``)
  bool      1/0 (true/false, yes/no, on/off); printed as 1/0
  choice    one of ``choices`` (``aliases`` map other spellings to them)
  fraction  a number in [0, 1]
  special   a string with its own ``check`` (``order``)

A key with its own syntax gives ``parse`` (text -> field values) and ``format`` (layout -> text or
None at its default); a field written inside another key's text names it in ``printed_by``
(``ckpt_layers`` in ``ckpt=full:4``; ``offload_target`` in ``offload=disk:0.5``, which has no
``key=value`` of its own: ``own_key=False``). ``default_from`` gives a default that depends on
other keys (the schedule on ``vpp``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Mapping

from plait.errors import PlaitError

KINDS = ("int", "bool", "choice", "fraction", "special")
_TRUE = {"1", "true", "yes", "on", "y"}
_FALSE = {"0", "false", "no", "off", "n"}


@dataclass(frozen=True)
class KeySpec:
    """Everything about one Layout key except its name and default (the dataclass field has those)."""

    kind: str  # one of KINDS
    doc: str  # one line of Markdown: what the key means
    choices: tuple = ()  # choice: the allowed names; int: the allowed values when a closed set
    minimum: int = 1  # int: the smallest allowed value
    always: bool = False  # printed even at its default (the degrees and mbs)
    runtime: bool = True  # False: the planner models it, plait train does not run it yet
    aliases: tuple[tuple[str, str], ...] = ()  # choice: (other spelling, name)
    own_key: bool = True  # False: only written inside another key's text
    printed_by: str = ""  # the key whose text carries this field
    label: str = ""  # how errors name it when not "key=value" (e.g. "offload target")
    values_doc: str = ""  # the documentation's values column, when the kind does not say it
    default_doc: str = ""  # the documentation's default column, when not the field's default
    parse: Callable[[str], dict] | None = None  # text -> {field: value} (own syntax)
    format: Callable[[Any], str | None] | None = None  # layout -> "key=text", or None at the default
    check: Callable[[Any], str | None] | None = None  # value -> what is wrong ("must ..."), or None
    default_from: Callable[[dict], Any] | None = None  # parsed values -> default when not given

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"KeySpec kind {self.kind!r} is not one of {KINDS}")


def layout_key(default, kind: str, doc: str, **options) -> Any:
    """A dataclass field with ``default`` whose metadata holds its ``KeySpec``."""
    return dataclasses.field(default=default, metadata={"key": KeySpec(kind, doc, **options)})


def key_specs(cls) -> Mapping[str, tuple[KeySpec, Any]]:
    """{field name: (KeySpec, default)} of a dataclass declared with ``layout_key``, in field order
    (read-only)."""
    return MappingProxyType({f.name: (f.metadata["key"], f.default) for f in dataclasses.fields(cls)})


def parseable_keys(keys: Mapping[str, tuple[KeySpec, Any]]) -> list[str]:
    """The names ``key=value`` accepts, in field order (``keys``: a ``key_specs`` mapping)."""
    return [name for name, (spec, _) in keys.items() if spec.own_key]


def fields_set_by(keys: Mapping[str, tuple[KeySpec, Any]], key: str) -> tuple[str, ...]:
    """The fields that one ``key=value`` item may set: the key and those written inside it."""
    return (key,) + tuple(name for name, (spec, _) in keys.items() if spec.printed_by == key)


# ------------------------------------------------------------------ values
def as_int(key: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise PlaitError(f"layout key {key}={raw!r} must be an integer") from None


def as_bool(key: str, raw: str) -> bool:
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise PlaitError(f"layout key {key}={raw!r} must be 1/0 (or true/false)")


def parse_value(name: str, spec: KeySpec, raw: str) -> dict:
    """{field: value} for one ``name=raw`` item (``raw`` lower-cased)."""
    if spec.parse is not None:
        return spec.parse(raw)
    if spec.kind == "int":
        return {name: as_int(name, raw)}
    if spec.kind == "bool":
        return {name: as_bool(name, raw)}
    if spec.kind == "fraction":
        try:
            return {name: float(raw)}
        except ValueError:
            raise PlaitError(f"{name}={raw!r} must be a fraction") from None
    return {name: dict(spec.aliases).get(raw, raw)}


def format_value(name: str, spec: KeySpec, value, default) -> str | None:
    """``name=value`` as ``to_string`` writes it, or None when it is left out (at its default)."""
    if value == default and not spec.always:
        return None
    return f"{name}={int(value) if spec.kind == 'bool' else value}"


def _either(values) -> str:
    """'a or b', 'a, b or c'."""
    words = [str(v) for v in values]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


MAX_DEGREE = 2**24  # largest integer key (a degree, mbs, ckpt_layers): more GPUs or sequences than any job


def _plainly_valid(spec: KeySpec, value) -> bool:
    """A quick yes for the common valid values (the search builds many layouts); False: look closer."""
    if spec.choices:
        return value in spec.choices
    if spec.kind == "int":
        return type(value) is int and spec.minimum <= value <= MAX_DEGREE
    return spec.kind == "bool" and type(value) is bool


def problems(obj, keys: Mapping[str, tuple[KeySpec, Any]]) -> list[str]:
    """What is wrong with each field of ``obj`` (one clause per broken key, in field order)."""
    out = []
    for name, (spec, _) in keys.items():
        value = getattr(obj, name)
        if not _plainly_valid(spec, value):
            wrong = problem(name, spec, value)
            if wrong is not None:
                out.append(wrong)
    return out


def changed_problems(changes: Mapping[str, Any], keys: Mapping[str, tuple[KeySpec, Any]]) -> list[str]:
    """``problems`` of just the ``changes`` (field name -> new value), for a copy of an object whose
    other fields were checked already."""
    out = []
    for name, value in changes.items():
        if name not in keys:
            raise TypeError(f"no layout key {name!r}")  # a programming error, not user input
        spec = keys[name][0]
        if not _plainly_valid(spec, value):
            wrong = problem(name, spec, value)
            if wrong is not None:
                out.append(wrong)
    return out


def problem(name: str, spec: KeySpec, value) -> str | None:
    """What is wrong with ``value`` for this key (one clause), or None."""
    what = f"{spec.label} {value!r}" if spec.label else f"{name}={value!r}"
    if spec.check is not None:
        wrong = spec.check(value)
        return f"{what} {wrong}" if wrong else None
    if spec.kind == "int":
        if spec.choices:
            return None if value in spec.choices else f"{what} must be {_either(spec.choices)}"
        if not isinstance(value, int) or isinstance(value, bool) or value < spec.minimum:
            sign = "positive" if spec.minimum == 1 else "non-negative"
            return f"{what} must be a {sign} integer"
        if value > MAX_DEGREE:
            return f"{what} is more than {MAX_DEGREE}"
    elif spec.kind == "choice" and value not in spec.choices:
        if len(spec.choices) > 2:
            return f"{what} must be one of {', '.join(spec.choices)}"
        return f"{what} must be {_either(spec.choices)}"
    elif spec.kind == "bool" and (not isinstance(value, (bool, int)) or value not in (True, False)):
        return f"{what} must be true or false (1 or 0)"  # a plan file's list or object: one line, not a TypeError
    elif spec.kind == "fraction" and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not 0.0 <= value <= 1.0):
        return f"{what} must be a fraction between 0 and 1"
    return None


# --------------------------------------------------------------- the table
def _values_text(spec: KeySpec) -> str:
    if spec.values_doc:
        return spec.values_doc
    if spec.kind == "int":
        return ", ".join(str(c) for c in spec.choices) if spec.choices else f"integer ≥ {spec.minimum}"
    if spec.kind == "bool":
        return "1 / 0"
    if spec.kind == "choice":
        return ", ".join(f"`{c}`" for c in spec.choices)
    return "0 to 1" if spec.kind == "fraction" else ""


def _default_text(spec: KeySpec, default) -> str:
    if spec.default_doc:
        return spec.default_doc
    return str(int(default)) if spec.kind == "bool" else f"{default}"


def keys_markdown(keys: Mapping[str, tuple[KeySpec, Any]]) -> str:
    """A Markdown table of the keys ``key=value`` accepts: key, values, default, meaning."""
    lines = ["| key | values | default | meaning |", "|---|---|---|---|"]
    for name, (spec, default) in keys.items():
        if not spec.own_key:
            continue
        meaning = spec.doc + ("" if spec.runtime else " (planner only: `plait train` does not run it yet)")
        lines.append(f"| `{name}` | {_values_text(spec)} | {_default_text(spec, default)} | {meaning} |")
    return "\n".join(lines) + "\n"
