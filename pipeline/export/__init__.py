"""Export an ordering to the trainers people use, in exactly Strata's order.

The order is *which sequences form global batch b, and in which order the batches come*
(``batches.py``). The formats are the registry of ``formats/`` (one module each: ``numpy``,
``megatron``, ``mds``, ``hf``, and any plugin's); ``torch_dataset`` reads a ``numpy`` export for
custom trainers. Every writer streams chunk by chunk; the output directory appears atomically
(``writer.py``). Names resolve on first use, so ``import pipeline.export`` alone imports none of
its modules.
"""

from __future__ import annotations

import importlib
from typing import Any

from pipeline.export.formats import REGISTRY

_WHERE = {"export_ordering": "writer", "export_stream": "writer", "OrderedStream": "stream", "open_stream": "stream",
          "stream_from_arrays": "stream"}

__all__ = ["FORMATS", *sorted(_WHERE)]


def __getattr__(name: str) -> Any:
    if name == "FORMATS":  # the registry's format names

        return REGISTRY.names()
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
