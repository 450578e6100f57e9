"""A small byte-level BPE tokenizer trained in the test itself (``tokenizers``), and documents to feed it.

``train_bpe`` writes ``tokenizer.json`` into a folder; ``expected_stream`` is what a token file of
those documents must hold, computed with the library directly (each document's ids, no special
tokens added, then the end-of-text id) - never through plait.
"""

from __future__ import annotations

from pathlib import Path

EOS = "<|endoftext|>"
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A stitch in time saves nine, and the weaver knows it.",
    "Plait the threads: data, tensor, pipeline and context.",
    "Grüße aus Köln — naïve café, 日本語 too.",
    "Every document ends with an end-of-text token.",
]
DOCS = [f"{s} Number {i}." for i, s in enumerate(SENTENCES * 3)]  # 15 distinct documents


def train_bpe(folder: Path, special: list[str], vocab: int = 320) -> Path:
    """A byte-level BPE of at most ``vocab`` ids trained on SENTENCES, saved as folder/tokenizer.json;
    the ``special`` tokens get the first ids (0, 1, ...)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=special, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(SENTENCES * 4, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


def expected_stream(tokenizer_file: Path, docs: list[str], eos_token: str = EOS) -> list[int]:
    """Each document's ids (the library's own encoding, no special tokens added), then the EOS id."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_file))
    eos = tok.token_to_id(eos_token)
    out: list[int] = []
    for doc in docs:
        out += tok.encode(doc, add_special_tokens=False).ids + [eos]
    return out
