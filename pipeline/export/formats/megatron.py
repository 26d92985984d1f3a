"""``megatron``: Megatron-LM's indexed dataset with its GPTDataset index cache (``pipeline/export/megatron.py``)."""

from __future__ import annotations

from pipeline.export.formats import ExportFormat
from pipeline.export.megatron import export_megatron


def write(stream, out, meta, *, global_batch, world_size, progress=None, previous=None, writers=None):
    return export_megatron(stream, out, meta, progress=progress, previous=previous, writers=writers)


SPECS = (ExportFormat("megatron", "Megatron-LM indexed dataset (.bin/.idx) and the GPTDataset index cache that keeps the order", write,
                      extends=True, stretches=True),)
