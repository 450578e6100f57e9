"""RunConfig: everything one training run needs, as plain data (no torch import).

``plait train`` builds it, checks it before launching anything, writes it to a JSON file and
hands that file to every worker. A RunConfig is made of typed sub-configs, each checking its own
fields: ``TrainJob`` (what is trained), ``OptimConfig``, ``CheckpointConfig``, ``RuntimeConfig``
(how and where it runs), ``LogConfig`` (what it reports), ``EvalConfig`` (held-out loss) and the
planner's ``Prediction``. A field that ``plait train`` sets is declared with ``setting`` (its flag,
help, job-file table; ``plait.run.settings``): the command line, job files and docs follow. A saved
plan supplies its model, layout, job and GPU (``plan_parts``); ``plait train --plan`` builds the
RunConfig from them.

JSON: ``to_dict`` writes one object per sub-config; ``from_dict`` also reads the flat form that
plait wrote before the sub-configs (checkpoint manifests and run directories of earlier runs).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from plait.atomic import atomic_write_text
from plait.errors import PlaitError
from plait.run.settings import non_negative_int_problems, number_problems, positive_int_problems, refuse, setting
from plait.spec.capabilities import async_tp_violations, runtime_violations
from plait.spec.layout import JobSpec, Layout
from plait.spec.model import ModelSpec
from plait.spec.serialize import dataclass_from_dict, read_json_file


LR_SCHEDULES = ("cosine", "linear", "wsd", "constant")  # plait.run.optim.lr_at


@dataclass(frozen=True)
class OptimConfig:
    """AdamW with a linear warm-up, then the learning-rate ``schedule`` (``plait.run.optim.lr_at``)
    down to ``floor_lr``."""

    lr: float = setting(3e-4, "--lr", "peak learning rate (default {default})", "optimizer", unset=True, same_run=True)
    min_lr_ratio: float = 0.1  # the decay ends at this fraction of lr (when min_lr is None)
    warmup_steps: int = setting(10, "--warmup-steps", "linear warm-up steps (default: 10%% of steps)", "optimizer",
                                unset=True, same_run=True)  # optimizer steps of linear warm-up from 0 to lr
    weight_decay: float = setting(  # AdamW's decoupled weight decay of the matrices, per unit of lr
        0.1, "--weight-decay", "AdamW weight decay of matrices (default {default})", "optimizer", unset=True,
        same_run=True)
    beta1: float = 0.9  # AdamW decay rate of the first moment, per step
    beta2: float = 0.95  # AdamW decay rate of the second moment, per step
    eps: float = 1e-8  # AdamW denominator term, in gradient units
    grad_clip: float = setting(1.0, "--grad-clip", "max global gradient norm (default {default}; 0: off)",
                               "optimizer", unset=True, same_run=True)
    schedule: str = setting("cosine", "--lr-schedule", "after the warm-up: cosine, linear, wsd (warm-up, stable, "
                            "then a linear decay over the last --decay-fraction of the steps) or constant (default "
                            "{default})", "optimizer", choices=LR_SCHEDULES, unset=True, same_run=True)
    min_lr: float | None = setting(None, "--min-lr", "learning rate the decay ends at (default {min_lr_ratio:g} × "
                                   "--lr)", "optimizer", same_run=True)  # absolute; None: min_lr_ratio·lr
    decay_fraction: float = setting(  # wsd: the last fraction of all steps, decaying linearly to the floor
        0.2, "--decay-fraction", "wsd: fraction of the steps that decay (default {default:g})", "optimizer",
        unset=True, same_run=True)

    def __post_init__(self) -> None:
        problems = number_problems({"lr": (self.lr, 0, True), "weight_decay": (self.weight_decay, 0, True),
                                     "grad_clip": (self.grad_clip, 0, True), "eps": (self.eps, 0, False),
                                     "min_lr_ratio": (self.min_lr_ratio, 0, True)})
        problems += non_negative_int_problems({"warmup_steps": self.warmup_steps})
        problems += [f"{name}={value!r} must be in [0, 1)" for name, value in (("beta1", self.beta1),
                                                                             ("beta2", self.beta2))
                     if not isinstance(value, (int, float)) or not 0 <= value < 1]
        if self.schedule not in LR_SCHEDULES:
            problems.append(f"lr_schedule={self.schedule!r} must be one of {', '.join(LR_SCHEDULES)}")
        if self.min_lr is not None and not 0 <= self.min_lr <= self.lr:
            problems.append(f"min_lr={self.min_lr!r} must be between 0 and lr={self.lr!r}")
        if self.min_lr is not None and self.schedule == "constant":
            problems.append("min_lr has no effect with lr_schedule=constant (nothing decays); drop it")
        if not 0 < self.decay_fraction <= 1:
            problems.append(f"decay_fraction={self.decay_fraction!r} must be in (0, 1]")
        refuse(problems)

    @property
    def floor_lr(self) -> float:
        """The learning rate the decay ends at: ``min_lr``, else ``min_lr_ratio``·``lr``."""
        return self.min_lr if self.min_lr is not None else self.lr * self.min_lr_ratio


@dataclass(frozen=True)
class TrainJob:
    """What is trained: the training trajectory, with the layout that computes it.

    A resumed run keeps the model, ``global_batch``, ``seq_len`` and ``seed`` (and the optimizer
    settings; ``plait.run.checkpoint.select.check_same_run``); ``data`` may name another file of
    the same tokens. The ``layout`` (with the process count) may change on resume, and ``steps``
    may grow (the cosine schedule then stretches).
    """

    model: ModelSpec
    layout: Layout  # how the ranks split the model and the batch (may change on resume)
    global_batch: int  # sequences per optimizer step
    seq_len: int  # tokens per sequence
    steps: int = setting(20, "--steps", "optimizer steps in all (default {default}; resumed: the saved run's)",
                         "what", unset=True)  # counted from step 0 (a resumed run may ask for more)
    seed: int = setting(0, "--seed", "seed of weights, data order and dropout (default {default})", "what",
                        unset=True, same_run=True)
    data: str = setting("synthetic", "--data", "synthetic, a token file (plait data prepare), or a mixture "
                        "WEIGHT:SOURCE,WEIGHT:SOURCE,... of token files, directories or globs of token files or of "
                        "parquet/arrow/jsonl shards (streamed)", "what",
                        same_run=True)  # absolute paths (plait.run.data.mixture_spec.canonical)
    data_tokenizer: str = setting(
        "bytes", "--data-tokenizer", "tokenizer of the --data sources streamed from parquet/arrow/jsonl shards "
        "(the names plait data prepare takes; default {default})", "what", unset=True, same_run=True)
    data_text_key: str = setting("text", "--data-text-key", "column / JSON key holding the text of streamed "
                                 "--data shards (default {default})", "what", unset=True, same_run=True)
    data_id: str | None = None  # the token file's fingerprint: "crc32=…,tokens=…,bytes=…" (its header and size)
    init_from: str | None = setting(
        None, "--init-from", "start from the weights of a local Hugging Face model directory (config.json + "
        "safetensors, sharded or not) instead of random ones; --model defaults to DIR", "what",
        metavar="DIR")  # None: random init
    doc_mask: bool = setting(
        False, "--doc-mask", "packed documents: each token attends only within its document of the token file "
        "(cut at the end-of-text id plait data prepare wrote) and positions restart at 0 in every document",
        "what", same_run=True)
    eos_id: int | None = None  # with doc_mask: the token file's end-of-text id (from its header, at launch)
    doc_len: int | None = None  # with doc_mask: mean document length of the token file, tokens (the planner's)
    # bos/eos/pad_token_id of the model's Hugging Face config.json (--model config.json or --init-from), as
    # the config has them: plait export writes them (None: the model is a preset or a plait model JSON)
    token_ids: dict | None = None

    def __post_init__(self) -> None:
        problems = positive_int_problems({"global_batch": self.global_batch, "seq_len": self.seq_len,
                                          "steps": self.steps})
        if self.doc_mask and self.data == "synthetic":
            problems.append("--doc-mask needs a token file (plait data prepare): synthetic data has no documents")
        if self.doc_mask and self.data != "synthetic" and self.eos_id is None:
            problems.append(f"--doc-mask: token file {self.data} records no end-of-text id to cut documents "
                            "at; prepare it again with plait data prepare")
        refuse(problems)

    @property
    def job_spec(self) -> JobSpec:
        """The planner's view of this job (global batch in sequences, sequence length in tokens; with
        --doc-mask the mean document length, at most seq_len)."""
        doc_len = min(self.doc_len or self.seq_len, self.seq_len) if self.doc_mask else 0
        return JobSpec(global_batch=self.global_batch, seq_len=self.seq_len, doc_len=doc_len)

    @property
    def tokens_per_step(self) -> int:
        """Tokens per optimizer step: global batch × sequence length."""
        return self.global_batch * self.seq_len


@dataclass(frozen=True)
class CheckpointConfig:
    """Where and how often the run saves its state, and where it starts from (``plait.run.checkpoint``)."""

    dir: str | None = setting(
        None, "--checkpoint-dir", "save checkpoints here (step_NNNNNNNN directories, DCP + manifest); when it "
        "holds checkpoints of the same run, resume from the newest valid one (the same command starts a run and "
        "resumes it after a requeue)", "checkpoints")  # None: no checkpoints
    every: int = setting(0, "--checkpoint-every", "save every N steps (default: only on SIGTERM and at the end)",
                         "checkpoints", unset=True)
    keep: int = setting(3, "--keep-checkpoints", "keep the newest K complete checkpoints (default {default}; 0: all)",
                        "checkpoints", unset=True)
    use_async: bool | None = setting(  # None: asynchronous on GPU, synchronous on CPU
        None, "--async-checkpoint", "write checkpoints from a background thread (auto: on GPU)", "checkpoints",
        kind=str, choices=("auto", "on", "off"), flag_default="auto", to_field={"on": True, "off": False}.get)
    resume_from: str | None = None  # a complete checkpoint directory to start from (None: step 0)

    def __post_init__(self) -> None:
        refuse(non_negative_int_problems({"checkpoint_every": self.every, "keep_checkpoints": self.keep}))


@dataclass(frozen=True)
class RuntimeConfig:
    """How and where the ranks run: device, GPU spec, compilation, timeouts, failure policy."""

    device: str = setting("auto", "--device", "default: cuda if present", "where", choices=("auto", "cpu", "cuda"))
    gpu: str | None = setting(None, "--gpu", "GPU spec for MFU and the memory check (plait clusters); default: from "
                              "the device name", "where")  # a GpuSpec preset: the MFU peak and the prediction
    compile: bool | None = setting(  # torch.compile each block (fullgraph)
        None, "--compile", "torch.compile every block, fullgraph (default: on with CUDA where the layout allows "
        "it, off on CPU)", "where")
    compile_backend: str = setting("inductor", "--compile-backend", "torch.compile backend (default {default})",
                                   "where")  # aot_eager: no code generation, for tests
    async_tp: bool = setting(False, "--async-tp", "async tensor parallelism: inductor overlaps sp's collectives "
                             "with the GEMMs (CUDA + NCCL, compiled blocks, tp > 1 with sp)", "where")
    timeout_s: float = setting(600.0, "--timeout", "collective timeout in seconds: ranks waiting on a dead peer give "
                               "up (default {default:g})", "where")
    on_nan: str = setting("stop", "--on-nan", "non-finite loss or gradient norm: stop naming the step, or skip that "
                          "optimizer step", "checkpoints", choices=("stop", "skip"))
    offload_dir: str | None = setting(None, "--offload-dir", "offload=disk:α writes activations under this "
                                      "directory (default: the temp dir)", "where")
    gc_every: int = setting(50, "--gc-every", "Python's garbage collector off while training, one collection every "
                            "N steps on every rank (default {default}; 0: the automatic collector)", "where")
    qkv: str = setting(  # "separate" | "fused"
        "separate", "--fused-qkv", "Q, K and V projections as one GEMM (checkpoints keep separate wq/wk/wv)", "where",
        kind=bool, flag_default=False, to_field=lambda fused: "fused" if fused else "separate")

    def __post_init__(self) -> None:
        problems = non_negative_int_problems({"gc_every": self.gc_every})
        if self.device not in ("auto", "cpu", "cuda"):
            problems.append(f"device={self.device!r} must be auto, cpu or cuda")
        if self.timeout_s <= 0:
            problems.append(f"timeout_s={self.timeout_s!r} must be positive")
        if self.on_nan not in ("stop", "skip"):
            problems.append(f"on_nan={self.on_nan!r} must be stop or skip")
        if self.compile not in (None, True, False):
            problems.append(f"compile={self.compile!r} must be true, false or null (auto: on GPU)")
        if self.qkv not in ("separate", "fused"):
            problems.append(f"qkv={self.qkv!r} must be separate or fused")
        refuse(problems)


GPU_LOG_EVERY = 10  # default --log-every on GPU (torchtitan's log_freq)


@dataclass(frozen=True)
class LogConfig:
    """What the run reports (not part of what defines it: ranks may differ here)."""

    log: str | None = setting(None, "--log", "JSONL metrics file: one line per step, then a summary line",
                              "what")  # rank 0 writes it
    log_every: int | None = setting(  # None: auto
        None, "--log-every", "read loss and gradient norm on the host (no device sync on the steps between) and "
        f"print at steps 1, N, 2N, ... and the last (N: default {GPU_LOG_EVERY} on GPU, 1 on CPU)", "where")
    tensorboard: str | None = setting(None, "--tensorboard", "also write the metrics as TensorBoard scalars here "
                                      "(pip install tensorboard)", "evaluation", metavar="DIR")
    wandb_project: str | None = setting(None, "--wandb-project", "also log the metrics to this Weights & Biases "
                                        "project (pip install wandb; WANDB_MODE=offline writes locally)",
                                        "evaluation", metavar="NAME")
    mlflow_uri: str | None = setting(None, "--mlflow-uri", "also log the metrics to this MLflow tracking URI, a "
                                     "directory for a local file store (pip install mlflow-skinny)", "evaluation",
                                     metavar="URI")

    def __post_init__(self) -> None:
        if self.log_every is not None:
            refuse(positive_int_problems({"log_every": self.log_every}))

    def log_every_on(self, device_type: str) -> int:
        """Steps between the host's reads of loss and gradient norm (and printed lines): ``log_every``,
        or by default ``GPU_LOG_EVERY`` on a GPU (no device sync on the steps between) and 1 on CPU
        (where reading costs nothing)."""
        if self.log_every is not None:
            return self.log_every
        return GPU_LOG_EVERY if device_type == "cuda" else 1


EVAL_SEED = 0  # data seed of the eval batches: the same windows for runs of any training seed


@dataclass(frozen=True)
class EvalConfig:
    """Held-out loss during training (``plait.run.observe.evaluate``). Every rank must agree on it (each
    evaluation is a collective), so it is part of what the ranks compare at start-up; a resumed
    run takes the request's values (evaluating does not change the training trajectory)."""

    data: str | None = setting(None, "--eval-data", "token file of held-out tokens (plait data prepare): log "
                               "eval_loss, its mean token loss", "evaluation")  # None: no evaluation
    every: int = setting(0, "--eval-every", "evaluate every N steps and after the last one (default: after the last "
                         "one only)", "evaluation")
    steps: int = setting(10, "--eval-steps", "global batches per evaluation, the same ones each time (default "
                         "{default})", "evaluation")  # global_batch × seq_len tokens each

    def __post_init__(self) -> None:
        problems = non_negative_int_problems({"eval_every": self.every})
        problems += positive_int_problems({"eval_steps": self.steps})
        if self.data is None and isinstance(self.every, int) and self.every > 0:
            problems.append(f"eval_every={self.every} needs eval_data (--eval-data TOKENS: a token file)")
        refuse(problems)

    def due_after(self, steps_done: int, total_steps: int) -> bool:
        """Whether to evaluate once ``steps_done`` optimizer steps of ``total_steps`` are done."""
        if self.data is None:
            return False
        return steps_done == total_steps or (self.every > 0 and steps_done % self.every == 0)


