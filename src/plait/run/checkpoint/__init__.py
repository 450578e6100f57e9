"""Training state on disk: the checkpoint format (store, no torch), saving and loading with
torch.distributed.checkpoint (dcp), and which checkpoint a run resumes from (select); ``hf/``
is the Hugging Face interchange (``--init-from`` and ``plait export``)."""
