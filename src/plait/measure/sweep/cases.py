"""What a sweep runs: its settings (SweepSpec) and the layouts (SweepCase), from a grid, a list
of layouts, or the planner's top K. No torch.

A grid is ``"dp=1,2;tp=1,2;mbs=1,2"``: keys separated by ``;``, each with its values separated by
``,``; the sweep runs the cartesian product. When ``dp`` is not in the grid it is what the other
degrees leave of the process count. ``compile=0,1`` sweeps ``plait train --compile``. Entries
that break a planner rule, or need another process count, become ``invalid`` rows with the
reason; they are not run.

Planner ranks (1 = predicted fastest) go only to layouts the planner predicts fit in memory;
a non-fitting one gets no rank and is flagged (``SweepCase.predicted_fits`` False). Each entry is
priced as ``plait train`` runs it (``--compile`` or ``--no-compile``, ``priced_params``): a layout's
compiled twin is priced with inductor's fused element-wise regions (``plait.plan.compiled``), its
eager twin with ``elementwise_passes``, and each gets its own rank.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass, field, replace
from pathlib import Path

from plait.errors import PlaitError
from plait.plan.params import DEFAULT_PARAMS, CostParams
from plait.plan.plan import Plan, evaluate
from plait.spec.hardware import ClusterSpec
from plait.spec.layout import JobSpec, Layout
from plait.spec.model import ModelSpec
from plait.spec.validate import errors_of, validate

SHA256_DIGITS = 16  # of a calibration file's hash, recorded with the sweep
NOT_PLANNER_RULES = ("whole-nodes",)  # plait train runs a part of a node; the planner's node rule does not apply


@dataclass(frozen=True)
class SweepSpec:
    """Settings shared by every layout of a sweep (one node). Seconds for times."""

    model: ModelSpec
    model_arg: str  # what plait train gets as --model (preset name or file)
    cluster: ClusterSpec  # what the planner ranks and predicts for: n_gpus = processes of the sweep
    global_batch: int
    seq_len: int
    steps: int
    nproc_per_node: int
    device: str = "auto"  # auto | cpu | cuda (plait train --device)
    prediction_gpu: str | None = None  # GPU spec whose predictions are recorded (None: not recorded)
    params: CostParams = DEFAULT_PARAMS
    data: str = "synthetic"
    seed: int = 0
    timeout_s: float = 600.0  # per layout, wall clock
    kill_grace_s: float = 45.0  # after SIGTERM on timeout; plait train gives its workers 30 s to stop
    calibration: str = ""  # absolute path of the calibration file the predictions use ("" = defaults)
    calibration_sha256: str = ""  # first 16 hex digits of its sha256 when the sweep started
    allow_oom: bool = False
    compile: bool = False
    warmup_steps: int | None = None  # first steps of a run left out of its step time (None: timing.default_warmup_steps)
    repeats: int = 1  # runs per layout, in round-robin order; the row reports the median of their medians
    min_time_s: float = 0.0  # seconds of post-warm-up steps a run should time (0: --steps as given)
    threads_per_process: int | None = None  # OMP_NUM_THREADS of every CPU run (None: left to plait train)
    cpu_calibration: bool = False  # the calibration is a CPU profile: predictions are for the CPU it describes

    @property
    def job(self) -> JobSpec:
        return JobSpec(global_batch=self.global_batch, seq_len=self.seq_len)

    @property
    def warmup(self) -> int:
        """Warm-up steps left out of every run's step time."""
        from plait.measure.sweep.timing import default_warmup_steps

        return default_warmup_steps(self.steps) if self.warmup_steps is None else self.warmup_steps

    @property
    def records_predictions(self) -> bool:
        """Whether predicted values go into the rows: for a GPU spec, or for the CPU of a CPU profile."""
        return bool(self.prediction_gpu) or self.cpu_calibration


@dataclass(frozen=True)
class SweepCase:
    """One layout to run, or the reason it cannot (then ``layout`` may be None)."""

    text: str  # the layout as the user wrote it (or the canonical string)
    layout: Layout | None = None
    compile: bool = False
    invalid_reason: str = ""
    plan: Plan | None = None  # the planner's prediction for spec.cluster
    planner_rank: int | None = None  # among the fitting (layout, compile) entries
    env: tuple[tuple[str, str], ...] = field(default=())  # extra environment of this run (tests)

    @property
    def label(self) -> str:
        return str(self.layout) if self.layout is not None else self.text

    @property
    def predicted_fits(self) -> bool | None:
        """Whether the planner predicts the layout fits in memory (None: not evaluated)."""
        return None if self.plan is None else self.plan.fits


def calibration_fingerprint(path: str | Path) -> tuple[str, str]:
    """(absolute path, first 16 hex digits of the sha256 of its bytes) of a calibration file."""
    resolved = Path(path).resolve()
    try:
        digest = hashlib.sha256(resolved.read_bytes()).hexdigest()
    except OSError as exc:
        raise PlaitError(f"cannot read the calibration file {path}: {exc}") from None
    return str(resolved), digest[:SHA256_DIGITS]