@dataclass(frozen=True)
class Prediction:
    """The planner's prediction for this run on one GPU spec (``plait.run.launcher.preflight``)."""

    step_time_s: float  # seconds per optimizer step
    memory_bytes: float  # bytes per GPU at the peak, all of it (context, NCCL buffers, fragmentation reserve too)
    mfu: float  # model FLOPs utilization, a fraction of the GPU's dense bf16 peak
    gpu: str  # the GpuSpec preset predicted for
    allocated_bytes: float  # bytes torch's caching allocator should hand out at the peak (max_memory_allocated)

    @classmethod
    def of_plan(cls, plan, gpu: str) -> Prediction:
        """The prediction of a ``plait.plan.plan.Plan`` evaluated for GPU spec ``gpu``."""
        return cls(step_time_s=plan.step.step_time, memory_bytes=plan.memory.total, mfu=plan.step.mfu, gpu=gpu,
                   allocated_bytes=plan.memory.allocated)


# the flat form (plait before the sub-configs): flat key -> (sub-config, field)
FLAT_FIELDS = {
    **{name: ("job", name) for name in ("model", "layout", "global_batch", "seq_len", "steps", "seed", "data")},
    "checkpoint_dir": ("checkpoint", "dir"), "checkpoint_every": ("checkpoint", "every"),
    "keep_checkpoints": ("checkpoint", "keep"), "async_checkpoint": ("checkpoint", "use_async"),
    "resume_from": ("checkpoint", "resume_from"),
    **{name: ("runtime", name) for name in ("device", "gpu", "compile", "compile_backend", "timeout_s", "on_nan",
                                            "offload_dir", "gc_every", "qkv")},
    "log": ("observe", "log"), "log_every": ("observe", "log_every"),
}


