"""The Hugging Face interchange: a local model directory's weights into a run, a checkpoint out to one.

  files.py   the directory's files without torch: config.json, safetensors headers, shards and
             their index, ``check_model_dir`` (the launcher's check), ``ExportOptions``
  map.py     which Hugging Face tensor holds which plait parameter: the registry of the families'
             tables (``FAMILIES``, ``family_of_model_type``; a new family registers here) and row lookup
  codecs.py  the conversions between a Hugging Face tensor and its plait tensors (RoPE row order,
             Conv1D, fused projections, stacked experts)
  rows.py    ``Row``, ``Family`` and the rows most families share (attention, MLP, norms, ends)
  dense_rows.py  the dense families' tables (Llama, OLMo-2, Gemma-2, Phi-3, GPT-2, GPT-BigCode)
  moe_rows.py  the mixture-of-experts families' tables (Mixtral, Qwen2/3-MoE, OLMoE, DeepSeek-V3)
  gpt_oss.py GPT-OSS's table: sinks, the biased router, the fused interleaved gate/up experts
  load.py    ``plait train --init-from DIR``: each rank checks the checkpoint against its model and
             fills the parameters it holds (``init_from_hf``, ``load_hf_weights``)
  numerics.py  whether the checkpoint's config.json computes the model being trained, without torch
             (``check_init_from``: the launcher's check, before any rank starts)
  export.py  ``plait export``: a plait (DCP) checkpoint as a Hugging Face model directory (its
             one-process checkpoint reading is also ``plait generate``'s)
  tokenizer.py  what makes an export self-contained: the tokenizer files (copied, or the byte
             tokenizer's written), the special token ids, ``generation_config.json``
"""
