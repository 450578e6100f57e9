"""``plait calibrate fit``: fit a few cost-model parameters to measured or published runs.

The runs are rows of the published-runs CSV schema (``shared/data/README.md``): each row gives a
model, a layout and a reported throughput; or rows of a ``plait sweep`` CSV (measured step time per
layout, ``plait.measure.calibrate.from_sweep``). For a candidate set of parameters every usable row is
predicted (``plait.measure.validate.runs.predict_row``) and compared on one basis: the relative MFU
error |predicted MFU / measured MFU - 1|, or the relative step-time error
|predicted step time / measured step time - 1| (same tokens per step, so the step-time ratio is
the inverse of the MFU ratio: |measured MFU / predicted MFU - 1|). The objective is the median
(default) or mean of these errors over the rows. The fit computes these itself from the
predicted and measured values (it never reads a CSV's error columns).

The search is a bounded coordinate search written with the standard library only: each round
tries ``points`` evenly spaced values of one parameter (in log space for overheads and sizes)
inside a window around the best point, keeps the best, and halves the windows. It starts at the
defaults and only accepts improvements, so the in-sample error never exceeds the defaults'.

Over-fitting shows in the held-out error: for every source (paper, code base; in a sweep, the
model) the parameters are fitted again without its rows, and its rows are predicted with that
fit (leave-one-source-out). With a single source (a one-model sweep, the usual case) that is
impossible, so the runs are held out by layout instead: leave-one-layout-out, or ``MAX_FOLDS``-fold
by layout when there are more layouts; the result names the scheme and warns. No torch.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path

from plait.errors import PlaitError
from plait.measure.calibrate.cases import FitCase
from plait.measure.calibrate.families import families_from_sources, leave_one_family_out
from plait.measure.validate.compiled import COMPILE_PARAMS
from plait.measure.validate.moe import RECIPE_PARAMS
from plait.measure.validate.runs import predict_row, read_runs
from plait.measure.validate.specs import row_specs
from plait.plan.params import DEFAULT_PARAMS, CostParams


@dataclass(frozen=True)
class Bound:
    """Search range of one parameter; ``log``: search its logarithm (overheads, sizes)."""

    low: float
    high: float
    log: bool = False


# The parameters that change a predicted step time, with physically sensible ranges.
FITTABLE: dict[str, Bound] = {
    "elementwise_passes": Bound(10.0, 120.0),
    "tp_comm_overlap": Bound(0.0, 1.0),
    "dp_overlap": Bound(0.0, 1.0),
    "overlap_slowdown": Bound(0.0, 0.5),
    "microbatch_overhead_s": Bound(1e-4, 2e-2, log=True),
    "step_overhead_s": Bound(1e-3, 1.0, log=True),
    "gemm_half_flops": Bound(1e7, 1e11, log=True),
    "flash_backward_factor": Bound(1.5, 4.0),
    "optimizer_bytes_per_param": Bound(8.0, 64.0),
    "fp8_gemm_efficiency": Bound(0.2, 0.9),
    "offload_overlap": Bound(0.0, 1.0),
    "cp_comm_overlap": Bound(0.0, 1.0),
    "layer_overhead_s": Bound(1e-6, 0.1, log=True),
    "tp_layer_overhead_s": Bound(1e-6, 0.2, log=True),
    "cp_layer_overhead_s": Bound(1e-6, 0.2, log=True),
    "fsdp_layer_overhead_s": Bound(1e-6, 0.2, log=True),
    "sac_layer_overhead_s": Bound(1e-6, 0.2, log=True),
    "tp_ends_overhead_s": Bound(1e-6, 0.2, log=True),
    "cp_ends_overhead_s": Bound(1e-6, 0.2, log=True),
    "fsdp_ends_overhead_s": Bound(1e-6, 0.2, log=True),
}
DEFAULT_FIT = ("elementwise_passes", "tp_comm_overlap", "dp_overlap", "microbatch_overhead_s")
METRICS = ("mfu", "step_time")
OBJECTIVES = ("median", "mean")


def parse_param_names(text: str | None) -> tuple[str, ...]:
    """``"a,b,c"`` -> names, each checked against ``FITTABLE`` (None: the default set)."""
    if text is None:
        return DEFAULT_FIT
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not names:
        raise PlaitError(f"--params {text!r} names no parameter; fittable: {', '.join(FITTABLE)}")
    unknown = [n for n in names if n not in FITTABLE]
    if unknown:
        known = {f for f in CostParams.__dataclass_fields__}
        why = [f"{n!r} (a cost parameter that does not change step time)" if n in known else f"{n!r} (unknown)"
               for n in unknown]
        raise PlaitError(f"cannot fit {', '.join(why)}; fittable parameters: {', '.join(FITTABLE)}")
    return names


def relative_error(predicted_mfu: float, measured_mfu: float, metric: str) -> float:
    """The absolute relative error of the prediction, a fraction: |predicted / measured - 1| of MFU
    (``metric="mfu"``) or of step time (``"step_time"``; step time is tokens / (MFU · peak ·
    FLOPs per token), so predicted / measured step time = measured MFU / predicted MFU)."""
    if metric == "mfu":
        return abs(predicted_mfu / measured_mfu - 1.0)
    predicted_over_measured_step_time = measured_mfu / predicted_mfu
    return abs(predicted_over_measured_step_time - 1.0)


def _aggregate(errors: list[float], objective: str) -> float:
    if not errors:
        return math.nan
    return statistics.median(errors) if objective == "median" else statistics.fmean(errors)


@dataclass(frozen=True)
class FitProblem:
    """Usable runs and how to score a parameter set on them."""

    cases: tuple[FitCase, ...]
    metric: str = "mfu"
    objective: str = "median"

    def errors(self, params: CostParams) -> list[float]:
        return [relative_error(c.predicted_mfu(params), c.reported_mfu, self.metric) for c in self.cases]

    def score(self, params: CostParams) -> float:
        return _aggregate(self.errors(params), self.objective)

    def subset(self, keep) -> FitProblem:
        return replace(self, cases=tuple(c for c in self.cases if keep(c)))


def usable_cases(path) -> tuple[list[FitCase], dict[str, int]]:
    """(runs that can be predicted and compared, count of the others by reason), from one published-runs
    CSV or a list of them.

    The reported side and the specs do not depend on the cost parameters: they are built once
    (``plait.measure.validate.runs``), and each trial only re-runs ``estimate_step``. The numbers of the
    row's software stack (``plait.spec.stack``) and of its recipe (``RECIPE_PARAMS``: the CUDA graphs
    ``plait.measure.validate.moe`` reads; ``COMPILE_PARAMS``: torch.compile, ``plait.measure.validate.compiled``)
    are the case's ``software``: fixed, never fitted.
    """
    paths = [path] if isinstance(path, (str, Path)) else list(path)
    cases, skipped = [], {}
    for row in (r for p in paths for r in read_runs(p)):
        result = predict_row(row, DEFAULT_PARAMS)
        if not result.complete:
            reason = result.status.split(":")[0]
        elif not result.reported_mfu:
            reason = "no reported throughput"
        else:
            specs = row_specs(row, [])
            software = dict(specs.stack.param_values()) if specs.stack is not None else {}
            software.update({name: getattr(specs.params, name) for name in RECIPE_PARAMS + COMPILE_PARAMS
                             if getattr(specs.params, name) != getattr(DEFAULT_PARAMS, name)})
            software = tuple(software.items())
            cases.append(FitCase(result.id, result.source, (specs.model, specs.cluster, specs.job, specs.layout),
                                 result.reported_mfu, specs.runtime, software))
            continue
        skipped[reason] = skipped.get(reason, 0) + 1
    if not cases:
        reasons = ", ".join(f"{n} {why}" for why, n in sorted(skipped.items())) or "none"
        where = ", ".join(str(p) for p in paths)
        raise PlaitError(f"{where}: no usable rows ({reasons}); a row needs seq_len, mbs, recompute, the "
                         "tp/pp/dp split, a GPU with a spec and a reported throughput")
    return cases, skipped


def _to_search(value: float, bound: Bound) -> float:
    return math.log(max(value, bound.low)) if bound.log else value


def _from_search(value: float, bound: Bound) -> float:
    return math.exp(value) if bound.log else value


def minimize(problem: FitProblem, names: tuple[str, ...], start: CostParams = DEFAULT_PARAMS,
             rounds: int = 6, points: int = 9, polish: int = 20) -> tuple[CostParams, float, int]:
    """Bounded coordinate search from ``start``, then a Nelder-Mead polish of ``polish`` iterations
    per parameter (it moves correlated parameters together); returns (params, score, evaluations)."""
    bounds = [FITTABLE[n] for n in names]
    lows = [_to_search(b.low, b) for b in bounds]
    highs = [_to_search(b.high, b) for b in bounds]
    x = [min(max(_to_search(getattr(start, n), b), lo), hi) for n, b, lo, hi in zip(names, bounds, lows, highs)]
    width = [hi - lo for lo, hi in zip(lows, highs)]

    def params_at(point: list[float]) -> CostParams:
        return replace(start, **{n: _from_search(v, b) for n, v, b in zip(names, point, bounds)})

    best = problem.score(params_at(x))
    evaluations = 1
    for _ in range(rounds):
        for i in range(len(names)):
            lo, hi = max(lows[i], x[i] - width[i] / 2), min(highs[i], x[i] + width[i] / 2)
            for k in range(points):
                trial = list(x)
                trial[i] = lo + (hi - lo) * k / (points - 1)
                score = problem.score(params_at(trial))
                evaluations += 1
                if score < best - 1e-12:
                    best, x = score, trial
        width = [w / 2 for w in width]

    def clipped_score(point: list[float]) -> float:
        return problem.score(params_at([min(max(v, lo), hi) for v, lo, hi in zip(point, lows, highs)]))

    x, best, n = nelder_mead(clipped_score, x, best, [4 * w for w in width], iterations=polish * len(names))
    x = [min(max(v, lo), hi) for v, lo, hi in zip(x, lows, highs)]
    return params_at(x), best, evaluations + n


def nelder_mead(f, x0: list[float], f0: float, steps: list[float], iterations: int) -> tuple[list[float], float, int]:
    """Plain Nelder-Mead (reflect 1, expand 2, contract 1/2, shrink 1/2) from x0 with the given steps.

    Returns (best point, its value, evaluations); never worse than (x0, f0).
    """
    simplex = [(f0, list(x0))]
    for i, step in enumerate(steps):
        point = list(x0)
        point[i] += step if step else 1e-3
        simplex.append((f(point), point))
    evaluations = len(steps)
    for _ in range(iterations):
        simplex.sort(key=lambda item: item[0])
        (f_best, _), (f_second, _), (f_worst, worst) = simplex[0], simplex[-2], simplex[-1]
        centroid = [sum(p[i] for _, p in simplex[:-1]) / (len(simplex) - 1) for i in range(len(x0))]

        def toward(scale: float, centroid=centroid, worst=worst) -> list[float]:
            return [c + scale * (w - c) for c, w in zip(centroid, worst)]

        reflected = toward(-1.0)
        f_reflected = f(reflected)
        evaluations += 1
        if f_reflected < f_best:
            expanded = toward(-2.0)
            f_expanded = f(expanded)
            evaluations += 1
            simplex[-1] = (f_expanded, expanded) if f_expanded < f_reflected else (f_reflected, reflected)
        elif f_reflected < f_second:
            simplex[-1] = (f_reflected, reflected)
        else:
            contracted = toward(0.5)
            f_contracted = f(contracted)
            evaluations += 1
            if f_contracted < f_worst:
                simplex[-1] = (f_contracted, contracted)
            else:
                best_point = simplex[0][1]
                simplex = [simplex[0]] + [
                    (f(q), q) for q in ([b + 0.5 * (v - b) for b, v in zip(best_point, p)] for _, p in simplex[1:])]
                evaluations += len(simplex) - 1
    simplex.sort(key=lambda item: item[0])
    if simplex[0][0] < f0 - 1e-12:
        return simplex[0][1], simplex[0][0], evaluations
    return list(x0), f0, evaluations


@dataclass
class SourceErrors:
    """Errors of one source's rows, as fractions (NaN where not computed).

    ``leave_out``: the held-out error of its rows (each predicted by a fit without it: without the
    source, or, with one source, without the row's layout group); ``leave_out_params``: the fit
    without the source (leave-one-source-out only)."""

    source: str
    rows: int
    default: float
    in_sample: float
    leave_out: float = math.nan
    leave_out_params: dict = field(default_factory=dict)


MAX_FOLDS = 5  # held out by layout: leave-one-layout-out up to this many layouts, else this many folds
SOURCE_HOLDOUT = "leave-one-source-out"


@dataclass
class FitResult:
    names: tuple[str, ...]
    params: CostParams
    metric: str
    objective: str
    default_error: float
    in_sample_error: float
    leave_out_error: float  # pooled over every held-out row
    per_source: list[SourceErrors]
    rows_used: int
    rows_skipped: dict[str, int]
    evaluations: int
    start: CostParams = DEFAULT_PARAMS  # where the search started (the defaults, or a calibration's)
    kind: str = "published"  # published | sweep
    holdout: str = SOURCE_HOLDOUT  # leave-one-source-out | leave-one-layout-out | N-fold by layout | none
    folds: list[dict] = field(default_factory=list)  # held-out groups other than sources: ids, params, error
    warnings: list[str] = field(default_factory=list)
    families: list = field(default_factory=list)  # families.FamilyErrors: leave-one-family-out, per family

    def fitted(self) -> dict[str, dict]:
        return {n: {"default": getattr(self.start, n), "value": getattr(self.params, n),
                    "low": FITTABLE[n].low, "high": FITTABLE[n].high} for n in self.names}


def holdout_groups(cases: list[FitCase], unit: str = "layout") -> tuple[str, list[list[int]]]:
    """(scheme, groups of case indices to hold out together).

    By source when there are at least two; else by ``unit`` (each case is one layout or run):
    one group each up to ``MAX_FOLDS``, else ``MAX_FOLDS`` round-robin folds; none for one case.
    """
    sources = list(dict.fromkeys(c.source for c in cases))
    if len(sources) >= 2:
        return SOURCE_HOLDOUT, [[i for i, c in enumerate(cases) if c.source == s] for s in sources]
    k = min(MAX_FOLDS, len(cases))
    if k < 2:
        return "none", []
    scheme = f"leave-one-{unit}-out" if k == len(cases) else f"{k}-fold by {unit}"
    return scheme, [list(range(len(cases)))[i::k] for i in range(k)]


def fit_runs(path: str | Path, names: tuple[str, ...] = DEFAULT_FIT, metric: str = "mfu",
             objective: str = "median", rounds: int = 6, points: int = 9, leave_out: bool = True,
             progress=None, polish: int = 20, calibration=None) -> FitResult:
    """Fit ``names`` to the runs of ``path`` (published-runs or ``plait sweep`` CSV).

    ``calibration`` (a ``plait.plan.calibration.Calibration``): the search starts at its parameters,
    and sweep rows are predicted on its GPU and links (published rows keep their own GPU presets,
    and a CPU profile's CPU-measured params are not used for them). ``progress(text)`` is told
    about each fit. The held-out error is by source, or by layout when there is one source
    (``holdout_groups``; ``FitResult.warnings`` says so).
    """
    if metric not in METRICS:
        raise PlaitError(f"unknown metric {metric!r}; use one of {', '.join(METRICS)}")
    if objective not in OBJECTIVES:
        raise PlaitError(f"unknown objective {objective!r}; use one of {', '.join(OBJECTIVES)}")
    if not (1 <= rounds <= 1000 and 2 <= points <= 1000):  # more only runs (nearly) forever
        raise PlaitError(f"--rounds must be 1 to 1000 and --points 2 to 1000 (got {rounds} and {points})")
    from plait.measure.calibrate.from_sweep import is_sweep_csv, sweep_cases

    kind = "sweep" if is_sweep_csv(path) else "published"
    warnings: list[str] = []
    start = DEFAULT_PARAMS
    if kind == "sweep":
        cases, skipped, warnings = sweep_cases(path, calibration)
        start = calibration.params if calibration is not None else DEFAULT_PARAMS
    else:
        cases, skipped = usable_cases(path)
        if calibration is not None:
            start, warnings = calibration.params_for_runs_elsewhere()
    problem = FitProblem(tuple(cases), metric, objective)
    notify = progress or (lambda text: None)
    notify(f"fitting {', '.join(names)} on {len(cases)} rows")
    params, in_sample, evaluations = minimize(problem, names, start, rounds=rounds, points=points, polish=polish)
    scheme, groups = holdout_groups(cases, "layout" if kind == "sweep" else "run")
    if not leave_out:
        scheme, groups = "none", []
    elif scheme == "none":
        warnings.append(f"the runs have one source ({cases[0].source}) and one row: nothing can be held out, "
                        "so over-fitting cannot be seen")
    elif scheme != SOURCE_HOLDOUT:
        unit = "layout" if kind == "sweep" else "run"
        warnings.append(f"the runs have one source ({cases[0].source}): leave-one-source-out is impossible, so "
                        f"rows are held out by {unit} instead ({scheme}); over-fitting to that source (model, "
                        "code base) cannot be seen")
    held: dict[int, float] = {}
    folds, refits = [], {}
    for group in groups:
        members = set(group)
        rest = FitProblem(tuple(c for i, c in enumerate(cases) if i not in members), metric, objective)
        label = cases[group[0]].source if scheme == SOURCE_HOLDOUT else f"{len(group)} row(s)"
        notify(f"refitting without {label}")
        refit, _, n = minimize(rest, names, start, rounds=rounds, points=points, polish=polish)
        evaluations += n
        for i in group:
            held[i] = relative_error(cases[i].predicted_mfu(refit), cases[i].reported_mfu, metric)
        fitted = {name: getattr(refit, name) for name in names}
        if scheme == SOURCE_HOLDOUT:
            refits[cases[group[0]].source] = fitted
        else:
            folds.append({"held_out": [cases[i].id for i in group], "params": fitted,
                          "error": _aggregate([held[i] for i in group], objective)})
    per_source = []
    for source in dict.fromkeys(c.source for c in cases):
        own = problem.subset(lambda c, s=source: c.source == s)
        errors = SourceErrors(source, len(own.cases), own.score(start), own.score(params))
        own_held = [held[i] for i, c in enumerate(cases) if c.source == source and i in held]
        if own_held:
            errors.leave_out = _aggregate(own_held, objective)
        errors.leave_out_params = refits.get(source, {})
        per_source.append(errors)
    families = []
    if leave_out and kind == "published" and scheme == SOURCE_HOLDOUT:
        families = families_from_sources(per_source)  # a published row's family is its source: held out above
    elif leave_out:
        families, n = leave_one_family_out(
            problem, names, start, params, lambda sub: minimize(sub, names, start, rounds, points, polish)[::2],  # (params, evaluations)
            lambda c, p: relative_error(c.predicted_mfu(p), c.reported_mfu, metric),
            lambda errors: _aggregate(errors, objective), notify)
        evaluations += n
    return FitResult(names=names, params=params, metric=metric, objective=objective, families=families,
                     default_error=problem.score(start), in_sample_error=in_sample,
                     leave_out_error=_aggregate(list(held.values()), objective), per_source=per_source,
                     rows_used=len(cases), rows_skipped=skipped, evaluations=evaluations, start=start, kind=kind,
                     holdout=scheme, folds=folds, warnings=warnings)
