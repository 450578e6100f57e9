"""validate(model, cluster, job, layout): every rule a layout breaks, each with its numbers.

Errors make a layout impossible; warnings flag a layout that runs but is likely slow.
Each message names the rule and, where it can, what would work instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from plait.errors import PlaitError
from plait.spec.hardware import ClusterSpec
from plait.spec.layout import FP8_PRECISIONS, JobSpec, Layout, placement
from plait.spec.model import ModelSpec
from plait.spec.moe.layout import moe_overlap_noops, moe_rule_errors
from plait.spec.units import divisors


@dataclass(frozen=True)
class Violation:
    rule: str  # short rule id, e.g. "tp-divides-kv-heads"
    message: str
    severity: str = "error"  # "error" or "warning"

    def __str__(self) -> str:
        return f"{self.severity}: {self.message}"


def _fmt(values: list[int], most: int = 8) -> str:
    return ", ".join(str(v) for v in values[:most]) + (", ..." if len(values) > most else "")


def stage_layers(model: ModelSpec, layout: Layout) -> int:
    """Transformer layers in the most loaded virtual stage (ceiling for split=uneven; for split=ends
    a middle stage's share of n_layers + 2)."""
    chunks = layout.pp * layout.vpp
    if layout.split == "ends":
        return -(-(model.n_layers + 2) // chunks)
    return -(-model.n_layers // chunks)


def rank_layers(model: ModelSpec, layout: Layout, rank: int) -> int:
    """Transformer layers pipeline rank ``rank`` holds over its ``vpp`` virtual stages (rank r runs
    stages r, r + pp, r + 2·pp, ...)."""
    counts = stage_layer_counts(model, layout)
    return sum(counts[v * layout.pp + rank] for v in range(layout.vpp))


def stage_layer_counts(model: ModelSpec, layout: Layout) -> list[int]:
    """Transformer layers of each of the pp·vpp virtual stages, in pipeline order.

    ``split=even`` gives every stage n_layers / (pp·vpp). ``split=uneven`` gives every stage the
    floor and hands the remaining layers one each to the middle stages first, then to the first
    stage (which also holds the token embedding), and the last stage (which also runs the LM
    head, the most expensive non-layer work) last. The most loaded stage has ``stage_layers``. ``split=ends`` (Megatron's accounting of the
    embedding and the loss as one layer each) gives every stage (n_layers + 2) / (pp·vpp) places,
    the first stage's first taken by the embedding and the last stage's last by the loss.
    """
    chunks = layout.pp * layout.vpp
    if layout.split == "ends":
        counts = [(model.n_layers + 2) // chunks] * chunks
        counts[0] -= 1
        counts[-1] -= 1
        return counts
    base, extra = divmod(model.n_layers, chunks)
    counts = [base] * chunks
    order = list(range(1, chunks - 1)) + [0, chunks - 1] if chunks > 1 else [0]
    for index in order[:extra]:
        counts[index] += 1
    return counts


def ulysses_splits_heads(model: ModelSpec, lay: Layout) -> bool:
    """Whether ``cp_impl=ulysses`` can run ``lay``: cp divides the rank's n_kv_heads / tp K/V heads
    (each cp rank gets whole K/V heads with the query heads sharing them)."""
    return (model.n_kv_heads // lay.tp) % lay.cp == 0


def validate(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, layout: Layout) -> list[Violation]:
    """Return every violated rule (errors first, then warnings); an empty list means valid."""
    out: list[Violation] = []

    def error(rule: str, message: str) -> None:
        out.append(Violation(rule, message, "error"))

    def warn(rule: str, message: str) -> None:
        out.append(Violation(rule, message, "warning"))

    lay, n = layout, cluster.n_gpus
    # ---- world size and nodes
    if lay.world_size != n:
        error("world-size", f"dp·tp·pp·cp = {lay.dp}·{lay.tp}·{lay.pp}·{lay.cp} = {lay.world_size} "
              f"but the cluster has {n} GPUs")
    if n > cluster.gpus_per_node and n % cluster.gpus_per_node:
        error("whole-nodes", f"{n} GPUs is not a whole number of {cluster.gpus_per_node}-GPU nodes")
    # ---- tensor parallel
    if model.n_heads % lay.tp:
        error("tp-divides-heads", f"tp={lay.tp} does not divide n_heads={model.n_heads}; "
              f"tp that would: {_fmt(divisors(model.n_heads))}")
    if model.n_kv_heads % lay.tp:
        error("tp-divides-kv-heads", f"tp={lay.tp} does not divide n_kv_heads={model.n_kv_heads}; "
              f"tp that would: {_fmt(divisors(model.n_kv_heads))}")
    if model.ffn_hidden % lay.tp:
        error("tp-divides-ffn", f"tp={lay.tp} does not divide ffn_hidden={model.ffn_hidden}")
    # ---- pipeline
    chunks = lay.pp * lay.vpp
    if lay.split == "ends":
        if (model.n_layers + 2) % chunks or chunks < 2:
            error("pp-divides-layers", f"split=ends needs pp·vpp ({chunks}) >= 2 to divide n_layers + 2 = "
                  f"{model.n_layers + 2} (the embedding and the loss take one layer's place each); "
                  f"pp·vpp that would: {_fmt([d for d in divisors(model.n_layers + 2) if d >= 2])}")
    elif chunks > model.n_layers:
        error("pp-layers", f"pp·vpp = {chunks} stages but the model has only n_layers={model.n_layers}")
    elif model.n_layers % chunks and lay.split == "even":
        what = f"pp={lay.pp}" if lay.vpp == 1 else f"pp·vpp = {lay.pp}·{lay.vpp} = {chunks}"
        error("pp-divides-layers", f"{what} does not divide n_layers={model.n_layers}; "
              f"pp that would: {_fmt([d for d in divisors(model.n_layers) if d <= n])} "
              "(or split=uneven)")
    if lay.vpp > 1 and lay.schedule != "interleaved-1f1b":
        error("vpp-schedule", f"vpp={lay.vpp} needs schedule=interleaved-1f1b, not {lay.schedule}")
    if lay.schedule == "interleaved-1f1b" and lay.vpp == 1 and lay.pp > 1:
        error("interleaved-vpp", "schedule=interleaved-1f1b needs vpp >= 2 virtual stages per GPU")
    # ---- batch
    per_step = lay.dp * lay.mbs
    if job.global_batch % per_step:
        error("batch-divides", f"global batch {job.global_batch} is not a multiple of dp·mbs = "
              f"{lay.dp}·{lay.mbs} = {per_step}; mbs that would: "
              f"{_fmt([m for m in divisors(job.global_batch) if job.global_batch % (lay.dp * m) == 0]) or 'none (change dp)'}")
    else:
        micro = job.global_batch // per_step
        if lay.schedule == "interleaved-1f1b" and lay.pp > 1 and micro % lay.pp:
            error("interleaved-microbatches", f"interleaved-1f1b needs the {micro} micro-batches per step "
                  f"to be a multiple of pp={lay.pp}")
        if lay.pp > 1 and micro < lay.pp and lay.schedule != "gpipe":
            error("pp-microbatches", f"schedule {lay.schedule} needs at least pp={lay.pp} micro-batches per step, "
                  f"got {micro} (global batch {job.global_batch} / (dp·mbs = {lay.dp}·{lay.mbs})); "
                  "lower mbs or dp, or use schedule=gpipe")
        elif lay.pp > 1 and micro < lay.pp:
            warn("pp-microbatches", f"only {micro} micro-batches for pp={lay.pp} stages: "
                 f"the pipeline bubble is over {100 * (lay.pp - 1) / (micro + lay.pp - 1):.0f}% of the step")
    # ---- context parallel
    if lay.cp > 1 and job.seq_len % (2 * lay.cp):
        error("cp-divides-seq", f"seq_len={job.seq_len} is not a multiple of 2·cp = {2 * lay.cp} "
              "(load-balanced causal context parallel splits each sequence into 2·cp chunks)")
    if lay.cp > 1 and lay.cp_impl == "ulysses" and not ulysses_splits_heads(model, lay):
        fits = [d for d in divisors(max(1, model.n_kv_heads // lay.tp)) if d > 1]
        error("ulysses-divides-heads", f"cp_impl=ulysses splits heads over cp: cp={lay.cp} does not divide the "
              f"n_kv_heads/tp = {model.n_kv_heads}/{lay.tp} K/V heads of a rank; cp that would: "
              f"{_fmt(fits) or 'none'} (or cp_impl=ring)")
    if model.learned_positions and job.seq_len > model.max_seq_len:  # RoPE models: past_positions_warning
        error("seq-positions", positions_limit_message(model, job.seq_len))
    # ---- ZeRO / hybrid sharding
    if lay.dp % lay.hsdp:
        error("hsdp-divides-dp", f"hsdp={lay.hsdp} replicas do not divide dp={lay.dp}")
    if lay.hsdp > 1 and lay.zero == 0:
        error("hsdp-needs-zero", "hsdp>1 (hybrid sharding) needs zero >= 1")
    # ---- experts (plait.spec.moe.layout)
    for rule, message in moe_rule_errors(model, lay):
        error(rule, message)
    # ---- checkpointing, offload, precision
    per_stage = -(-model.n_layers // lay.pp)
    if lay.ckpt_layers > per_stage:
        error("ckpt-layers", f"ckpt on {lay.ckpt_layers} layers but a pipeline stage has only {per_stage}")
    if lay.ckpt_layers and lay.ckpt == "none":
        error("ckpt-layers-policy", "ckpt_layers is set but ckpt=none: give a policy, e.g. ckpt=full:4")
    if lay.precision in FP8_PRECISIONS and cluster.gpu.fp8_flops <= 0:
        error("fp8-hardware", f"precision={lay.precision} but {cluster.gpu.name} has no fp8 tensor cores")
    elif lay.precision == "nvfp4" and cluster.gpu.fp4_flops <= 0:
        error("fp8-hardware", f"precision=nvfp4 but {cluster.gpu.name} has no fp4 tensor cores (B200, GB200, GB300 do); "
              "use precision=fp8")
    # ---- placement warnings
    groups = placement(lay, cluster.gpus_per_node)
    if groups["tp"].spans_nodes:
        warn("tp-inside-node", f"tp={lay.tp} spans {groups['tp'].nodes} nodes of {cluster.gpus_per_node}: "
             "tensor parallel over the inter-node network")
    if groups["cp"].spans_nodes and lay.cp > 1:
        warn("cp-inside-node", f"cp={lay.cp} spans {groups['cp'].nodes} nodes: context-parallel "
             "exchange over the inter-node network")
    if lay.zero and lay.dp == 1:
        warn("zero-without-dp", f"zero={lay.zero} with dp=1 shards nothing")
    for rule, message in moe_overlap_noops(model, lay):
        warn(rule, message)
    return sorted(out, key=lambda v: v.severity != "error")


def positions_limit_message(model: ModelSpec, seq_len: int) -> str:
    """Why a model with learned positions (GPT-2 style) takes no sequence past its table."""
    return (f"seq_len={seq_len} exceeds the {model.max_seq_len} learned positions of {model.name}: learned "
            f"absolute position embeddings have one row per position and none past {model.max_seq_len} "
            "(use --seq-len <= that, or a RoPE model, which runs at any length)")


def past_positions_warning(model: ModelSpec, seq_len: int) -> str | None:
    """One line when ``seq_len`` passes a RoPE model's ``max_position_embeddings`` (``max_seq_len``),
    naming the RoPE scaling in force; None otherwise (and for learned positions, which refuse it:
    ``positions_limit_message``). ``plait plan`` and ``plait train`` print it once."""
    if model.learned_positions or seq_len <= model.max_seq_len:
        return None
    return (f"seq_len={seq_len} passes {model.name}'s max_position_embeddings={model.max_seq_len}: RoPE runs at any "
            f"length, here with {rope_description(model)}; positions past {model.max_seq_len} are new to the model")


def rope_description(model: ModelSpec) -> str:
    """The RoPE scaling in force, e.g. ``rope_scaling yarn (factor=4.0, original_max_position_embeddings=32768;
    rope_theta=1e+06)`` or ``no rope_scaling (plain RoPE, rope_theta=500000)``."""
    options = dict(model.rope_scaling)
    kind = options.pop("rope_type", "default")
    settings = [f"{k}={v}" for k, v in sorted(options.items()) if k not in ("short_factor", "long_factor")]
    if "short_factor" in options:
        settings.append(f"short and long factors for {len(options['short_factor'])} pairs")
    theta = f"rope_theta={model.rope_theta:g}"
    if kind == "default" and not settings:
        return f"no rope_scaling (plain RoPE, {theta})"
    return f"rope_scaling {kind} ({', '.join(settings)}; {theta})" if settings else f"rope_scaling {kind} ({theta})"


def errors_of(violations: list[Violation]) -> list[Violation]:
    return [v for v in violations if v.severity == "error"]


def check(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, layout: Layout) -> list[Violation]:
    """Raise PlaitError listing every error; return the warnings."""
    violations = validate(model, cluster, job, layout)
    errs = errors_of(violations)
    if errs:
        raise PlaitError(f"layout {layout} is impossible: " + "; ".join(v.message for v in errs))
    return violations
