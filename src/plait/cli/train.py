"""``plait train``: its flags, turned into a ``TrainRequest`` for ``plait.run.launcher.resolve.start``.

The defaults shown in the help are read from where they are declared (the RunConfig
sub-configs ``TrainJob``, ``OptimConfig``, ``CheckpointConfig``, and ``TrainRequest``), never
restated here.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys

from plait.cli.jobfile.read import add_config_flags
from plait.errors import PlaitError
from plait.run.config import GPU_LOG_EVERY, LR_SCHEDULES, CheckpointConfig, EvalConfig, OptimConfig, TrainJob
from plait.run.launcher.request import TrainRequest

HELP = "train a layout with torchrun (CPU: gloo, GPU: NCCL)"
DEFAULTS = TrainRequest()


def _shown(value: float) -> str:
    """A default as the help prints it: ``3e-4`` rather than ``0.0003``, ``1.0``, ``0.1``."""
    text = repr(value)
    mantissa, _, exponent = f"{value:.0e}".partition("e")
    compact = f"{mantissa}e{int(exponent)}"
    return compact if float(compact) == value and len(compact) < len(text) and value < 1 else text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    optim = OptimConfig()
    what = parser.add_argument_group("what to train (a saved plan, or model + layout + batch)")
    what.add_argument("--plan", help="plan file written by plait plan --save")
    what.add_argument("--model", help="model preset, config.json or model JSON")
    what.add_argument("--layout", help='e.g. "dp=2,tp=2,pp=2,zero=3,ckpt=selective" (default: dp over all processes)')
    what.add_argument("--global-batch", type=int, help="sequences per optimizer step")
    what.add_argument("--seq-len", type=int, help="tokens per sequence")
    what.add_argument("--steps", type=int,
                      help=f"optimizer steps in all (default {TrainJob.steps}; resumed: the saved run's)")
    what.add_argument("--seed", type=int, help=f"seed of weights, data order and dropout (default {TrainJob.seed})")
    what.add_argument("--data", default=DEFAULTS.data, help="synthetic, or a token file (plait data prepare)")
    what.add_argument("--init-from", metavar="DIR",
                      help="start from the weights of a local Hugging Face model directory (config.json + "
                           "safetensors, sharded or not) instead of random ones; --model defaults to DIR")
    what.add_argument("--log", help="JSONL metrics file: one line per step, then a summary line")
    opt = parser.add_argument_group("optimizer")
    opt.add_argument("--lr", type=float, help=f"peak learning rate (default {_shown(optim.lr)})")
    opt.add_argument("--warmup-steps", type=int, default=None, help="linear warm-up steps (default: 10%% of steps)")
    opt.add_argument("--weight-decay", type=float,
                     help=f"AdamW weight decay of matrices (default {_shown(optim.weight_decay)})")
    opt.add_argument("--grad-clip", type=float,
                     help=f"max global gradient norm (default {_shown(optim.grad_clip)}; 0: off)")
    opt.add_argument("--lr-schedule", choices=LR_SCHEDULES,
                     help=f"after the warm-up: cosine, linear, wsd (warm-up, stable, then a linear decay over "
                          f"the last --decay-fraction of the steps) or constant (default {optim.schedule})")
    opt.add_argument("--min-lr", type=float,
                     help=f"learning rate the decay ends at (default {optim.min_lr_ratio:g} × --lr)")
    opt.add_argument("--decay-fraction", type=float,
                     help=f"wsd: fraction of the steps that decay (default {optim.decay_fraction:g})")
    evals = parser.add_argument_group("evaluation and metrics sinks")
    evals.add_argument("--eval-data", default=DEFAULTS.eval_data,
                       help="token file of held-out tokens (plait data prepare): log eval_loss, its mean token loss")
    evals.add_argument("--eval-every", type=int, default=DEFAULTS.eval_every,
                       help="evaluate every N steps and after the last one (default: after the last one only)")
    evals.add_argument("--eval-steps", type=int, default=DEFAULTS.eval_steps,
                       help=f"global batches per evaluation, the same ones each time (default {EvalConfig.steps})")
    evals.add_argument("--tensorboard", metavar="DIR", default=DEFAULTS.tensorboard,
                       help="also write the metrics as TensorBoard scalars here (pip install tensorboard)")
    evals.add_argument("--wandb-project", metavar="NAME", default=DEFAULTS.wandb_project,
                       help="also log the metrics to this Weights & Biases project (pip install wandb; "
                            "WANDB_MODE=offline writes locally)")
    evals.add_argument("--mlflow-uri", metavar="URI", default=DEFAULTS.mlflow_uri,
                       help="also log the metrics to this MLflow tracking URI (pip install mlflow)")
    where = parser.add_argument_group("where to run (torchrun)")
    where.add_argument("--nproc-per-node", "--nproc", type=int, help="processes (GPUs) per node")
    where.add_argument("--gpus", type=int, help="processes in all (alternative to --nproc-per-node)")
    where.add_argument("--nnodes", default=DEFAULTS.nnodes,
                       help="nodes (run the same command on each); elastic: MIN:MAX with --rdzv-endpoint")
    where.add_argument("--rdzv-endpoint", help="host:port of the rendezvous, for several nodes")
    where.add_argument("--rdzv-id", default=DEFAULTS.rdzv_id,
                       help="job id shared by the nodes of one run (default: derived from the command line and the "
                            "scheduler's job id, the same on every node of the job)")
    where.add_argument("--node-rank", type=int, help="this node's rank (static rendezvous, with --master-addr)")
    where.add_argument("--master-addr", help="address of node 0 (static rendezvous)")
    where.add_argument("--master-port", type=int, help="port on node 0 (static rendezvous; default 29500)")
    where.add_argument("--device", default=DEFAULTS.device, choices=("auto", "cpu", "cuda"),
                       help="default: cuda if present")
    where.add_argument("--gpu", help="GPU spec for MFU and the memory check (plait clusters); default: from the device name")
    where.add_argument("--compile", action=argparse.BooleanOptionalAction, default=DEFAULTS.compile,
                       help="torch.compile every block, fullgraph (default: on with CUDA where the layout "
                            "allows it, off on CPU)")
    where.add_argument("--compile-backend", default=DEFAULTS.compile_backend,
                       help=f"torch.compile backend (default {DEFAULTS.compile_backend})")
    where.add_argument("--async-tp", action="store_true",
                       help="async tensor parallelism: inductor overlaps sp's collectives with the GEMMs "
                            "(CUDA + NCCL, compiled blocks, tp > 1 with sp)")
    where.add_argument("--fused-qkv", action="store_true",
                       help="Q, K and V projections as one GEMM (checkpoints keep separate wq/wk/wv)")
    where.add_argument("--gc-every", type=int, default=DEFAULTS.gc_every,
                       help="Python's garbage collector off while training, one collection every N steps on every "
                            f"rank (default {DEFAULTS.gc_every}; 0: the automatic collector)")
    where.add_argument("--offload-dir", default=DEFAULTS.offload_dir,
                       help="offload=disk:α writes activations under this directory (default: the temp dir)")
    where.add_argument("--timeout", type=float, default=DEFAULTS.timeout,
                       help="collective timeout in seconds: ranks waiting on a dead peer give up "
                            f"(default {DEFAULTS.timeout:g})")
    where.add_argument("--allow-oom", action="store_true", help="run even if the planner predicts out-of-memory")
    where.add_argument("--log-every", type=int, default=DEFAULTS.log_every,
                       help="read loss and gradient norm on the host (no device sync on the steps between) and "
                            f"print every N steps (default {GPU_LOG_EVERY} on GPU, 1 on CPU)")
    where.add_argument("--run-dir", help="keep the run's config and error files here (default: a temporary dir)")
    where.add_argument("--dry-run", action="store_true", help="check everything, print the torchrun command, do not run")
    ckpt = parser.add_argument_group("checkpoints, resume, failures")
    ckpt.add_argument("--checkpoint-dir",
                      help="save checkpoints here (step_NNNNNNNN directories, DCP + manifest); when it holds "
                           "checkpoints of the same run, resume from the newest valid one (the same command "
                           "starts a run and resumes it after a requeue)")
    ckpt.add_argument("--checkpoint-every", type=int, help="save every N steps (default: only on SIGTERM and at the end)")
    ckpt.add_argument("--keep-checkpoints", type=int,
                      help=f"keep the newest K complete checkpoints (default {CheckpointConfig.keep}; 0: all)")
    ckpt.add_argument("--async-checkpoint", choices=("auto", "on", "off"), default=DEFAULTS.async_checkpoint,
                      help="write checkpoints from a background thread (auto: on GPU)")
    ckpt.add_argument("--resume", metavar="DIR",
                      help="resume from a checkpoint directory, or the newest valid one in a --checkpoint-dir; "
                           "with another --layout or process count (re-planned when the world size changed). "
                           "New checkpoints go to --checkpoint-dir, else beside the resumed one; a DIR without "
                           "checkpoints starts the run there")
    ckpt.add_argument("--fresh", action="store_true",
                      help="start from step 0 and refuse a --checkpoint-dir that already holds checkpoints")
    ckpt.add_argument("--allow-data-change", action="store_true",
                      help="resume although the token file at the saved data path is not the one the "
                           "checkpoint was trained on (its CRC-32, token count or size differ)")
    ckpt.add_argument("--max-restarts", type=int, default=DEFAULTS.max_restarts,
                      help="torchrun restarts after a worker dies; each restart resumes from the newest checkpoint")
    ckpt.add_argument("--on-nan", choices=("stop", "skip"), default=DEFAULTS.on_nan,
                      help="non-finite loss or gradient norm: stop naming the step, or skip that optimizer step")
    add_config_flags(parser, print_config=True)


def run(args) -> int:
    from plait.run.launcher.resolve import start

    request = _request(args)
    if not args.print_config:
        try:
            job_file = _job_file(args)
        except PlaitError:  # a flag value TOML cannot hold (bytes that are not UTF-8): the run goes on unrecorded
            job_file = None
        return start(request, job_file=job_file)
    job_file = _job_file(args)
    with contextlib.redirect_stdout(sys.stderr):  # stdout is the job file alone: `... --print-config > run.toml`
        start(dataclasses.replace(request, dry_run=True), job_file=job_file)
    sys.stdout.write(job_file)
    return 0


def _job_file(args) -> str:
    """The resolved job file of this command line (``--config`` file and flags merged): what
    ``--print-config`` prints and the checkpoints record; ``--config`` reads it back as the same request."""
    from plait.cli.jobfile.write import job_file

    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    return job_file(parser, vars(args), leave_out=("dry_run",),
                    header="plait train job file: plait train --config FILE (flags given there override it)")


def _request(args) -> TrainRequest:
    """The typed request of the parsed flags (every flag's dest is a TrainRequest field)."""
    return TrainRequest(**{field.name: getattr(args, field.name) for field in dataclasses.fields(TrainRequest)})
