"""Strata's pure library: every pipeline stage as plain functions (no Dagster imports).

Importing it sets one allocator default before polars loads: polars' jemalloc keeps freed pages
for a while by default, so already freed frames count in the peak of the whole-corpus stages
(sequences, orderings, diagnostics); ``dirty_decay_ms:0`` returns them to the system at once.
A ``_RJEM_MALLOC_CONF`` set by the user wins.
"""

import os

os.environ.setdefault("_RJEM_MALLOC_CONF", "dirty_decay_ms:0,muzzy_decay_ms:0")
