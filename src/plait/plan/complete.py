"""Complete a partial layout: keep the keys that were given, search the rest, take the fastest that fits.

Used by ``plait plan --layout ... --complete``, by ``plait validate`` for published runs whose
source is silent on a knob, and by ``plait train --layout`` when ``mbs`` is left out. The knobs
searched when not given (``COMPLETABLE``): tp, pp, dp, cp (whatever of them the GPU count leaves
open), micro-batch size, ZeRO stage, checkpoint policy and the number of checkpointed layers per
stage (``full`` on all, 1/4, 1/2 or 3/4 of a stage's layers), sequence parallelism (tp > 1), pipeline schedule and virtual stages.
Every other key keeps its given value or its default. Offload is not tried (a completed layout is
one that fits as it is).

Choice (``pick``): among the layouts that fit with ``headroom`` to spare (total <= capacity ·
(1 - headroom), see ``plait.plan.memory.is_risky``), the one with the most free memory among
those within 1% of the best predicted tokens/s/GPU; only when none fits with the headroom, the
same rule over the layouts that fit at all (the result is then ``risky``). ``Completion.note()``
states every completed knob: ``completed: mbs=1, zero=1, ckpt=selective — fastest that fits``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from plait.errors import PlaitError
from plait.plan.cost import StepBreakdown, estimate_step
from plait.plan.memory import DEFAULT_HEADROOM, MemoryBreakdown, estimate_memory, is_risky
from plait.plan.params import DEFAULT_PARAMS, CostParams
from plait.plan.candidates import SearchConstraints, candidate_layouts
from plait.spec.hardware import ClusterSpec
from plait.spec.layout import LAYOUT_KEYS, RUNTIME_CP_IMPLS, JobSpec, Layout
from plait.spec.layout_keys import fields_set_by
from plait.spec.model import ModelSpec
from plait.spec.validate import errors_of, stage_layers, validate

# the knobs completion searches when they are not given, in the order notes list them
COMPLETABLE = ("tp", "pp", "dp", "cp", "mbs", "zero", "ckpt", "sp", "schedule", "vpp")
# keys that ``candidate_layouts`` enumerates (the others are pinned afterwards)
_ENUMERATED = ("tp", "pp", "dp", "cp", "mbs", "zero", "ckpt", "schedule", "vpp", "hsdp", "precision", "ep", "etp")
NEAR_BEST = 0.01  # layouts within this fraction of the best tokens/s count as equally fast


@dataclass(frozen=True)
class Completion:
    """The completed layout and its prediction; ``completed``: (key, value text) of each searched knob."""

    layout: Layout
    memory: MemoryBreakdown
    step: StepBreakdown
    completed: tuple[tuple[str, str], ...]
    fits: bool
    risky: bool
    evaluated: int  # valid candidate layouts whose memory was predicted

    def note(self) -> str:
        """``completed: mbs=1, zero=1 — fastest that fits`` (empty when nothing was completed)."""
        if not self.completed:
            return ""
        knobs = ", ".join(f"{k}={v}" for k, v in self.completed)
        if not self.fits:
            why = "none fits; the one that needs the least memory"
        elif self.risky:
            why = "fastest that fits; none fits with the memory headroom (risky)"
        else:
            why = "fastest that fits"
        return f"completed: {knobs} — {why}"


def given_keys(text: str) -> dict:
    """{field: value} of the keys a ``--layout`` text writes (the others are left to completion).

    ``ckpt=full:4`` gives ``ckpt`` and ``ckpt_layers``; ``ckpt=full`` gives ``ckpt_layers=0`` too
    (every layer); ``vpp`` gives the schedule its default.
    """
    out: dict = {}
    for item in (part.strip() for part in text.replace(" ", ",").split(",")):
        if not item:
            continue
        parsed = Layout.parse(item)
        key = item.split("=", 1)[0].strip().lower().replace("-", "_")
        for name in fields_set_by(LAYOUT_KEYS, key):
            out[name] = getattr(parsed, name)
    if "vpp" in out and "schedule" not in out and out["vpp"] > 1:
        out["schedule"] = "interleaved-1f1b"
    return out


def _value_text(layout: Layout, key: str) -> str:
    if key == "ckpt":
        return layout.ckpt + (f":{layout.ckpt_layers}" if layout.ckpt_layers else "")
    value = getattr(layout, key)
    return str(int(value)) if isinstance(value, bool) else str(value)


def _variants(model: ModelSpec, layout: Layout, given: dict, pinned: dict):
    """The enumerated layout with the pinned keys applied, and the sp / ckpt-layer-count variants."""
    if pinned:
        layout = replace(layout, **pinned)
    sps = [layout.sp] if "sp" in given or layout.tp == 1 else [True, False]
    counts = [layout.ckpt_layers]
    if "ckpt_layers" not in given and "ckpt" not in given and layout.ckpt == "full":
        per_stage = stage_layers(model, layout) * layout.vpp
        counts += sorted({per_stage * k // 4 for k in (1, 2, 3)} - {0, per_stage})
    for sp in sps:
        for count in counts:
            yield replace(layout, sp=sp, ckpt_layers=count) if (sp, count) != (layout.sp, layout.ckpt_layers) else layout


def pick(options: list, headroom: float, tokens=lambda o: o.step.tokens_per_s_per_gpu,
         memory=lambda o: o.memory):
    """The chosen option (see the module docstring): fits with headroom, else fits; fastest within
    ``NEAR_BEST``, most free memory among those. None when ``options`` is empty."""
    if not options:
        return None
    safe = [o for o in options if not is_risky(memory(o), headroom)]
    pool = safe or options
    best = max(tokens(o) for o in pool)
    near = [o for o in pool if tokens(o) >= (1 - NEAR_BEST) * best]
    return max(near, key=lambda o: (memory(o).headroom, tokens(o)))


def complete(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, given: dict,
             params: CostParams = DEFAULT_PARAMS, *, runtime: str = "torch", headroom: float = DEFAULT_HEADROOM,
             max_mbs: int = 16, memory_of: Callable | None = None,
             schedules: tuple[str, ...] = SearchConstraints().schedules,
             cp_impls: tuple[str, ...] = RUNTIME_CP_IMPLS) -> Completion:
    """Fix ``given`` ({Layout field: value}), search the knobs left out, return the choice.

    ``memory_of(layout, memory) -> memory`` may adjust the predicted memory (a published run's
    checkpointing that plait's policies only approximate); ``schedules``: the pipeline schedules
    tried when the schedule is not given. Raises PlaitError when no layout
    with the given keys is valid on ``cluster.n_gpus`` GPUs.
    """
    if not 0 <= headroom < 1:
        raise PlaitError(f"--memory-headroom {headroom} must be a fraction in [0, 1)")
    fixed = tuple((k, v) for k, v in sorted(given.items()) if k in _ENUMERATED)
    if "hsdp" not in given:
        fixed += (("hsdp", 1),)
    pinned = {k: v for k, v in given.items() if k not in _ENUMERATED}
    constraints = SearchConstraints(fixed=fixed, max_mbs=max_mbs, allow_offload=False, schedules=schedules)
    fitting, smallest, evaluated, first_errors = [], None, 0, None
    for base in candidate_layouts(model, cluster, job, constraints, params, cp_impls):
        for layout in _variants(model, base, given, pinned):
            errors = errors_of(validate(model, cluster, job, layout))
            if errors:
                first_errors = first_errors or errors
                continue
            memory = estimate_memory(model, cluster, job, layout, params, runtime=runtime)
            if memory_of is not None:
                memory = memory_of(layout, memory)
            evaluated += 1
            if smallest is None or memory.total < smallest[1].total:
                smallest = (layout, memory)
            if memory.fits:
                fitting.append((layout, memory, estimate_step(model, cluster, job, layout, params, runtime=runtime)))
    if smallest is None:
        fixed_text = ", ".join(f"{k}={v}" for k, v in sorted(given.items())) or "nothing fixed"
        why = "; ".join(e.message for e in first_errors) if first_errors else (
            "dp = GPUs/(tp·pp·cp) must divide the global batch and tp the head counts and ffn_hidden")
        raise PlaitError(f"no valid layout of {model.name} on {cluster.n_gpus} GPUs with {fixed_text}: {why}")
    chosen = pick(fitting, headroom, tokens=lambda o: o[2].tokens_per_s_per_gpu, memory=lambda o: o[1])
    if chosen is None:
        layout, memory = smallest
        step = estimate_step(model, cluster, job, layout, params, runtime=runtime)
    else:
        layout, memory, step = chosen
    completed = tuple((k, _value_text(layout, k)) for k in COMPLETABLE
                      if k not in given and not (k == "sp" and layout.tp == 1)
                      and not (k == "ckpt" and "ckpt_layers" in given)
                      and not (k == "vpp" and layout.pp == 1) and not (k == "schedule" and layout.pp == 1))
    return Completion(layout, memory, step, completed, chosen is not None,
                      chosen is not None and is_risky(memory, headroom), evaluated)
