"""``numpy``: one raw flat token file in training order (nanoGPT, OLMo-core; ``pipeline/export/numpy_tokens.py``)."""

from __future__ import annotations

from pipeline.export.formats import ExportFormat
from pipeline.export.numpy_tokens import export_numpy


def write(stream, out, meta, *, global_batch, world_size, progress=None, previous=None, writers=None):
    return export_numpy(stream, out, meta, progress=progress, previous=previous, writers=writers)


SPECS = (ExportFormat("numpy", "raw flat tokens, seq_len per sequence in training order (nanoGPT, OLMo-core, torch_dataset)", write,
                      extends=True, stretches=True),)