def nest_flat(data: dict) -> dict:
    """A run dict in the flat form of earlier plait versions, in today's nested form (other keys kept)."""
    nested: dict = {}
    for key, value in data.items():
        section, name = FLAT_FIELDS.get(key, (None, key))
        if section is None:
            nested[key] = value
        else:
            nested.setdefault(section, {})[name] = value
    return nested


@dataclass(frozen=True)
class RunConfig:
    """One training run: what is trained, with which optimizer, saved where, run how, reported how."""

    job: TrainJob
    optim: OptimConfig = field(default_factory=OptimConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    observe: LogConfig = field(default_factory=LogConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)  # held-out loss during training
    prediction: Prediction | None = None  # the planner's step time and memory for this run, if known
    job_file: str | None = None  # the plait train command line as a TOML job file (None: not recorded)

    # ------------------------------------------------------------ checks
    def runtime_problems(self) -> list[str]:
        """Why the runtime cannot run this layout (empty when it can): the rules of
        ``plait.spec.capabilities``, then for ``offload=disk`` the offload directory's checks."""
        job = self.job
        run = self.runtime
        out = [v.message for v in runtime_violations(job.model, job.layout, job.job_spec, compile=run.compile)]
        if run.async_tp:
            out += [v.message for v in async_tp_violations(job.layout, device=run.device, compile=run.compile,
                                                           backend=run.compile_backend)]
        if job.layout.offload and job.layout.offload_target == "disk":
            out += self.offload_dir_problems()
        return out

    def offload_dir_problems(self) -> list[str]:
        """``offload=disk``: the directory exists, is writable and has room for the planner's
        offloaded bytes of every rank (counted twice: fp32 activations on CPU)."""
        from plait.plan.memory import activation_bytes, in_flight_microbatches
        from plait.run.memory.offload_dir import offload_dir_problems

        job, lay = self.job, self.job.layout
        in_flight = in_flight_microbatches(lay, lay.micro_batches(job.global_batch))
        per_rank = activation_bytes(job.model, lay, job.job_spec, in_flight)[1]
        return offload_dir_problems(self.runtime.offload_dir, 2 * per_rank * lay.world_size)

    # ----------------------------------------------------------- JSON
    def to_dict(self) -> dict:
        """The nested JSON form: one object per sub-config (the layout as its text)."""
        data = dataclasses.asdict(self)
        data["job"]["layout"] = str(self.job.layout)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> RunConfig:
        """A RunConfig from ``to_dict``'s nested form, or from the flat form of earlier plait versions."""
        if not isinstance(data, dict):
            raise PlaitError("run spec must be a JSON object")
        data = dict(data) if "job" in data else nest_flat(data)
        job = dict(data.get("job") or {})
        if "model" in job:
            job["model"] = ModelSpec.from_dict(job["model"])
        layout = job.get("layout")
        if layout is not None:
            job["layout"] = Layout.parse(layout) if isinstance(layout, str) else Layout.from_dict(layout)
        data["job"] = dataclass_from_dict(TrainJob, job, "run job")
        for name, section in (("optim", OptimConfig), ("checkpoint", CheckpointConfig), ("runtime", RuntimeConfig),
                              ("observe", LogConfig), ("eval", EvalConfig)):
            data[name] = dataclass_from_dict(section, data.get(name) or {}, "optimizer" if name == "optim" else name)
        if data.get("prediction") is not None:
            data["prediction"] = dataclass_from_dict(Prediction, data["prediction"], "prediction")
        return dataclass_from_dict(cls, data, "run")

    def save(self, path: str | Path) -> None:
        atomic_write_text(path, json.dumps(self.to_dict(), indent=2) + "\n", "run config")

    @classmethod
    def load(cls, path: str | Path) -> RunConfig:
        return cls.from_dict(read_json_file(path, "run config"))


def plan_parts(plan: dict, path: str) -> tuple[ModelSpec, Layout, JobSpec, str]:
    """(model, layout, job, GPU name) of a saved plan, with clear errors (``plait.plan.plan.plan_parts_of``)."""
    from plait.plan.plan import plan_parts_of

    model, cluster, job, layout = plan_parts_of(plan, path)
    return model, layout, job, cluster.gpu.name
