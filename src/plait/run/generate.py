"""``plait generate``: sample new tokens from a plait checkpoint or a Hugging Face model directory.

One process, no process group. The model comes from:

* a plait checkpoint (a ``step_NNNNNNNN`` directory, or a ``--checkpoint-dir``: its newest valid one)
  saved under any layout: read whole as ``plait export`` reads it
  (``plait.run.checkpoint.hf.export.saved_model`` / ``read_model_tensors``: DCP with ``no_dist``);
* a Hugging Face model directory (config.json + safetensors): read as ``plait train --init-from``
  reads it (``plait.run.checkpoint.hf.load``: the same checks, the same conversion).

The prompt is tokenized by, first to last: ``--tokenizer`` (a name ``plait data prepare`` takes:
``bytes``, ``tiktoken:NAME``, a tokenizer.json or a directory holding one); the Hugging Face
directory's own tokenizer.json; the ``--init-from`` directory's; the tokenizer the run's token file
records in its header (the byte tokenizer needs no files). Generation stops after
``max_new_tokens`` tokens, or at the tokenizer's end-of-text token (kept in the ids, not in the text).

Sampling: each step takes the logits (float32) of the last position, leaves out the ids the
tokenizer does not have (a model's vocabulary is often padded past its tokenizer's: those rows
never saw a token), divides them by the
temperature, keeps the ``top_k`` largest (0: all), then the smallest set of most likely tokens whose
probabilities sum to at least ``top_p``, and draws from a CPU ``torch.Generator`` seeded with
``seed`` (so the same seed draws the same tokens on CPU and GPU, up to the logits' rounding);
temperature 0 is greedy (argmax, the first of equal maxima). There is no KV cache: every step
recomputes the forward pass over the whole sequence (quadratic in its length), which is plenty for
the small models one samples from to look at a run, not a serving path.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from plait.errors import PlaitError
from plait.run.sampling import SamplingOptions, check_sampling
from plait.spec.model import ModelSpec


@dataclass(frozen=True)
class Generated:
    """What ``generate`` produced: the prompt's ids, the new ids, the new text, where the model came from."""

    prompt_ids: list[int]
    new_ids: list[int]
    text: str
    source: str  # the checkpoint directory read, or the Hugging Face directory
    tokenizer: str  # the tokenizer's name
    stopped_at_eos: bool


def is_hf_directory(path: Path) -> bool:
    """Whether ``path`` is a Hugging Face model directory (a config.json, no plait manifest)."""
    from plait.run.checkpoint import store
    from plait.run.checkpoint.hf.files import CONFIG

    return path.is_dir() and (path / CONFIG).is_file() and not (path / store.MANIFEST).exists()


def _fresh_model(spec: ModelSpec):
    """plait's model of ``spec`` on the CPU in eval mode, with its RoPE tables (weights to be overwritten)."""
    from plait.run.model import build_model, init_weights

    model = build_model(spec, "cpu")
    model.tie_embeddings()
    init_weights(model, spec, 0, "cpu")  # also computes the RoPE tables, which cannot be built on meta
    return model.eval()


@torch.no_grad()
def load_checkpoint_model(target: str | Path):
    """(model, spec, the run's TrainJob, the checkpoint directory) of a plait checkpoint, on the CPU."""
    from plait.run.checkpoint.hf.export import find_checkpoint, read_model_tensors, saved_model
    from plait.run.checkpoint.hf.load import model_weights
    from plait.run.config import RunConfig

    found = find_checkpoint(target)
    spec, _ = saved_model(found)
    model = _fresh_model(spec)
    wanted = {f"model.{name}": p.detach() for name, p in model_weights(model).items()}
    try:
        read_model_tensors(found.path, wanted)
    except PlaitError:
        raise
    except Exception as exc:  # noqa: BLE001 - DCP's own errors on damaged files: one line naming the checkpoint
        raise PlaitError(f"--checkpoint {target}: cannot read its weights ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0][:200] if str(exc) else ''})") from None
    return model, spec, RunConfig.from_dict(found.run).job, found.path


def hf_spec(directory: str | Path) -> ModelSpec:
    """The ModelSpec of a Hugging Face model directory's config.json (PlaitError for a family or a
    feature plait's runtime does not build), its weights' headers checked readable."""
    from plait.run.checkpoint.hf.files import check_model_dir
    from plait.spec.hf_config import model_from_hf_config

    return model_from_hf_config(check_model_dir(directory, "--checkpoint"))


@torch.no_grad()
def load_hf_model(directory: str | Path, spec: ModelSpec):
    """plait's model ``spec`` with the weights of a Hugging Face model directory, read and checked as
    ``--init-from`` reads them."""
    from plait.run.checkpoint.hf.load import load_hf_weights, model_weights

    path = Path(directory).resolve()
    model = _fresh_model(spec)
    try:
        load_hf_weights(path, model_weights(model).items(), spec, "cpu")
    except PlaitError as exc:
        raise PlaitError(str(exc).replace("--init-from", "--checkpoint", 1)) from None
    return model


