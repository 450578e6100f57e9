"""``plait data prepare``: tokenize text files into a token file for ``plait train --data``."""

from __future__ import annotations

import argparse

HELP = "prepare training data"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    data_sub = parser.add_subparsers(dest="data_command", required=True)
    prepare = data_sub.add_parser("prepare", help="tokenize text files into a token file for plait train --data")
    prepare.add_argument("inputs", nargs="*", help="text files or directories of *.txt (default: the sample corpus)")
    prepare.add_argument("--out", required=True, help="token file to write")
    prepare.add_argument("--tokenizer", default="bytes", help="tokenizer (bytes: UTF-8 bytes, vocab 257)")


def run(args) -> int:
    """``prepare``, the only ``data`` command so far."""
    from plait.run.data.tokens import prepare, sample_corpus_path

    inputs = args.inputs or [str(sample_corpus_path())]
    summary = prepare(inputs, args.out, tokenizer=args.tokenizer)
    print(f"wrote {summary['n_tokens']:,} tokens ({summary['dtype']}, vocab {summary['vocab_size']}) from "
          f"{summary['n_files']} files ({summary['n_bytes_text']:,} bytes of text) to {summary['path']}")
    return 0
