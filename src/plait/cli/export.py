"""``plait export``: write a plait checkpoint (any layout) as a Hugging Face model directory."""

from __future__ import annotations

HELP = "write a checkpoint as a Hugging Face model (config.json + safetensors)"


def add_arguments(parser) -> None:
    from plait.run.checkpoint.hf.files import EXPORT_DTYPES, ExportOptions

    defaults = ExportOptions()
    parser.add_argument("--checkpoint", required=True, metavar="CKPT",
                        help="a checkpoint directory (step_NNNNNNNN), or a --checkpoint-dir: its newest valid one")
    parser.add_argument("--to", required=True, metavar="DIR",
                        help="the Hugging Face model directory to create (new, or empty)")
    parser.add_argument("--dtype", choices=EXPORT_DTYPES, default=defaults.dtype,
                        help=f"dtype of the written weights (default {defaults.dtype}: plait's weights exactly)")
    parser.add_argument("--max-shard-size", default=f"{defaults.max_shard_bytes // 10**9}GB",
                        help="larger weights are split into model-0000k-of-0000n.safetensors files of at most "
                             f"this size (default {defaults.max_shard_bytes // 10**9}GB)")
    parser.add_argument("--tokenizer", metavar="PATH",
                        help="copy this tokenizer (a tokenizer.json, or a directory of tokenizer files) into the "
                             "export (default: the --init-from directory's, else the one the run's token file "
                             "names when plait can write it: the byte tokenizer)")


def run(args) -> int:
    from plait.run.checkpoint.hf.export import export_checkpoint
    from plait.run.checkpoint.hf.files import ExportOptions, parse_size
    from plait.spec.units import MIB

    options = ExportOptions(dtype=args.dtype, max_shard_bytes=parse_size(args.max_shard_size), tokenizer=args.tokenizer)
    done = export_checkpoint(args.checkpoint, args.to, options)
    print(f"plait export: {done.checkpoint} (step {done.step}) -> {done.directory}: {done.tensors} tensors, "
          f"{done.bytes / MIB:.1f} MiB in {', '.join(done.files)}")
    if done.note:
        print(f"plait export: {done.note}")
    return 0
