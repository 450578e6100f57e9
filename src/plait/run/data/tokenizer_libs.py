"""Tokenizers from libraries: a local Hugging Face ``tokenizer.json`` (``tokenizers``) and tiktoken encodings.

Both have the byte tokenizer's interface (``name``, ``vocab_size``, ``eot_id``, ``encode``,
``encode_batch``, ``decode``). Nothing is downloaded by plait: a tokenizer.json is read from a local
path; a tiktoken encoding comes from tiktoken's own cache (tiktoken fetches it on first use when the
machine is online). The libraries are imported only here, when such a tokenizer is asked for.

Documents are encoded as plain text: no special tokens are added (no BOS), and a special token's
text inside a document (``<|endoftext|>``) is encoded as ordinary text, never as the special id -
so the only end-of-text ids in a token file are the ones ``prepare`` puts between documents.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from plait.errors import PlaitError

# end-of-text tokens tried in this order when no tokenizer_config.json names one (GPT-2/Qwen, Llama 3,
# Llama 2/Mistral/SentencePiece, Gemma)
EOS_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")
TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILES = ("tokenizer_config.json", "special_tokens_map.json")  # beside tokenizer.json; may name eos_token


# the packages that pyproject.toml's ``data`` extra installs (tests/run/test_data_prepare.py checks it):
# tiktoken is not one of them (it downloads its encodings; installed by hand)
DATA_EXTRA = ("tokenizers", "pyarrow")


def _missing(package: str) -> PlaitError:
    extra = " (or pip install -e '.[data]')" if package in DATA_EXTRA else ""
    return PlaitError(f"this tokenizer needs the {package} package: pip install {package}{extra}")


def configured_eos(folder: Path) -> str | None:
    """The ``eos_token`` named by tokenizer_config.json or special_tokens_map.json in ``folder``, if any."""
    for name in CONFIG_FILES:
        path = folder / name
        if not path.is_file():
            continue
        try:
            eos = json.loads(path.read_text(encoding="utf-8")).get("eos_token")
        except (OSError, ValueError, AttributeError):
            continue  # an unreadable side file: fall back to the candidates
        if isinstance(eos, dict):
            eos = eos.get("content")
        if isinstance(eos, str) and eos:
            return eos
    return None


class HFTokenizer:
    """A Hugging Face fast tokenizer read from a local ``tokenizer.json`` (or a directory holding one)."""

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        file = path / TOKENIZER_FILE if path.is_dir() else path
        if not file.is_file():
            extra = (" (it has tokenizer.model: load it once with transformers' AutoTokenizer and save_pretrained "
                     "to write tokenizer.json)") if (path / "tokenizer.model").exists() else ""
            raise PlaitError(f"tokenizer directory {path} has no {TOKENIZER_FILE}{extra}")
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise _missing("tokenizers") from None
        try:
            self._tok = Tokenizer.from_file(str(file))
        except Exception as e:  # the library raises its own Exception type for a bad file
            raise PlaitError(f"{file} is not a tokenizer.json that the tokenizers library reads: "
                             f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
        if hasattr(self._tok, "encode_special_tokens"):
            self._tok.encode_special_tokens = True  # a special token's text in a document stays text
        self.path = file
        self.name = f"hf:{file.parent.name or file.stem}"
        vocab = self._tok.get_vocab(with_added_tokens=True)
        self.vocab_size = max(vocab.values()) + 1 if vocab else 0
        if self.vocab_size < 2:
            raise PlaitError(f"{file} has a vocabulary of {self.vocab_size} tokens; a tokenizer needs at least 2")
        self.eot_id = self._find_eos(file.parent, vocab)

    def _find_eos(self, folder: Path, vocab: dict[str, int]) -> int | None:
        named = configured_eos(folder)
        if named is not None and named in vocab:
            return vocab[named]
        for token in EOS_CANDIDATES:
            if token in vocab:
                return vocab[token]
        return None  # prepare asks for --eos-id

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens added)."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """Token ids of each text (the library encodes them on its own threads)."""
        return [np.asarray(e.ids, dtype=np.int64) for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)


class TiktokenTokenizer:
    """A tiktoken encoding by name (``tiktoken:gpt2``, ``tiktoken:cl100k_base``, ...)."""

    def __init__(self, encoding: str) -> None:
        try:
            import tiktoken
        except ImportError:
            raise _missing("tiktoken") from None
        try:
            self._enc = tiktoken.get_encoding(encoding)
        except ValueError:
            raise PlaitError(f"unknown tiktoken encoding {encoding!r}; known: "
                             f"{', '.join(tiktoken.list_encoding_names())}") from None
        except Exception as e:  # no cached file and no network, mostly
            raise PlaitError(f"tiktoken could not load encoding {encoding!r} ({type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else 'no detail'}); it downloads an encoding "
                             "once, then reads its cache (TIKTOKEN_CACHE_DIR)") from None
        self.name = f"tiktoken:{encoding}"
        self.vocab_size = self._enc.n_vocab
        try:
            self.eot_id = self._enc.eot_token
        except (KeyError, AttributeError):  # an encoding without <|endoftext|>: prepare asks for --eos-id
            self.eot_id = None

    def encode(self, text: str) -> list[int]:
        return self._enc.encode_ordinary(text)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.asarray(ids, dtype=np.int64) for ids in self._enc.encode_ordinary_batch(texts, num_threads=1)]

    def decode(self, ids) -> str:
        return self._enc.decode([int(i) for i in ids if int(i) != self.eot_id])
