"""Where torch work runs: CUDA when present, else the CPU."""

from __future__ import annotations


def device() -> str:
    """``"cuda"`` when torch sees a GPU, else ``"cpu"``."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
