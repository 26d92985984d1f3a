"""The export formats' registry: one :class:`ExportFormat` per format, one module per format in
this folder, plugins through ``STRATA_PLUGINS`` (``pipeline/registry.py``).

A format's ``write(stream, out, meta, *, global_batch, world_size, progress)`` writes the ordered
stream (``pipeline.export.stream.OrderedStream``) into the empty directory ``out`` and returns
the files it wrote (a format with ``extends`` also takes ``previous=``, the export it extends:
``pipeline/export/extend.py``; a format with ``stretches`` takes ``writers=``, the workers that
write its flat files' stretches side by side: ``pipeline/export/stretches.py``); ``export_stream``
validates the batching, records ``meta`` (strategy, lineage, batching) and makes the directory
appear atomically. The config's ``export.formats``, ``strata export --format`` and the exports
asset's parameters derive from the registry.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from pipeline import registry
from pipeline.registry import Registry


@dataclass(frozen=True)
class ExportFormat:
    name: str
    description: str
    write: Callable[..., list[Path]]  # (stream, out, meta, *, global_batch, world_size, progress) -> files written
    reads: tuple[str, ...] = ()  # StrataConfig keys its files depend on beyond the exports asset's batching keys
    extends: bool = False  # write also takes previous= (pipeline/export/extend.py) and copies its kept prefix
    stretches: bool = False  # write also takes writers= (pipeline/export/stretches.py): byte ranges known from positions alone


REGISTRY: Registry[ExportFormat] = registry.EXPORT_FORMATS  # declared in pipeline/registry.py, where the config reads it


def reads() -> tuple[str, ...]:
    """The configuration keys the formats read, sorted."""
    return tuple(sorted({k for f in REGISTRY.entries().values() for k in f.reads}))
