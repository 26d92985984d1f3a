"""``hf``: Parquet for Hugging Face ``datasets`` and the Trainer (``pipeline/export/hf.py``)."""

from __future__ import annotations

from pipeline.export.formats import ExportFormat
from pipeline.export.hf import export_hf


def write(stream, out, meta, *, global_batch, world_size, progress=None):
    return export_hf(stream, out, meta, progress=progress)


SPECS = (ExportFormat("hf", "Parquet for Hugging Face datasets / the Trainer", write),)
