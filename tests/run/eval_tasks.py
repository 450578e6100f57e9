"""Task bodies of the eval tests (tests/run/test_eval.py), run in one process or on every rank of a
DistPool: the tiny model trained with a held-out loss, and the token files it reads."""

from __future__ import annotations

import dataclasses
import json
import zlib
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from plait.run.config import EvalConfig
from plait.run.data.tokens import HEADER, MAGIC, VERSION

from runtime_tasks import make_config


def write_token_file(path: str | Path, n_tokens: int, vocab: int, seed: int) -> str:
    """A plait token file (run/data/tokens.py's format) of ``n_tokens`` uniformly random ids < ``vocab``."""
    ids = np.random.default_rng(seed).integers(0, vocab, n_tokens).astype("<u2")
    header = HEADER.pack(MAGIC, VERSION, 2, vocab, n_tokens, zlib.crc32(ids.tobytes()), 0, b"random")
    Path(path).write_bytes(header + ids.tobytes())
    return str(path)


def eval_config(layout: str, eval_data: str, log: str | None = None, steps: int = 3, every: int = 1,
                batches: int = 2, **kwargs):
    """``runtime_tasks.make_config``'s tiny run with an evaluation after every ``every`` steps."""
    config = make_config(layout, steps=steps, log=log, **kwargs)
    return dataclasses.replace(config, eval=EvalConfig(data=eval_data, every=every, steps=batches))


def train_with_eval(layout: str, eval_data: str, log: str, **kwargs) -> dict:
    """Train with evaluation; every rank returns its step losses, the summary's eval loss and (rank 0,
    which writes the JSONL log) the eval lines."""
    from plait.run.trainer import run_training

    result = run_training(eval_config(layout, eval_data, log=log, **kwargs), device=torch.device("cpu"))
    out = {"losses": [r.loss for r in result.records], "eval_loss": result.summary.eval_loss}
    if dist.get_rank() == 0:
        lines = [json.loads(line) for line in Path(log).read_text().splitlines()]
        out["evals"] = [line for line in lines if "eval_loss" in line and not line.get("summary")]
    return out


def hand_eval_loss(model: torch.nn.Module, eval_data: str, global_batch: int, seq_len: int, batches: int) -> float:
    """The eval loss computed by hand: the plain model's mean cross entropy over eval batches
    0..batches-1 of ``eval_data`` read with data seed 0, one forward per batch."""
    import torch.nn.functional as F

    from plait.run.data.tokens import TokenFile

    source = TokenFile(eval_data, seed=0)
    model.eval()
    total = 0.0
    with torch.no_grad():
        for k in range(batches):
            rows = torch.from_numpy(source.batch(k, range(global_batch), seq_len, global_batch))
            logits = model(rows[:, :-1])
            total += F.cross_entropy(logits.flatten(0, 1).float(), rows[:, 1:].flatten()).item()
    return total / batches


def one_process_eval_run(eval_data: str, log: str, tensorboard: str) -> dict:
    """``train_with_eval`` on one process with a TensorBoard directory, plus the hand-computed eval loss
    of the final weights (run inside ``runtime_tasks.in_one_process``)."""
    from plait.run.trainer import run_training

    config = eval_config("dp=1", eval_data, log=log)
    config = dataclasses.replace(config, observe=dataclasses.replace(config.observe, tensorboard=tensorboard))
    result = run_training(config, device=torch.device("cpu"))
    job = config.job
    return {"losses": [r.loss for r in result.records], "lrs": [r.lr for r in result.records],
            "eval_loss": result.summary.eval_loss,
            "hand": hand_eval_loss(result.parts.chunks[0], eval_data, job.global_batch, job.seq_len,
                                   config.eval.steps)}


def eval_and_save_then_resume(layout: str, eval_data: str, root: str) -> dict:
    """Two steps with an evaluation and a checkpoint after each (the first on the same step, the
    second the last step), then a run resumed from the step-1 checkpoint: every rank returns the
    losses of both runs; rank 0 also the checkpoints written and verified."""
    from plait.run.checkpoint import store
    from plait.run.trainer import run_training

    def run(**kwargs):
        config = eval_config(layout, eval_data, steps=2, every=1, batches=1, checkpoint_every=1, **kwargs)
        return [r.loss for r in run_training(config, device=torch.device("cpu")).records]

    first = run(checkpoint_dir=f"{root}/a")
    out = {"first": first}
    if dist.get_rank() == 0:
        out["saved"] = [store.verify(path).step for path in store.complete_dirs(Path(f"{root}/a"))]
    dist.barrier()
    out["resumed"] = run(checkpoint_dir=f"{root}/b", resume_from=f"{root}/a/{store.final_name(1)}")
    return out
