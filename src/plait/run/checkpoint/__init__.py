"""Training state on disk.

  store.py        the checkpoint format: manifest, checksums, atomic directories (no torch)
  dcp.py          saving and loading with torch.distributed.checkpoint
  safe_reader.py  DCP metadata read with a restricted unpickler (no arbitrary classes)
  select.py       which checkpoint a run resumes from
  lock.py         one live run per checkpoint directory (token, workers, takeover)
  hf/             the Hugging Face interchange (--init-from and plait export)
"""
