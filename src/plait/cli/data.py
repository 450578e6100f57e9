"""``plait data prepare``: tokenize documents (or import a raw token array) into a token file for
``plait train --data``. The defaults shown are read from ``PrepareOptions``, never restated here."""

from __future__ import annotations

import argparse

from plait.errors import PlaitError
from plait.run.data.import_bin import DEFAULT_RAW_DTYPE, RAW_DTYPES, import_bin
from plait.run.data.prepare import PrepareOptions, prepare
from plait.run.data.tokenizer import get_tokenizer
from plait.run.data.tokens import sample_corpus_path

HELP = "prepare training data"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = PrepareOptions()
    data_sub = parser.add_subparsers(dest="data_command", required=True)
    prepare = data_sub.add_parser(
        "prepare", help="tokenize documents into a token file for plait train --data",
        description="Tokenize .txt, .jsonl/.json and .parquet files (or directories of them, recursively) into a "
                    "token file, with the end-of-text id after every document; or import a raw token array.")
    prepare.add_argument("inputs", nargs="*",
                         help="files or directories: .txt (one document per file), .jsonl/.json (--text-key), "
                              ".parquet (--text-key column); default: the sample corpus")
    prepare.add_argument("--out", required=True, help="token file to write")
    prepare.add_argument("--tokenizer",
                         help=f"bytes (UTF-8 bytes, vocab 257), tiktoken:ENCODING (e.g. tiktoken:gpt2), or a local "
                              f"Hugging Face tokenizer.json or a directory holding one (default {defaults.tokenizer})")
    prepare.add_argument("--text-key", help=f"JSON field / parquet column of the text (default {defaults.text_key})")
    prepare.add_argument("--workers", type=int,
                         help=f"tokenizing processes; the output is the same for any count (default {defaults.workers})")
    prepare.add_argument("--eos-id", type=int,
                         help="id put after every document (default: the tokenizer's end-of-text token)")
    prepare.add_argument("--val-fraction", type=float,
                         help="share of the documents written to --val-out instead, evenly spread (e.g. 0.01)")
    prepare.add_argument("--val-out", help="validation token file (with --val-fraction), e.g. for --eval-data")
    raw = prepare.add_argument_group("import a raw token array (nanoGPT's train.bin) instead of tokenizing")
    raw.add_argument("--import-bin", metavar="FILE", help="raw ids back to back, no header")
    raw.add_argument("--dtype", choices=RAW_DTYPES, help=f"the ids' type (default {DEFAULT_RAW_DTYPE})")
    raw.add_argument("--vocab", type=int,
                     help="the tokenizer's vocabulary size (e.g. 50257 for GPT-2); default: from --tokenizer")


TOKENIZE_ONLY = ("text_key", "workers", "eos_id", "val_fraction", "val_out")  # flags that --import-bin refuses


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def run(args) -> int:
    """``prepare``, the only ``data`` command so far."""
    if args.import_bin is not None:
        return _import(args)
    given = [_flag(name) for name in ("dtype", "vocab") if getattr(args, name) is not None]
    if given:
        raise PlaitError(f"{' and '.join(given)} go with --import-bin FILE (a raw token array); "
                         "tokenizing text needs neither")
    inputs = args.inputs or [str(sample_corpus_path())]
    settings = {name: getattr(args, name) for name in TOKENIZE_ONLY if getattr(args, name) is not None}
    tokenizer = {"tokenizer": args.tokenizer} if args.tokenizer is not None else {}
    summary = prepare(inputs, args.out, progress=True, **tokenizer, **settings)
    print(f"wrote {summary['n_tokens']:,} tokens ({summary['dtype']}, vocab {summary['vocab_size']}, tokenizer "
          f"{summary['tokenizer']}, end-of-text id {summary['eos_id']}) from {summary['n_documents']:,} documents "
          f"in {summary['n_files']} files ({summary['n_bytes_text']:,} bytes of text) to {summary['path']}")
    if "val" in summary:
        val = summary["val"]
        print(f"wrote {val['n_tokens']:,} validation tokens from {val['n_documents']:,} documents to {val['path']}")
    return 0


def _import(args) -> int:
    if args.inputs:
        raise PlaitError("give either input files to tokenize or --import-bin FILE, not both")
    given = [_flag(name) for name in TOKENIZE_ONLY if getattr(args, name) is not None]
    if given:
        raise PlaitError(f"{', '.join(given)} apply to tokenizing text, not to --import-bin")
    vocab, name = args.vocab, None
    if args.tokenizer is not None:
        tok = get_tokenizer(args.tokenizer)
        vocab, name = (tok.vocab_size if vocab is None else vocab), tok.name
    if vocab is None:
        raise PlaitError("--import-bin needs --vocab N (the tokenizer's vocabulary size, e.g. 50257 for GPT-2) "
                         "or --tokenizer (to read it from)")
    summary = import_bin(args.import_bin, args.out, args.dtype or DEFAULT_RAW_DTYPE, vocab, name)
    print(f"wrote {summary['n_tokens']:,} tokens ({summary['dtype']}, vocab {summary['vocab_size']}, tokenizer "
          f"{summary['tokenizer']}) from {summary['source']} to {summary['path']}")
    return 0
