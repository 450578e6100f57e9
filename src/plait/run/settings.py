"""How a ``plait train`` setting is declared: once, as a field of its config section (no torch).

A field declared with ``setting(default, flag, help, group, ...)`` carries its ``Setting`` in its
metadata, as a ``Layout`` field carries its ``KeySpec`` (``plait.spec.layout_keys``). From the
declarations follow the command-line flags (``plait.cli.support.setting_flags``), the job-file keys
(read from those flags: ``plait.cli.jobfile``), the request a command line becomes
(``plait.run.launcher.request.TrainRequest``, generated), the sections built from it
(``section_of``) and the flag table of docs/training.md (``flags_markdown``).

A flag's value is the field's value unless the setting says otherwise: ``kind`` (the flag's type
when it is not the field's: ``--fused-qkv`` is a switch, the field ``qkv`` a name), ``to_field``
(flag value -> field value) and ``unset`` (the flag's default is None, "not given": a fresh run
takes the field's default, a resumed run the saved value).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable

from plait.errors import PlaitError

# the help groups of ``plait train``, in --help order; the key is the job-file table (the title's first word)
GROUPS = {"what": "what to train (a saved plan, or model + layout + batch)", "optimizer": "optimizer",
          "evaluation": "evaluation and metrics sinks", "where": "where to run (torchrun)",
          "checkpoints": "checkpoints, resume, failures"}
KINDS = {"int": int, "float": float, "str": str, "bool": bool}


@dataclass(frozen=True)
class Setting:
    """Everything about one setting but its field's name, type and default (the dataclass field has those)."""

    flag: str  # the long flag, e.g. "--global-batch"; its dest (and the request's field) is "global_batch"
    help: str  # what --help says; "{default}" (and "{FIELD}", another field's default) are filled in
    group: str  # a key of GROUPS: the --help group and the job-file table
    aliases: tuple[str, ...] = ()  # other spellings of the flag ("--nproc")
    choices: tuple | None = None  # the values the flag accepts
    metavar: str | None = None
    kind: type | None = None  # the flag's value type when it is not the field's (bool: a switch)
    unset: bool = False  # the flag's default is None: "not given" (fresh run: the field's default)
    flag_default: Any = None  # the flag's default when it is not the field's (with ``kind``)
    to_field: Callable[[Any], Any] | None = None  # the flag's value -> the field's value
    same_run: bool = False  # it defines the run: a resumed run keeps the saved value and refuses another

    def __post_init__(self) -> None:
        if self.group not in GROUPS or not self.flag.startswith("--"):
            raise ValueError(f"setting {self.flag!r}: group {self.group!r} is not one of {tuple(GROUPS)}")

    @property
    def dest(self) -> str:
        """The flag's dest (its name with underscores): the request's field name."""
        return self.flag[2:].replace("-", "_")


def setting(default, flag: str, help: str, group: str, **options) -> Any:
    """A dataclass field with ``default`` whose metadata holds its ``Setting``."""
    return dataclasses.field(default=default, metadata={"setting": Setting(flag, help, group, **options)})


@dataclass(frozen=True)
class Declared:
    """One declared setting, read from its section: the field and what the flag does."""

    section: type
    name: str  # the field's name
    spec: Setting
    default: Any  # the field's default
    kind: type  # the flag's value type (bool: a switch)
    negatable: bool  # a switch with --no-X (the field may be None: "auto")

    @property
    def dest(self) -> str:
        return self.spec.dest

    @property
    def flag_default(self):
        """The flag's value when the command line does not give it."""
        if self.spec.unset:
            return None
        return self.default if self.spec.kind is None else self.spec.flag_default

    def field_value(self, given):
        """The field's value for the flag's value ``given`` (None with ``unset``: the field's default)."""
        if given is None and self.spec.unset:
            return self.default
        return self.spec.to_field(given) if self.spec.to_field is not None else given

    def help_text(self) -> str:
        """The help, with ``{default}`` and ``{FIELD}`` defaults of the section filled in."""
        text = self.spec.help
        if "{" not in text:
            return text
        values = {f.name: f.default for f in dataclasses.fields(self.section)
                  if f.default is not dataclasses.MISSING}
        return text.format(**{**values, "default": Shown(self.default)})


