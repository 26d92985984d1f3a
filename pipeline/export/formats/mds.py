"""``mds``: MosaicML streaming shards laid out for a world size (``pipeline/export/mds.py``)."""

from __future__ import annotations

from pipeline.export.formats import ExportFormat
from pipeline.export.mds import export_mds


def write(stream, out, meta, *, global_batch, world_size, progress=None):
    return export_mds(stream, out, meta, global_batch=global_batch, world_size=world_size, progress=progress)


SPECS = (ExportFormat("mds", "MosaicML streaming (MDS) shards, laid out for export.world_size ranks", write, reads=("export.world_size",)),)
