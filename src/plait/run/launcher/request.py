"""TrainRequest: what ``plait train`` was asked, as plain typed values (no command-line parsing, no torch).

``None`` means "not given": a fresh run then takes the default of the RunConfig sub-config that
holds the setting (``TrainJob``, ``OptimConfig``, ``CheckpointConfig``), a resumed run the
checkpoint's saved value. The defaults that are not "not given" are read from the sub-configs
(``TrainJob``, ``RuntimeConfig``, ``LogConfig``) and ``LaunchOptions``, where they are declared;
``plait.run.launcher.resolve`` turns a request into the run.
"""

from __future__ import annotations

from dataclasses import dataclass

from plait.run.config import EvalConfig, LogConfig, RuntimeConfig, TrainJob
from plait.run.launcher.launch import LaunchOptions


@dataclass(frozen=True)
class TrainRequest:
    """One ``plait train`` invocation. Sizes in sequences and tokens; times in seconds."""

    # what to train: a saved plan, or model + layout + batch
    plan: str | None = None  # plan file written by plait plan --save
    model: str | None = None  # model preset, config.json or model JSON
    layout: str | None = None  # layout text, e.g. "dp=2,tp=2" (default: dp over all processes)
    global_batch: int | None = None  # sequences per optimizer step
    seq_len: int | None = None  # tokens per sequence
    steps: int | None = None  # optimizer steps in all (None: TrainJob.steps, or the resumed run's)
    seed: int | None = None  # None: TrainJob.seed (resumed: the saved one)
    data: str = TrainJob.data  # "synthetic" or a token file
    init_from: str | None = TrainJob.init_from  # Hugging Face model directory: its weights start the run
    log: str | None = None  # JSONL metrics file
    tensorboard: str | None = LogConfig.tensorboard  # TensorBoard event directory
    wandb_project: str | None = LogConfig.wandb_project  # Weights & Biases project
    mlflow_uri: str | None = LogConfig.mlflow_uri  # MLflow tracking URI
    # held-out loss (EvalConfig; a resumed run takes these, not the saved ones)
    eval_data: str | None = EvalConfig.data  # token file (None: no evaluation)
    eval_every: int = EvalConfig.every  # evaluate every N steps and after the last (0: after the last only)
    eval_steps: int = EvalConfig.steps  # global batches per evaluation
    # optimizer (None: OptimConfig's defaults; warm-up: 10% of the steps)
    lr: float | None = None
    warmup_steps: int | None = None
    weight_decay: float | None = None
    grad_clip: float | None = None
    lr_schedule: str | None = None  # None: OptimConfig.schedule (resumed: the saved one)
    min_lr: float | None = None  # absolute floor of the decay (None: OptimConfig.min_lr_ratio·lr)
    decay_fraction: float | None = None  # wsd only (None: OptimConfig.decay_fraction)
    # where to run (torchrun)
    nproc_per_node: int | None = None  # processes per node (None: the layout's world size over the nodes)
    gpus: int | None = None  # processes in all (alternative to nproc_per_node)
    nnodes: str = "1"  # "N", or elastic "MIN:MAX"
    rdzv_endpoint: str | None = None  # host:port of the rendezvous
    rdzv_id: str | None = None  # None: derived per job (resolve.job_rdzv_id), never a fixed default
    node_rank: int | None = None  # static rendezvous
    master_addr: str | None = None
    master_port: int | None = None
    device: str = RuntimeConfig.device  # auto | cpu | cuda
    gpu: str | None = None  # GPU spec preset (None: from the device name, or the plan's)
    compile: bool | None = RuntimeConfig.compile  # None: on GPU where the layout allows it
    compile_backend: str = RuntimeConfig.compile_backend
    async_tp: bool = RuntimeConfig.async_tp
    offload_dir: str | None = RuntimeConfig.offload_dir
    fused_qkv: bool = False  # RuntimeConfig.qkv = "fused": one GEMM for Q, K and V
    gc_every: int = RuntimeConfig.gc_every  # Python GC every N steps (0: automatic)
    timeout: float = RuntimeConfig.timeout_s  # collective timeout, seconds
    allow_oom: bool = False  # run even if the planner predicts out-of-memory
    log_every: int | None = LogConfig.log_every  # host reads and printed lines every N steps (None: 10 on GPU, 1 on CPU)
    run_dir: str | None = None  # keep the run's config and error files here (None: a temporary directory)
    dry_run: bool = False  # check everything, print the torchrun command, do not run
    # checkpoints, resume, failures
    checkpoint_dir: str | None = None
    checkpoint_every: int | None = None  # None: CheckpointConfig.every (resumed: the saved one)
    keep_checkpoints: int | None = None  # None: CheckpointConfig.keep (resumed: the saved one)
    async_checkpoint: str = "auto"  # auto (on GPU) | on | off
    resume: str | None = None  # a checkpoint directory, or a --checkpoint-dir to take the newest valid one
    fresh: bool = False  # start from step 0; refuse a --checkpoint-dir that holds checkpoints (else: resumed)
    allow_data_change: bool = False  # resume on a token file other than the checkpoint's (its fingerprint differs)
    max_restarts: int = LaunchOptions.max_restarts
    on_nan: str = RuntimeConfig.on_nan  # stop | skip
