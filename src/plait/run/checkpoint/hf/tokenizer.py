"""What makes an exported model directory self-contained: its tokenizer files, special token ids
and ``generation_config.json`` (``plait export``; no torch here).

The tokenizer comes from, first to last:

1. ``plait export --tokenizer PATH``: a tokenizer.json, or a directory holding one (its
   ``TOKENIZER_FILES`` are copied);
2. the run's ``--init-from`` directory, when it still has tokenizer files;
3. the tokenizer the run's token file names in its header (``plait data prepare``): the byte
   tokenizer (``bytes``) is written out as a ``tokenizer.json`` of its own (``byte_tokenizer_json``:
   ids 0..255 are the UTF-8 bytes, 256 is ``<|endoftext|>``); a ``tiktoken:`` encoding or an
   ``hf:NAME`` tokenizer's files are not kept by the token file, so none are written and the
   export says so in one line (with ``--tokenizer`` as the fix). Synthetic data has no tokenizer.

Token ids (``bos_token_id``, ``eos_token_id``, ``pad_token_id``): those of the model's Hugging Face
config.json recorded at launch (``TrainJob.token_ids``, from ``--model config.json`` or
``--init-from``; a config's 0 stays 0), else those of the ``--init-from`` config.json if it is still
there; an end-of-text id missing from both is the tokenizer's (or the one the token file's header records). ``generation_config.json`` holds the
same ids (the one of ``--init-from`` is copied as it is, when there is one).
"""

from __future__ import annotations

import json
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path

from plait.errors import PlaitError
from plait.run.checkpoint.hf.files import CONFIG

TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt")
GENERATION_CONFIG = "generation_config.json"
BYTE_EOS = "<|endoftext|>"  # the byte tokenizer's id 256 (plait.run.data.tokenizer.ByteTokenizer.eot_id)
BYTE_EOS_ID = 256


@dataclass(frozen=True)
class TokenizerFiles:
    """What ``write_tokenizer`` wrote into an export: file names, the tokenizer's own token ids, a note."""

    files: tuple[str, ...] = ()
    token_ids: dict | None = None  # e.g. {"eos_token_id": 256}: the tokenizer's end of text
    note: str | None = None  # one line: why no tokenizer was written


def hf_token_ids(model: str | Path | None) -> dict | None:
    """bos/eos/pad token ids of a Hugging Face config.json (a file, or a directory holding one), as the
    config has them (None included); None when ``model`` is not one (a preset name, a plait model JSON)."""
    if not model:
        return None
    path = Path(model)
    path = path / CONFIG if path.is_dir() else path
    if not path.is_file() or path.suffix != ".json":
        return None
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(config, dict) or not ("model_type" in config or "architectures" in config):
        return None
    return {key: config[key] for key in TOKEN_ID_KEYS if key in config}


def _chars_of_bytes() -> dict[int, str]:
    """GPT-2's byte-level map (what the ``tokenizers`` ByteLevel pre-tokenizer writes): each byte as one
    printable character: the printable Latin-1 bytes as themselves, the others as U+0100 upwards."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    moved = [b for b in range(256) if b not in kept]
    return {**{b: chr(b) for b in kept}, **{b: chr(256 + i) for i, b in enumerate(moved)}}


def byte_tokenizer_json() -> str:
    """The byte tokenizer (``bytes``) as a Hugging Face tokenizer.json: a BPE with no merges over the
    byte-level alphabet (id = the byte's value), and ``<|endoftext|>`` = 256 as a special token."""
    chars = _chars_of_bytes()
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
    data = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": BYTE_EOS_ID, "content": BYTE_EOS, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}],
        "normalizer": None, "pre_tokenizer": byte_level, "post_processor": None, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {chars[b]: b for b in range(256)}, "merges": []},
    }
    return json.dumps(data, ensure_ascii=False, indent=1) + "\n"


def _tokenizer_config(eos: str | None, max_length: int) -> str:
    return json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos, "bos_token": None,
                       "pad_token": None, "unk_token": None, "model_max_length": max_length,
                       "clean_up_tokenization_spaces": False}, indent=2) + "\n"


def _copy_from(source: Path, directory: Path) -> list[str]:
    copied = []
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, directory / name)
            copied.append(name)
    return copied


def data_tokenizer(job) -> tuple[str | None, int | None]:
    """(tokenizer name, end-of-text id) in the header of the run's token file ((None, None): synthetic
    data, or the file is gone; the id is None in a file that records none)."""
    if not job.data or job.data == "synthetic":
        return None, None
    from plait.run.data.mixture_spec import is_mixture

    if is_mixture(job.data):
        return _mixture_tokenizer(job)
    if not Path(job.data).is_file():
        return None, None
    from plait.run.data.token_format import HEADER

    try:
        with open(job.data, "rb") as handle:
            fields = HEADER.unpack(handle.read(HEADER.size))
    except (OSError, struct.error):  # struct.error: a file shorter than a header
        return None, None
    eos_field = fields[-2]  # the end-of-text id + 1, 0: none (plait.run.data.token_format.eos_field)
    return fields[-1].rstrip(b"\0").decode("ascii", errors="replace"), eos_field - 1 if eos_field else None


