"""The Hugging Face interchange: a local model directory's weights into a run, a checkpoint out to one.

  files.py   the directory's files without torch: config.json, safetensors headers, shards and
             their index, ``check_model_dir`` (the launcher's check), ``ExportOptions``
  map.py     which Hugging Face tensor holds which plait parameter, one table of rows per family,
             and the codecs that convert between the two (a new family adds rows here)
  gpt_oss.py GPT-OSS's rows beyond Llama's: sinks, the biased router, the fused interleaved gate/up experts
  load.py    ``plait train --init-from DIR``: each rank checks the checkpoint against its model and
             fills the parameters it holds (``init_from_hf``, ``load_hf_weights``)
  export.py  ``plait export``: a plait (DCP) checkpoint as a Hugging Face model directory (its
             one-process checkpoint reading is also ``plait generate``'s)
  tokenizer.py  what makes an export self-contained: the tokenizer files (copied, or the byte
             tokenizer's written), the special token ids, ``generation_config.json``
"""
