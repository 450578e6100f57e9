"""``plait export``: a plait checkpoint (DCP, saved under any layout) as a Hugging Face model directory.

The checkpoint's manifest holds the run's ModelSpec; DCP's metadata holds every parameter's
global shape, so one process reads the checkpoint with no process group (``dcp.load`` with
``no_dist``), whatever layout and world size wrote it, and never reads the optimizer state.
The weights are read and written one shard at a time: at most ``max_shard_bytes`` of them (plus
the largest tensor) are in memory. The output is ``config.json`` (Llama's or GPT-2's) and
``model.safetensors``, or ``model-0000k-of-0000n.safetensors`` shards with their
``model.safetensors.index.json``; with the tokenizer files of the ``--init-from`` directory the
run started from, when it had them. Everything is written into a temporary directory beside the
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

from plait.errors import PlaitError
from plait.run.checkpoint import hf_files, store
from plait.run.checkpoint.hf_files import ExportOptions
from plait.run.checkpoint.hf_import import row_instances, unique_parameters
from plait.run.checkpoint.hf_map import family_of_spec
from plait.run.model import NORM_EPS, ROPE_THETA, build_model
from plait.spec.model import ModelSpec

DTYPES = {name: getattr(torch, name) for name in hf_files.EXPORT_DTYPES}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "generation_config.json")


@dataclass(frozen=True)
class Exported:
    """What ``export_checkpoint`` wrote."""

    directory: Path
    checkpoint: Path
    step: int
    files: tuple[str, ...]
    tensors: int
    bytes: int


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


def hf_config(spec: ModelSpec, names: set[str], dtype: str) -> dict:
    """The Hugging Face ``config.json`` of ``spec`` (``names``: the model's parameter names; they say which
    biases it has). PlaitError for what neither config can express."""
    if spec.arch == "gpt":
        if spec.n_kv_heads != spec.n_heads:
            raise PlaitError(f"model {spec.name}: GPT-2 has no grouped-query attention (n_kv_heads "
                             f"{spec.n_kv_heads} != n_heads {spec.n_heads}); it cannot be exported as GPT-2")
        dropout = 0.1 if spec.dropout else 0.0
        return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": spec.vocab,
                "n_embd": spec.hidden, "n_layer": spec.n_layers, "n_head": spec.n_heads, "n_inner": spec.ffn_hidden,
                "n_positions": spec.max_seq_len, "n_ctx": spec.max_seq_len, "layer_norm_epsilon": NORM_EPS,
                "activation_function": "gelu_new", "resid_pdrop": dropout, "embd_pdrop": dropout,
                "attn_pdrop": dropout, "scale_attn_weights": True, "tie_word_embeddings": spec.tied_embeddings,
                "bos_token_id": None, "eos_token_id": None, "dtype": dtype, "torch_dtype": dtype}
    attention_bias = "layers.0.attention.wq.bias" in names
    if attention_bias != ("layers.0.attention.wo.bias" in names) or "layers.0.attention.q_norm.weight" in names:
        raise PlaitError(f"model {spec.name}: Llama's config.json cannot express its attention (biases on only "
                         "some projections, or qk-norm); add its family's config to plait.run.checkpoint.hf_export")
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": spec.vocab,
            "hidden_size": spec.hidden, "intermediate_size": spec.ffn_hidden, "num_hidden_layers": spec.n_layers,
            "num_attention_heads": spec.n_heads, "num_key_value_heads": spec.n_kv_heads, "head_dim": spec.head_dim,
            "max_position_embeddings": spec.max_seq_len, "rms_norm_eps": NORM_EPS, "hidden_act": "silu",
            "rope_theta": ROPE_THETA, "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA},
            "attention_bias": attention_bias, "mlp_bias": "layers.0.feed_forward.w1.bias" in names,
            "attention_dropout": 0.1 if spec.dropout else 0.0, "tie_word_embeddings": spec.tied_embeddings,
            "bos_token_id": None, "eos_token_id": None, "dtype": dtype, "torch_dtype": dtype}


def _check_target(target: Path) -> None:
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise PlaitError(f"--to {target}: already exists and is not an empty directory; plait export never "
                         "overwrites (choose a new directory)")
    if not target.parent.is_dir():
        raise PlaitError(f"--to {target}: its parent directory {target.parent} does not exist")


def _saved_shapes(path: Path, names: list[str]) -> dict[str, tuple[int, ...]]:
    """{plait name: global shape} of the model tensors a DCP checkpoint holds; PlaitError for a missing one."""
    from torch.distributed.checkpoint import FileSystemReader

    metadata = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    shapes = {}
    for name in names:
        entry = metadata.get(f"model.{name}")
        if entry is None or not hasattr(entry, "size"):
            raise PlaitError(f"checkpoint {path} has no tensor model.{name}: not a checkpoint of model "
                             "its manifest names")
        shapes[name] = tuple(entry.size)
    return shapes


def export_checkpoint(checkpoint: str | Path, target: str | Path,
                      options: ExportOptions = ExportOptions()) -> Exported:
    """Write the model of a plait checkpoint (any layout) as a Hugging Face model directory ``target``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

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
    family = family_of_spec(spec)
    full = unique_parameters(build_model(spec, "meta").named_parameters())
    shapes = _saved_shapes(found.path, list(full))
    for name, param in full.items():
        if shapes[name] != tuple(param.shape):
            raise PlaitError(f"checkpoint {found.path}: model.{name} has shape {list(shapes[name])}, model "
                             f"{spec.name} has {list(param.shape)}")
    rows = row_instances(family, full)
    config = hf_config(spec, set(full), options.dtype)
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
            with warnings.catch_warnings():  # DCP warns that it loads in one process, which is the intent
                warnings.filterwarnings("ignore", message="torch.distributed is disabled")
                dcp.load(wanted, storage_reader=FileSystemReader(str(found.path)), no_dist=True)
            tensors = {}
            for hf_name in group:
                row, names = rows[hf_name]
                value = row.codec.to_hf(tuple(wanted[f"model.{n}"] for n in names), spec)
                tensors[hf_name] = value.to(dtype).contiguous()
                weight_map[hf_name] = file
            save_file(tensors, str(temporary / file), metadata={"format": "pt"})
        if len(files) > 1:
            total = sum(size for _, size in sizes)
            (temporary / hf_files.INDEX).write_text(hf_files.index_json(weight_map, total, spec.total_params()))
        (temporary / hf_files.CONFIG).write_text(json.dumps(config, indent=2) + "\n")
        copied = _copy_tokenizer(saved.job, temporary)
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
                    tensors=len(rows), bytes=sum(size for _, size in sizes))


def _copy_tokenizer(job, directory: Path) -> list[str]:
    """Copy the tokenizer files of the run's ``--init-from`` directory (when it still has them)."""
    source = job.init_from
    if not source or not Path(source).is_dir():
        return []
    copied = []
    for name in TOKENIZER_FILES:
        if (Path(source) / name).is_file():
            shutil.copyfile(Path(source) / name, directory / name)
            copied.append(name)
    return copied