def _mixture_tokenizer(job) -> tuple[str | None, int | None]:
    """``data_tokenizer`` of a data mixture: its sources share one tokenizer (``--data-tokenizer``
    when one of them is streamed, else their token files' header name); (None, None) when gone."""
    from plait.run.data.mixture import MixtureSource
    from plait.run.data.stream import StreamSource

    try:
        mixture = MixtureSource(job.data, tokenizer=job.data_tokenizer, text_key=job.data_text_key)
    except PlaitError:
        return None, None
    mixture.close()
    streamed = any(isinstance(source, StreamSource) for source in mixture.sources)
    return (job.data_tokenizer if streamed else mixture.tokenizer), mixture.eos_id


def _eos_of(directory: Path) -> tuple[str, int] | None:
    """(text, id) of the end-of-text token of the tokenizer.json in ``directory``: the one its
    tokenizer_config.json names, else the first of the usual ones it has (read as JSON, no library)."""
    from plait.run.data.tokenizer_libs import EOS_CANDIDATES, configured_eos

    try:
        data = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))
        vocab = data["model"]["vocab"] if isinstance(data["model"].get("vocab"), dict) else {}
        vocab = {**vocab, **{t["content"]: int(t["id"]) for t in data.get("added_tokens") or []}}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    named = configured_eos(directory)
    for token in ([named] if named else []) + list(EOS_CANDIDATES):
        if token in vocab:
            return token, vocab[token]
    return None


def _finish(directory: Path, copied: list[str], max_length: int) -> TokenizerFiles:
    """The copied files, a tokenizer_config.json when none came with them, and the end-of-text id."""
    eos = _eos_of(directory) if "tokenizer.json" in copied else None
    if "tokenizer.json" in copied and "tokenizer_config.json" not in copied:
        (directory / "tokenizer_config.json").write_text(_tokenizer_config(eos[0] if eos else None, max_length),
                                                         encoding="utf-8")
        copied.append("tokenizer_config.json")
    return TokenizerFiles(tuple(copied), {"eos_token_id": eos[1]} if eos else None)


def write_tokenizer(job, directory: Path, tokenizer: str | None = None) -> TokenizerFiles:
    """Write the run's tokenizer files into the export ``directory`` (see the module doc for the order)."""
    max_length = job.model.max_seq_len
    if tokenizer:
        source = Path(tokenizer)
        if source.is_file() and source.suffix == ".json":
            shutil.copyfile(source, directory / "tokenizer.json")
            return _finish(directory, ["tokenizer.json"], max_length)
        if not (source / "tokenizer.json").is_file():
            raise PlaitError(f"--tokenizer {tokenizer}: neither a tokenizer.json nor a directory holding one")
        return _finish(directory, _copy_from(source, directory), max_length)
    if job.init_from and Path(job.init_from).is_dir():
        copied = _copy_from(Path(job.init_from), directory)
        if copied:
            return _finish(directory, copied, max_length)
    name, eos_id = data_tokenizer(job)
    if name == "bytes":
        (directory / "tokenizer.json").write_text(byte_tokenizer_json(), encoding="utf-8")
        (directory / "tokenizer_config.json").write_text(_tokenizer_config(BYTE_EOS, max_length), encoding="utf-8")
        return TokenizerFiles(("tokenizer.json", "tokenizer_config.json"), {"eos_token_id": BYTE_EOS_ID})
    if name is None:
        why = "the run trained on synthetic tokens" if job.data in (None, "synthetic") else \
            f"the run's token file {job.data} is gone"
        return TokenizerFiles(note=f"no tokenizer files written: {why} (pass --tokenizer PATH to add one)")
    return TokenizerFiles(token_ids={"eos_token_id": eos_id} if eos_id is not None else None,
                          note=f"no tokenizer files written: the run's tokens came from {name}, whose files the "
                               "token file does not keep (pass --tokenizer PATH: its tokenizer.json or directory)")


def token_ids(job, from_tokenizer: dict | None) -> dict:
    """bos/eos/pad ids for the export's config.json (see the module doc)."""
    ids = dict(job.token_ids) if job.token_ids is not None else (hf_token_ids(job.init_from) or {})
    for key, value in (from_tokenizer or {}).items():
        if ids.get(key) is None:
            ids[key] = value
    return ids


def write_generation_config(job, directory: Path, ids: dict) -> str:
    """``generation_config.json``: the ``--init-from`` one when there is one, else the token ids."""
    source = Path(job.init_from) / GENERATION_CONFIG if job.init_from else None
    if source is not None and source.is_file():
        shutil.copyfile(source, directory / GENERATION_CONFIG)
    else:
        body = {"_from_model_config": True, **{k: v for k, v in ids.items() if v is not None}}
        (directory / GENERATION_CONFIG).write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")
    return GENERATION_CONFIG
