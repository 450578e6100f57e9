"""GPU or CPU: the one decision, for the launcher and the ranks alike (torch imported only when asked).

It stands beside ``plait.run.env`` (the rank's environment) so that rank code (the trainer, the
worker, the profiler's worker) imports nothing from ``plait.run.launcher``.

``uses_gpu`` is what ``plait train``'s preflight and every worker call to decide between the
GPU and the CPU; ``rank_device`` is the worker's device from it. ``local_accelerator`` and
``gpu_from_device_name`` name this machine's GPU and the GpuSpec preset it is.
"""

from __future__ import annotations

from plait.errors import PlaitError

# Device names (as torch.cuda.get_device_name prints them) that identify one GPU spec without
# doubt. Anything else needs --gpu: a wrong guess could put MFU over 100%.
DEVICE_NAMES = (
    (("h100", "hbm3"), "h100-sxm"),
    (("h100", "sxm"), "h100-sxm"),
    (("h200",), "h200"),
    (("a100", "80gb"), "a100-80g"),
    (("a100", "40gb"), "a100-40g"),
    (("b200",), "b200"),
)


def gpu_from_device_name(name: str) -> str | None:
    """The GpuSpec preset that a CUDA device name identifies, or None when unsure."""
    lowered = name.lower()
    for words, preset in DEVICE_NAMES:
        if all(word in lowered for word in words):
            return preset
    return None


def local_accelerator() -> str | None:
    """The CUDA device name of this machine's GPU 0, or None without a GPU."""
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def uses_gpu(device: str) -> bool:
    """Whether a run asked to run on ``device`` ("auto", "cuda" or "cpu") uses this machine's GPUs.

    "auto" means a GPU when torch sees one. Raises PlaitError for "cuda" on a machine without one.
    """
    if device == "cpu":
        return False
    import torch

    available = torch.cuda.is_available()
    if device == "cuda" and not available:
        raise PlaitError("--device cuda but torch sees no GPU on this machine")
    return available


def rank_device(device: str, local_rank: int):
    """The ``torch.device`` of the process with ``local_rank`` on its node: ``cuda:<local_rank>``
    (made the current CUDA device) when ``uses_gpu(device)``, else the CPU."""
    import torch

    if not uses_gpu(device):
        return torch.device("cpu")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)
