"""RunConfig: everything one training run needs, as plain data (no torch import).

``plait train`` builds it, checks it before launching anything, writes it to a JSON file and
hands that file to every worker. A saved plan supplies its model, layout, job and GPU
(``plan_parts``); ``plait train --plan`` builds the RunConfig from them.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from plait.errors import PlaitError
from plait.spec.capabilities import runtime_violations
from plait.spec.layout import JobSpec, Layout
from plait.spec.model import ModelSpec
from plait.spec.serialize import dataclass_from_dict, read_json_file


@dataclass(frozen=True)
class OptimConfig:
    """AdamW with linear warmup then cosine decay to ``min_lr_ratio``·lr."""

    lr: float = 3e-4
    min_lr_ratio: float = 0.1
    warmup_steps: int = 10
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0  # max global gradient norm; 0 disables clipping



@dataclass(frozen=True)
class RunConfig:
    """One training run. Sizes in sequences and tokens; times in seconds."""

    model: ModelSpec
    layout: Layout
    global_batch: int
    seq_len: int
    steps: int = 20
    seed: int = 0
    data: str = "synthetic"  # "synthetic" or a token file written by `plait data prepare`
    log: str | None = None  # JSONL metrics file (rank 0 writes it)
    optim: OptimConfig = field(default_factory=OptimConfig)
    compile: bool = False  # torch.compile each block
    compile_backend: str = "inductor"  # torch.compile backend (aot_eager: no code generation, for tests)
    device: str = "auto"  # auto (cuda if available) | cpu | cuda
    gpu: str | None = None  # GpuSpec preset: the MFU peak and the memory/time prediction
    timeout_s: float = 600.0  # collective timeout: ranks stuck waiting for a dead peer give up after this
    log_every: int = 1  # print a line every N steps when stdout is not a terminal
    prediction: dict | None = None  # the planner's step time and memory for this run, if known
    # checkpoints: see plait.run.checkpoint.dcp
    checkpoint_dir: str | None = None  # root of step_NNNNNNNN checkpoint directories
    checkpoint_every: int = 0  # save every N optimizer steps (0: only on SIGTERM and at the end)
    keep_checkpoints: int = 3  # newest complete checkpoints kept (0: all)
    async_checkpoint: bool | None = None  # None: asynchronous on GPU, synchronous on CPU
    resume_from: str | None = None  # a complete checkpoint directory to start from
    on_nan: str = "stop"  # non-finite loss or gradient norm: "stop", or "skip" the optimizer step
    offload_dir: str | None = None  # offload=disk: activations go to a fresh directory in here (default: temp dir)

    def __post_init__(self) -> None:
        problems = []
        for name in ("global_batch", "seq_len", "steps", "log_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                problems.append(f"{name}={value!r} must be a positive integer")
        if self.device not in ("auto", "cpu", "cuda"):
            problems.append(f"device={self.device!r} must be auto, cpu or cuda")
        if self.timeout_s <= 0:
            problems.append(f"timeout_s={self.timeout_s!r} must be positive")
        if not isinstance(self.checkpoint_every, int) or self.checkpoint_every < 0:
            problems.append(f"checkpoint_every={self.checkpoint_every!r} must be a non-negative integer")
        if not isinstance(self.keep_checkpoints, int) or self.keep_checkpoints < 0:
            problems.append(f"keep_checkpoints={self.keep_checkpoints!r} must be a non-negative integer")
        if self.on_nan not in ("stop", "skip"):
            problems.append(f"on_nan={self.on_nan!r} must be stop or skip")
        if problems:
            raise PlaitError("invalid run: " + "; ".join(problems))

    @property
    def job(self) -> JobSpec:
        return JobSpec(global_batch=self.global_batch, seq_len=self.seq_len)

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    # ------------------------------------------------------------ checks
    def runtime_problems(self) -> list[str]:
        """Why the runtime cannot run this layout (empty when it can): the rules of
        ``plait.spec.capabilities``, then for ``offload=disk`` the offload directory's checks."""
        out = [v.message for v in runtime_violations(self.model, self.layout, self.job, compile=self.compile)]
        if self.layout.offload and self.layout.offload_target == "disk":
            out += self.offload_dir_problems()
        return out

    def offload_dir_problems(self) -> list[str]:
        """``offload=disk``: the directory exists, is writable and has room for the planner's
        offloaded bytes of every rank (counted twice: fp32 activations on CPU)."""
        from plait.plan.memory import activation_bytes, in_flight_microbatches
        from plait.run.memory.offload_dir import offload_dir_problems

        lay = self.layout
        in_flight = in_flight_microbatches(lay, lay.micro_batches(self.global_batch))
        per_rank = activation_bytes(self.model, lay, self.job, in_flight)[1]
        return offload_dir_problems(self.offload_dir, 2 * per_rank * lay.world_size)

    # ----------------------------------------------------------- JSON
    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["layout"] = str(self.layout)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> RunConfig:
        data = dict(data)
        data["model"] = ModelSpec.from_dict(data["model"])
        layout = data["layout"]
        data["layout"] = Layout.parse(layout) if isinstance(layout, str) else Layout.from_dict(layout)
        data["optim"] = dataclass_from_dict(OptimConfig, data.get("optim", {}), "optimizer")
        return dataclass_from_dict(cls, data, "run")

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> RunConfig:
        return cls.from_dict(read_json_file(path, "run config"))


def plan_parts(plan: dict, path: str) -> tuple[ModelSpec, Layout, JobSpec, str]:
    """(model, layout, job, GPU name) of a saved plan, with clear errors (``plait.plan.plan.plan_parts_of``)."""
    from plait.plan.plan import plan_parts_of

    model, cluster, job, layout = plan_parts_of(plan, path)
    return model, layout, job, cluster.gpu.name