class Shown:
    """A default as the help prints it: ``3e-4`` rather than ``0.0003``; ``{default:g}`` formats as asked."""

    def __init__(self, value) -> None:
        self.value = value

    def __format__(self, spec: str) -> str:
        value = self.value
        if spec or not isinstance(value, float):
            return format(value, spec)
        text = repr(value)
        mantissa, _, exponent = f"{value:.0e}".partition("e")
        compact = f"{mantissa}e{int(exponent)}"
        return compact if float(compact) == value and len(compact) < len(text) and value < 1 else text


def _kind(field: dataclasses.Field, spec: Setting) -> tuple[type, bool]:
    """(the flag's value type, whether a switch has --no-X) from the setting or the field's annotation."""
    annotation = str(field.type).replace(" ", "").split("|")
    if spec.kind is not None:
        return spec.kind, False
    names = [name for name in annotation if name != "None"]
    if len(names) != 1 or names[0] not in KINDS:
        raise ValueError(f"setting {spec.flag!r}: give kind= for the field type {field.type!r}")
    return KINDS[names[0]], KINDS[names[0]] is bool and "None" in annotation


def settings_of(*sections: type) -> list[Declared]:
    """The declared settings of ``sections``, section by section in field order."""
    out = []
    for section in sections:
        for field in dataclasses.fields(section):
            spec = field.metadata.get("setting")
            if spec is not None:
                out.append(Declared(section, field.name, spec, field.default, *_kind(field, spec)))
    return out


def setting_values(request, section: type) -> dict[str, Any]:
    """{field: value} of ``section``'s settings, read from ``request`` (anything with the flags' dests)."""
    return {d.name: d.field_value(getattr(request, d.dest)) for d in settings_of(section)}


def section_of(request, section: type, **given):
    """``section`` built from ``request``'s flags; ``given`` fields win (e.g. the plan's GPU)."""
    return section(**{**setting_values(request, section), **given})


def flags_markdown(*sections: type) -> str:
    """The Markdown table of the settings' flags, by help group: flag, job-file key, default, meaning."""
    rows = ["| flag | job file | default | meaning |", "|---|---|---|---|"]
    declared = settings_of(*sections)
    for group in GROUPS:
        for d in (d for d in declared if d.spec.group == group):
            flags = ", ".join(f"`{f}`" for f in (d.spec.flag, *d.spec.aliases))
            if d.negatable:
                flags += f" / `--no-{d.spec.flag[2:]}`"
            if d.spec.choices:
                flags += " `" + "\\|".join(map(str, d.spec.choices)) + "`"
            elif d.kind is not bool:
                flags += f" `{d.spec.metavar or d.dest.upper()}`"
            shown = d.flag_default  # not given: None ("not given"; the help says what follows), or this
            default = "" if shown is None or d.kind is bool else f"`{format(Shown(shown))}`"
            meaning = d.help_text().replace("%%", "%").replace("|", "\\|")
            rows.append(f"| {flags} | `[{group}] {d.spec.flag[2:]}` | {default} | {meaning} |")
    return "\n".join(rows) + "\n"


# ------------------------------------------------------------------ the sections' checks
def refuse(problems: list[str]) -> None:
    """Raise the one-line "invalid run" error when a section found ``problems``."""
    if problems:
        raise PlaitError("invalid run: " + "; ".join(problems))


def positive_int_problems(values: dict[str, object]) -> list[str]:
    return [f"{name}={value!r} must be a positive integer" for name, value in values.items()
            if not isinstance(value, int) or isinstance(value, bool) or value < 1]


def non_negative_int_problems(values: dict[str, object]) -> list[str]:
    return [f"{name}={value!r} must be a non-negative integer" for name, value in values.items()
            if not isinstance(value, int) or isinstance(value, bool) or value < 0]


def number_problems(values: dict[str, tuple[object, float, bool]]) -> list[str]:
    """Problems of numbers ``{name: (value, lower bound, whether the bound itself is allowed)}``:
    each must be a finite real number above (or at) its bound."""
    problems = []
    for name, (value, low, inclusive) in values.items():
        finite = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not finite or value < low or (value == low and not inclusive):
            problems.append(f"{name}={value!r} must be a finite number {'>=' if inclusive else '>'} {low:g}")
    return problems
