"""Training data: token files and tokenizers.

  tokens.py          what plait train reads: deterministic synthetic tokens or a token file, sampled
                     independently of the layout
  token_format.py    the token file format (version 1) and its writer
  synthetic.py       exact synthetic rows, fast for large batches
  prefetch.py        the next step's rows made in a background thread
  prepare.py         plait data prepare: documents -> token file (and a validation file)
  documents.py       the documents of prepare's inputs, cut into units of work
  import_bin.py      a raw token array (nanoGPT's train.bin) as a token file
  tokenizer.py       tokenizers by name (byte-level, tokenizer.json, tiktoken)
  tokenizer_libs.py  tokenizers from libraries (tokenizers, tiktoken)
  mixture.py         --data with several weighted sources (token files, shard directories, streams)
  mixture_spec.py    the --data syntax (WEIGHT:PATH,...) and the job file's [[data.sources]]
  schedule.py        which source each global sample reads: exact proportions, layout-independent
  stream.py          parquet/arrow/jsonl shards tokenized on the fly, resumable from a bookmark
"""