def run_tokenizer(job, tokenizer: str | None):
    """The tokenizer of a plait checkpoint's run (see the module doc for the order); PlaitError when
    the run does not say which and none is given."""
    from plait.run.checkpoint.hf.tokenizer import data_tokenizer
    from plait.run.data.tokenizer import get_tokenizer

    if tokenizer:
        return get_tokenizer(tokenizer)
    if job.init_from and (Path(job.init_from) / "tokenizer.json").is_file():
        return get_tokenizer(str(job.init_from))
    name, _ = data_tokenizer(job)
    if name is None:
        why = "the run trained on synthetic tokens" if job.data in (None, "synthetic") else \
            f"the run's token file {job.data} is gone"
        raise PlaitError(f"no tokenizer for the prompt: {why} (pass --tokenizer: bytes, tiktoken:NAME, or a "
                         "tokenizer.json or its directory)")
    if name == "bytes" or name.startswith("tiktoken:"):
        return get_tokenizer(name)
    raise PlaitError(f"the run's tokens came from {name}, whose files the token file does not keep "
                     "(pass --tokenizer PATH: its tokenizer.json or directory)")


def hf_tokenizer(directory: Path, tokenizer: str | None):
    """The tokenizer of a Hugging Face directory: ``--tokenizer``, else its own tokenizer.json."""
    from plait.run.data.tokenizer import get_tokenizer

    if tokenizer:
        return get_tokenizer(tokenizer)
    if not (directory / "tokenizer.json").is_file():
        raise PlaitError(f"--checkpoint {directory} has no tokenizer.json (pass --tokenizer: bytes, "
                         "tiktoken:NAME, or a tokenizer.json or its directory)")
    return get_tokenizer(str(directory))


def next_token(logits: torch.Tensor, options: SamplingOptions, generator: torch.Generator,
               known: int | None = None) -> int:
    """The id drawn from one position's ``logits`` (vocab,) as ``options`` say (see the module doc), among
    ids below ``known`` (the tokenizer's vocabulary size; None: all)."""
    logits = logits.float().cpu()
    if known is not None and known < logits.numel():
        logits[known:] = float("-inf")
    if options.temperature == 0:
        return int(torch.argmax(logits))
    logits = logits / options.temperature
    if 0 < options.top_k < logits.numel():
        cut = torch.topk(logits, options.top_k).values[-1]
        logits = logits.masked_fill(logits < cut, float("-inf"))
    if options.top_p < 1:
        ordered, order = torch.sort(logits, descending=True)
        probs = torch.softmax(ordered, dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs  # the probability of the tokens ranked above each
        drop = before >= options.top_p  # the first token is always kept (before = 0 < top_p)
        logits = logits.scatter(0, order[drop], float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


@torch.no_grad()
def sample(model, spec: ModelSpec, prompt_ids: list[int], options: SamplingOptions, device: torch.device,
           eos_id: int | None, known: int | None = None) -> tuple[list[int], bool]:
    """(new ids, whether the end-of-text id ended them) of ``model`` continuing ``prompt_ids``, among ids
    below ``known`` (the tokenizer's vocabulary size; None: all)."""
    generator = torch.Generator().manual_seed(options.seed)
    ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)
    new: list[int] = []
    for _ in range(options.max_new_tokens):
        token = next_token(model(ids)[0, -1], options, generator, known)
        new.append(token)
        if token == eos_id:
            return new, True
        ids = torch.cat([ids, torch.tensor([[token]], dtype=torch.long, device=device)], dim=1)
    return new, False


def _prompt_ids(tok, prompt: str, spec: ModelSpec, options: SamplingOptions) -> list[int]:
    if tok.vocab_size > spec.vocab:
        raise PlaitError(f"tokenizer {tok.name} has {tok.vocab_size} token ids, model {spec.name} only "
                         f"{spec.vocab}: not the model's tokenizer (pass the run's with --tokenizer)")
    ids = [int(i) for i in tok.encode(prompt)]
    if not ids:
        raise PlaitError("--prompt is empty: give at least one token of text")
    if len(ids) + options.max_new_tokens > spec.max_seq_len:
        raise PlaitError(f"--prompt is {len(ids)} tokens; with --max-new-tokens {options.max_new_tokens} that is "
                         f"{len(ids) + options.max_new_tokens}, more than model {spec.name}'s {spec.max_seq_len} "
                         "positions (shorten the prompt or ask for fewer tokens)")
    return ids


def generate(checkpoint: str | Path, prompt: str, options: SamplingOptions = SamplingOptions(),
             device: str = "auto", tokenizer: str | None = None) -> Generated:
    """Sample ``options.max_new_tokens`` tokens continuing ``prompt`` from a plait checkpoint or a Hugging
    Face directory ``checkpoint``, on ``device`` ("auto", "cpu" or "cuda": ``plait.run.device.uses_gpu``)."""
    from plait.run.device import uses_gpu

    check_sampling(options)
    target = Path(checkpoint)
    on = torch.device("cuda", torch.cuda.current_device()) if uses_gpu(device) else torch.device("cpu")
    if not target.is_dir():
        raise PlaitError(f"--checkpoint {checkpoint}: no such directory")
    if is_hf_directory(target):
        spec = hf_spec(target)
        tok = hf_tokenizer(target, tokenizer)
        model = load_hf_model(target, spec)
        source = target
    else:
        model, spec, job, source = load_checkpoint_model(target)
        tok = run_tokenizer(job, tokenizer)
    ids = _prompt_ids(tok, prompt, spec, options)
    model = model.to(on)
    new, stopped = sample(model, spec, ids, options, on, tok.eot_id, tok.vocab_size)
    return Generated(prompt_ids=ids, new_ids=new, text=tok.decode(new), source=str(source), tokenizer=tok.name,
                     stopped_at_eos=stopped)
