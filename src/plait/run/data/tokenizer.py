"""Tokenizers by name: the byte-level one (no download: one token per UTF-8 byte, plus end-of-text),
a local Hugging Face tokenizer.json, or a tiktoken encoding (``plait.run.data.tokenizer_libs``).

Byte tokenizer: ids 0..255 are the bytes of the UTF-8 encoding; id 256 marks the end of a document.
The vocabulary therefore has 257 entries. Pure Python (no torch, no files).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from plait.errors import PlaitError
from plait.run.data.tokenizer_libs import HFTokenizer, TiktokenTokenizer


class ByteTokenizer:
    """Text <-> token ids, one id per UTF-8 byte (so n_tokens == n_bytes of the text)."""

    name = "bytes"
    eot_id = 256  # end of text: appended after every document by ``prepare``
    vocab_size = 257  # 256 byte values + end of text

    def encode(self, text: str) -> list[int]:
        """The UTF-8 bytes of ``text`` as ids 0..255 (no end-of-text id is added)."""
        return list(text.encode("utf-8"))

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """The UTF-8 bytes of each text, as uint8 arrays."""
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        """Ids back to text; end-of-text ids are skipped, invalid UTF-8 becomes U+FFFD."""
        data = bytearray()
        for i in ids:
            i = int(i)
            if i == self.eot_id:
                continue
            if not 0 <= i < 256:
                raise PlaitError(f"token id {i} is not in the byte tokenizer's vocabulary (0..{self.eot_id})")
            data.append(i)
        return data.decode("utf-8", errors="replace")


TOKENIZERS = {ByteTokenizer.name: ByteTokenizer}
TIKTOKEN_PREFIX = "tiktoken:"
KNOWN = ("bytes, tiktoken:ENCODING (e.g. tiktoken:gpt2), or a path to a Hugging Face tokenizer.json "
         "(or a directory holding one)")


def get_tokenizer(name: str) -> ByteTokenizer | HFTokenizer | TiktokenTokenizer:
    """The tokenizer that ``name`` names (see ``KNOWN``); a PlaitError says what would work otherwise."""
    if name in TOKENIZERS:
        return TOKENIZERS[name]()
    if name.startswith(TIKTOKEN_PREFIX):
        return TiktokenTokenizer(name[len(TIKTOKEN_PREFIX):])
    if Path(name).exists():
        return HFTokenizer(name)
    raise PlaitError(f"unknown tokenizer {name!r} (no such file or directory); give {KNOWN}")
