"""``plait export``: a plait checkpoint (DCP, saved under any layout) as a Hugging Face model directory.

The checkpoint's manifest holds the run's ModelSpec; DCP's metadata holds every parameter's
global shape, so one process reads the checkpoint with no process group (``dcp.load`` with
``no_dist``), whatever layout and world size wrote it, and never reads the optimizer state (``saved_model``,
``read_model_tensors``: also how ``plait generate`` reads a checkpoint).
The weights are read and written one shard at a time: at most ``max_shard_bytes`` of them (plus
the largest tensor) are in memory. The output is ``config.json`` (of the spec's family:
``plait.spec.hf.writer``; token ids from the ``--init-from`` directory's config) and
``model.safetensors``, or ``model-0000k-of-0000n.safetensors`` shards with their
``model.safetensors.index.json``; the tokenizer files, the special token ids and
``generation_config.json`` (``plait.run.checkpoint.hf.tokenizer`` says where each comes from). Everything is written into a temporary directory beside the
target and renamed to it at the end: a failed export leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from plait.atomic import honour_umask
from plait.errors import PlaitError
from plait.run.checkpoint import store
from plait.run.checkpoint.hf import files as hf_files
from plait.run.checkpoint.hf.files import ExportOptions
from plait.run.checkpoint.hf.load import model_weights, row_instances
from plait.run.checkpoint.hf.map import family_of_model_type
from plait.run.checkpoint.hf.tokenizer import token_ids, write_generation_config, write_tokenizer
from plait.run.checkpoint.safe_reader import SafeFileSystemReader, read_metadata_file
from plait.run.model import build_model
from plait.spec.hf.writer import hf_config_of
from plait.spec.model import ModelSpec

DTYPES = {name: getattr(torch, name) for name in hf_files.EXPORT_DTYPES}


@dataclass(frozen=True)
class Exported:
    """What ``export_checkpoint`` wrote."""

    directory: Path
    checkpoint: Path
    step: int
    files: tuple[str, ...]
    tensors: int
    bytes: int
    note: str | None = None  # one line: why no tokenizer files were written


def find_checkpoint(target: str | Path) -> store.Checkpoint:
    """A complete checkpoint directory, or the newest valid one under a ``--checkpoint-dir`` (checksums verified)."""
    path = Path(target)
    if not path.is_dir():
        raise PlaitError(f"--checkpoint {target}: no such directory")
    if (path / store.MANIFEST).exists():
        return store.verify(path)
    found, refused = store.latest_valid(path)
    if found is None:
        why = "; ".join(text for _, text in refused) if refused else "it holds no step_NNNNNNNN checkpoint"
        raise PlaitError(f"--checkpoint {target}: no valid checkpoint ({why})")
    return found


def _check_target(target: Path) -> None:
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise PlaitError(f"--to {target}: already exists and is not an empty directory; plait export never "
                         "overwrites (choose a new directory)")
    if not target.parent.is_dir():
        raise PlaitError(f"--to {target}: its parent directory {target.parent} does not exist")


def _saved_shapes(path: Path, names: list[str]) -> dict[str, tuple[int, ...]]:
    """{plait name: global shape} of the model tensors a DCP checkpoint holds; PlaitError for a missing one."""
    metadata = read_metadata_file(Path(path) / ".metadata").state_dict_metadata
    shapes = {}
    for name in names:
        entry = metadata.get(f"model.{name}")
        if entry is None or not hasattr(entry, "size"):
            raise PlaitError(f"checkpoint {path} has no tensor model.{name}: not a checkpoint of model "
                             "its manifest names")
        shapes[name] = tuple(entry.size)
    return shapes


def saved_model(found: store.Checkpoint) -> tuple[ModelSpec, dict[str, torch.Tensor]]:
    """(the run's ModelSpec, {plait name: meta tensor}: parameters, a tied matrix once, and kept buffers) of a
    verified checkpoint; PlaitError when a model tensor is missing from it or has another shape."""
    from plait.run.config import RunConfig

    spec = RunConfig.from_dict(found.run).job.model
    full = model_weights(build_model(spec, "meta"))
    shapes = _saved_shapes(found.path, list(full))
    for name, param in full.items():
        if shapes[name] != tuple(param.shape):
            raise PlaitError(f"checkpoint {found.path}: model.{name} has shape {list(shapes[name])}, model "
                             f"{spec.name} has {list(param.shape)}")
    return spec, full


def read_model_tensors(path: Path, wanted: dict[str, torch.Tensor]) -> None:
    """Fill ``wanted`` ({"model.<plait name>": full tensor}) from the DCP checkpoint at ``path``, in this one
    process (no process group; whatever layout and world size wrote it); the optimizer state is not read."""
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():  # DCP warns that it loads in one process, which is the intent
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(wanted, storage_reader=SafeFileSystemReader(str(path)), no_dist=True)


def export_checkpoint(checkpoint: str | Path, target: str | Path,
                      options: ExportOptions = ExportOptions()) -> Exported:
    """Write the model of a plait checkpoint (any layout) as a Hugging Face model directory ``target``."""
    from plait.run.config import RunConfig

    if options.dtype not in DTYPES:
        raise PlaitError(f"--dtype {options.dtype}: choose one of {', '.join(DTYPES)}")
    if options.max_shard_bytes < 1:
        raise PlaitError("--max-shard-size must be positive")
    target = Path(target)
    _check_target(target)
    found = find_checkpoint(checkpoint)
    saved = RunConfig.from_dict(found.run)
    spec = saved.job.model
    config = hf_config_of(spec, options.dtype)  # refuses what the family's config cannot express
    family = family_of_model_type(config["model_type"])
    spec, full = saved_model(found)
    rows = row_instances(family, full, spec)
    dtype = DTYPES[options.dtype]
    item = torch.empty((), dtype=dtype).element_size()
    sizes = [(hf_name, row.codec.to_hf(tuple(full[n] for n in names), spec).numel() * item)
             for hf_name, (row, names) in rows.items()]
    groups = hf_files.shard_groups(sizes, options.max_shard_bytes)
    files = hf_files.shard_names(len(groups))
    temporary = target.parent / f".{target.name}.tmp-{os.getpid()}"
    temporary.mkdir()
    try:
        from safetensors.torch import save_file
    except ImportError:
        shutil.rmtree(temporary)
        raise PlaitError("plait export needs the safetensors package: pip install safetensors") from None
    try:
        weight_map = {}
        for group, file in zip(groups, files):
            wanted = {f"model.{n}": torch.empty(full[n].shape, dtype=full[n].dtype)
                      for hf_name in group for n in rows[hf_name][1]}
            read_model_tensors(found.path, wanted)
            tensors = {}
            for hf_name in group:
                row, names = rows[hf_name]
                value = row.codec.to_hf(tuple(wanted[f"model.{n}"] for n in names), spec)
                tensors[hf_name] = value.to(dtype).contiguous()
                weight_map[hf_name] = file
            save_file(tensors, str(temporary / file), metadata={"format": "pt"})
            honour_umask(temporary / file)  # safetensors writes 0600
        if len(files) > 1:
            total = sum(size for _, size in sizes)
            (temporary / hf_files.INDEX).write_text(hf_files.index_json(weight_map, total, spec.total_params()))
        tokenizer = write_tokenizer(saved.job, temporary, options.tokenizer)
        ids = token_ids(saved.job, tokenizer.token_ids)
        config.update(ids)
        (temporary / hf_files.CONFIG).write_text(json.dumps(config, indent=2) + "\n")
        copied = [*tokenizer.files, write_generation_config(saved.job, temporary, ids)]
        if target.exists():
            target.rmdir()  # empty (checked): the rename takes its place
        os.rename(temporary, target)
    except OSError as exc:
        shutil.rmtree(temporary, ignore_errors=True)
        raise PlaitError(f"cannot write {target}: {exc.strerror or exc}") from None
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return Exported(directory=target, checkpoint=found.path, step=found.step,
                    files=tuple([hf_files.CONFIG, *files, *([hf_files.INDEX] if len(files) > 1 else []), *copied]),
                    tensors=len(rows), bytes=sum(size for _, size in sizes), note=tokenizer.note)