def parse_grid(text: str, world_size: int) -> list[tuple[str, bool]]:
    """The grid's entries as (layout text, compile) pairs, in product order."""
    axes: list[tuple[str, list[str]]] = []
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        if "=" not in part:
            raise PlaitError(f"--grid item {part!r} is not key=v1,v2 (e.g. \"dp=1,2;tp=1,2;mbs=1,2\")")
        key, values = (s.strip() for s in part.split("=", 1))
        key = key.lower().replace("-", "_")
        options = [v.strip() for v in values.split(",") if v.strip()]
        if not options:
            raise PlaitError(f"--grid key {key!r} has no values")
        if key in (k for k, _ in axes):
            raise PlaitError(f"--grid key {key!r} given twice")
        if key == "compile":
            for value in options:
                _as_bool(value)
        else:
            Layout.parse(f"{key}={options[0]}")  # an unknown key is bad input, not an invalid entry
        axes.append((key, options))
    if not axes:
        raise PlaitError("--grid is empty; e.g. --grid \"dp=1,2;tp=1,2;mbs=1,2\"")
    entries = []
    for combo in itertools.product(*(values for _, values in axes)):
        items = dict(zip((k for k, _ in axes), combo))
        compiled = _as_bool(items.pop("compile", "0"))
        if "dp" not in items and items:
            items["dp"] = _dp_for(items, world_size)
        entries.append((",".join(f"{k}={v}" for k, v in items.items()) or f"dp={world_size}", compiled))
    return entries


def _as_bool(value: str) -> bool:
    lowered = value.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise PlaitError(f"--grid compile value {value!r} is not 0 or 1")


def _dp_for(items: dict, world_size: int) -> str:
    """dp that fills the processes, or the grid's text unchanged when it cannot (then invalid)."""
    try:
        rest = Layout.parse(",".join(f"{k}={v}" for k, v in items.items()))
    except PlaitError:
        return "1"
    other = rest.tp * rest.pp * rest.cp
    return str(world_size // other) if world_size % other == 0 else "1"


def make_cases(spec: SweepSpec, entries: list[tuple[str, bool]]) -> list[SweepCase]:
    """Check each entry against the process count and the planner's rules, predict it, and rank
    the ones predicted to fit by predicted step time (``rank_cases``; 1 = fastest)."""
    cases = []
    world = spec.cluster.n_gpus
    for text, compiled in entries:
        compiled = compiled or spec.compile
        try:
            layout = Layout.parse(text)
        except PlaitError as exc:
            cases.append(SweepCase(text, None, compiled, str(exc)))
            continue
        if layout.world_size != world:
            cases.append(SweepCase(text, layout, compiled, f"needs dp·tp·pp·cp = {layout.world_size} processes, "
                                                           f"the sweep has {world} (--nproc-per-node)"))
            continue
        broken = [v for v in errors_of(validate(spec.model, spec.cluster, spec.job, layout))
                  if v.rule not in NOT_PLANNER_RULES]
        if broken:
            cases.append(SweepCase(text, layout, compiled, "; ".join(v.message for v in broken)))
            continue
        plan = evaluate(spec.model, spec.cluster, spec.job, layout, priced_params(spec, compiled), compile=compiled)
        cases.append(SweepCase(text, layout, compiled, plan=plan))
    return rank_cases(cases)


def priced_params(spec: SweepSpec, compiled: bool) -> CostParams:
    """The sweep's cost parameters for an entry run with ``--compile`` (``compiled``) or ``--no-compile``:
    ``compiled_blocks`` 1 or 0 (``plait.plan.compiled.with_compile``)."""
    from plait.plan.compiled import with_compile

    return with_compile(spec.params, None, compiled, "cuda")  # plait train with --compile or --no-compile


def rank_cases(cases: list[SweepCase]) -> list[SweepCase]:
    """The cases with ``planner_rank`` set: 1, 2, ... in the planner's order over the distinct
    (layout, compile) entries it predicts fit (by predicted step time, then ``rank_with_headroom``'s
    preference for memory headroom, as ``plait plan`` ranks them); a compiled twin is priced apart
    from its eager one and ranked on its own; non-fitting and invalid cases get None."""
    from plait.plan.search import rank_with_headroom

    fitting = {}
    for case in cases:
        if case.plan is not None and case.plan.fits:
            fitting.setdefault((str(case.layout), case.compile), case.plan)
    key_of = {id(plan): key for key, plan in fitting.items()}
    order = rank_with_headroom(sorted(fitting.values(), key=lambda plan: plan.step.step_time))
    rank_of = {key_of[id(plan)]: rank for rank, plan in enumerate(order, 1)}
    return [replace(c, planner_rank=rank_of.get((str(c.layout), c.compile)) if c.predicted_fits else None)
            for c in cases]


def top_k_entries(spec: SweepSpec, k: int) -> tuple[list[tuple[str, bool]], int]:
    """The planner's K fastest fitting layouts that plait train can run, and how many faster ones
    it skipped because the runtime does not run them yet (offload, cp, ckpt=balanced, ...)."""
    from plait.plan.search import SearchConstraints, require_plans, search

    if k < 1:
        raise PlaitError("--top must be at least 1")
    constraints = SearchConstraints(max_pp=spec.nproc_per_node)
    result = search(spec.model, spec.cluster, spec.job, constraints, priced_params(spec, spec.compile), runnable=True,
                    compile=spec.compile, keep=k)
    fitting = result.all_fitting()
    if fitting and not result.plans:
        raise PlaitError(f"none of the planner's {len(fitting)} fitting layouts is one plait train runs yet (the "
                         f"best: {fitting[0].runtime_violations[0].message}); give layouts with --grid or --layout")
    plans = require_plans(spec.model, spec.cluster, spec.job, result, constraints)
    return [(str(plan.layout), spec.compile) for plan in plans[:k]], result.unrunnable_ahead(k)
