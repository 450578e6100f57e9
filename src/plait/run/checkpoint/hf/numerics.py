"""Whether a Hugging Face checkpoint's ``config.json`` computes the model being trained (no torch):
``plait train --init-from DIR --model M`` asks before any worker starts (``check_init_from``, also
under ``--dry-run``), and every rank asks again with the tensors (``plait.run.checkpoint.hf.load``).

The config is read as plait reads any config (``plait.spec.hf_config``: a value plait's runtime does
not run, such as GPT-OSS's ``swiglu_limit`` other than 7, is refused there, by the one declaration
``plait.spec.hf.values``). Then the fields that change outputs but not tensor shapes
(``NUMERIC_FIELDS``) and the experts' routing (``MoESpec`` without the run's training knobs) must
be the model's. The refusal names the two families first, then each differing field.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from plait.errors import PlaitError
from plait.run.checkpoint.hf.files import CONFIG, read_config
from plait.spec.hf_config import model_from_hf_dict
from plait.spec.model import ModelSpec

# Fields of the ModelSpec read from the checkpoint's config.json that change the model's outputs but
# not its tensors' shapes: the model being trained must have the same (its shapes are checked
# tensor by tensor). Each is built by plait's runtime (plait.run.model).
NUMERIC_FIELDS = ("activation", "rope_theta", "rope_scaling", "norm_eps", "norm_position", "norm_offset", "qk_norm",
                  "embed_scale", "attn_scale", "attn_softcap", "logit_softcap", "sliding_window", "local_layers",
                  "tied_embeddings")
TRAINING_KNOBS = ("aux_loss_coef", "capacity_factor")  # MoESpec fields that are the run's, not the weights'
SHOWN = 6  # differing fields a refusal names


def family_of(spec: ModelSpec) -> str:
    """The Hugging Face family ``spec`` was read from, or the one plait would export it as."""
    if spec.family:
        return spec.family
    from plait.spec.hf.writer import hf_config_of

    try:
        return str(hf_config_of(spec)["model_type"])
    except PlaitError:
        return f"plait's own ({spec.arch}{', with experts' if spec.moe else ''})"


def _moe_differences(read: ModelSpec, spec: ModelSpec) -> list[str]:
    """``moe.field checkpoint's vs model's`` for each routing field that differs."""
    if (read.moe is None) != (spec.moe is None):
        return [f"experts {'yes' if read.moe else 'none'} vs {'yes' if spec.moe else 'none'}"]
    if read.moe is None:
        return []
    return [f"moe.{f.name} {getattr(read.moe, f.name)!r} vs {getattr(spec.moe, f.name)!r}"
            for f in dataclasses.fields(read.moe)
            if f.name not in TRAINING_KNOBS and getattr(read.moe, f.name) != getattr(spec.moe, f.name)]


def runtime_mismatches(config: dict, directory: str | Path, spec: ModelSpec) -> list[str]:
    """``field checkpoint's vs model's`` for each way the checkpoint's config, read as plait reads it,
    differs from the model ``spec`` being trained in its outputs; PlaitError for a config plait does
    not read or whose values its runtime does not run."""
    read = model_from_hf_dict(config, Path(directory) / CONFIG)
    out = [f"{name} {getattr(read, name)!r} vs {getattr(spec, name)!r}"
           for name in NUMERIC_FIELDS if getattr(read, name) != getattr(spec, name)]
    return out + _moe_differences(read, spec)


def mismatch_message(directory: str | Path, config: dict, spec: ModelSpec, wrong: list[str]) -> str:
    """One line: the two families, then the first ``SHOWN`` differing fields."""
    theirs, ours = str(config.get("model_type", "")).lower() or "(no model_type)", family_of(spec)
    families = (f"the checkpoint and the model {spec.name} are both {ours}" if theirs == ours else
                f"the checkpoint is {theirs}, the model {spec.name} is {ours}")
    more = f" and {len(wrong) - SHOWN} more" if len(wrong) > SHOWN else ""
    return (f"--init-from {directory}: {families}; they differ in (checkpoint vs model) "
            f"{', '.join(wrong[:SHOWN])}{more}; the weights would compute another model "
            "(leave out --model to train the checkpoint's own)")


def check_config_fits(directory: str | Path, spec: ModelSpec, config: dict | None = None) -> None:
    """PlaitError (``mismatch_message``) when the checkpoint's config does not compute ``spec``."""
    config = read_config(directory) if config is None else config
    try:
        wrong = runtime_mismatches(config, directory, spec)
    except PlaitError as exc:
        raise PlaitError(f"--init-from {directory}: {exc}") from None
    if wrong:
        raise PlaitError(mismatch_message(directory, config, spec, wrong))


def check_init_from(directory: str, spec: ModelSpec | None) -> None:
    """Before any worker starts: the checkpoint's weights are not stored quantized, its family has a
    weight-name table (``plait.run.checkpoint.hf.map``), and its config computes ``spec`` (the ``--model`` given;
    None: the checkpoint's own). The tensors' shapes are checked by the workers."""
    from plait.run.checkpoint.hf.map import family_of_model_type

    config = read_config(directory)
    quantized = config.get("quantization_config")
    if quantized:
        method = quantized.get("quant_method", "?") if isinstance(quantized, dict) else quantized
        raise PlaitError(f"--init-from {directory}: its weights are stored quantized (quantization_config, "
                         f"quant_method {method!r}); plait imports unquantized (bf16, fp16 or fp32) safetensors: "
                         "save a dequantized copy first (e.g. transformers' from_pretrained then save_pretrained "
                         "in bf16), or train the architecture from scratch with --model")
    try:
        family_of_model_type(str(config.get("model_type", "")).lower())
    except PlaitError as exc:
        raise PlaitError(f"--init-from {directory}: {exc}") from None
    if spec is not None:
        check_config_fits(directory, spec, config)
