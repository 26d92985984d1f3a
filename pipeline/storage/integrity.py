"""Inputs verified before they are used: an artifact's bytes against the SHA-256 recorded when Strata
wrote it (``pipeline/storage/atomic.py``), and an ordering against what it must be.

A one-byte flip keeps a file's size and modification time, so neither is evidence: what exports and
orderings read is hashed again and compared with the recorded digest (the sidecar ``.<name>.sha256``
beside the file, which travels with a copy of the data root; for token shards also the ``sha256``
column of the store's index).
A mismatch is a StrataInputError naming the file and the asset to rematerialize, never a new truth.
A per-shard stage checks the same before it reuses a shard's artifact (:func:`intact`) and computes
a changed one again. Each file is read once per process (:func:`pipeline.storage.atomic.verify_sha256`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterable

import numpy as np
import polars as pl

from pipeline.errors import StrataInputError
from pipeline.storage.atomic import SIDECAR_SUFFIX, record_mismatch, sidecar_of, verify_sha256
from pipeline.storage.layout import BOOKKEEPING

# the asset that rewrites each verified input: the fix a mismatch names
_PRODUCERS = {"segments.parquet": "sequences", "meta.json": "sequences", "runs.parquet": "tokens", "doc_offsets.npy": "tokens",
              "documents.parquet": "tokens", "clusters.parquet": "clusters"}


def _fix(asset: str) -> str:
    return (f"rematerialize {asset} and what depends on it (strata run --config ... --select '{asset}*'), "
            "or restore the file; the corrupt bytes are not used")


def verify_file(path: Path, asset: str, expected: str | None = None) -> None:
    if Path(path).is_file():
        verify_sha256(path, expected, fix=_fix(asset))


def intact(paths: Iterable[Path]) -> bool:
    """Whether every path is a file whose bytes are those Strata recorded when it wrote it (a file
    with no recorded digest counts as intact): what a per-shard stage checks before it reuses a
    shard's artifact instead of computing it. A changed file is logged as a warning naming it and
    reported not intact, so the stage computes it again and the rewrite replaces it."""
    paths = [Path(p) for p in paths]
    if not all(p.is_file() for p in paths):
        return False
    for path in paths:
        try:
            verify_sha256(path)
        except StrataInputError as err:
            logging.getLogger(__name__).warning("%s: %s; computing it again", path, err.problem)
            return False
    return True


def verify_token_store(layout) -> None:
    """The token store's index and every shard file it names, each against its recorded digest (the
    shard's digest record and the ``sha256`` the index holds for it)."""
    verify_file(layout.tokens, "tokens")
    verify_file(layout.doc_offsets, "tokens")
    if not layout.tokens.is_file():
        return
    frame = pl.read_parquet(layout.tokens, columns=["path", "sha256"]).unique("path").sort("path")
    for rel, digest in frame.iter_rows():
        verify_file(layout.tokens.parent / rel, "token_shards", digest or None)


def verify_ordering_inputs(layout) -> None:
    """What ``orderings`` reads: the base packing, its meta, the documents and their clusters."""
    for path in (layout.segments, layout.sequences_meta, layout.documents, layout.clusters):
        verify_file(path, _PRODUCERS[path.name])


def verify_export_inputs(layout, strategy: str) -> None:
    """What an export reads: the ordering, the segments it refers to, the packing's meta and the token store."""
    verify_file(layout.ordering(strategy), f"orderings[{strategy}]")
    verify_file(layout.ordering_segments(strategy), f"orderings[{strategy}]")
    verify_file(layout.ordering_mixture(strategy), f"orderings[{strategy}]")
    verify_file(layout.segments, "sequences")
    verify_file(layout.sequences_meta, "sequences")
    verify_token_store(layout)


def failing_digests(root: Path) -> dict[str, tuple[str, str]]:
    """Every file under the data root ``root`` whose bytes are not those Strata recorded when it wrote
    it (its sidecar, ``pipeline/storage/atomic.py``), by path relative to the root: ``(recorded,
    now)`` SHA-256 digests. Reads every recorded file (a flipped byte keeps size and modification time);
    the runs' bookkeeping (Dagster's storage) is left out. What ``strata status`` reports."""
    root = Path(root)
    bad = {}
    for record in sorted(root.rglob(f".*{SIDECAR_SUFFIX}")):
        path = sidecar_of(record)
        rel = path.relative_to(root)
        if rel.parts[0] in BOOKKEEPING or not path.is_file():
            continue
        found = record_mismatch(path)
        if found is not None:
            bad[rel.as_posix()] = found
    return bad


def check_order(order: np.ndarray, n_sequences: int, path: Path, schedule: bool = False) -> None:
    """``order`` must be a permutation of the ``n_sequences`` sequence ids (a ``schedule``, which may
    repeat or omit sequences, must only name ids in range); else a StrataInputError naming ``path``."""
    order = np.asarray(order)
    fix = "rematerialize the ordering (strata run --select 'orderings'), or restore the file"
    if order.size and (order.min() < 0 or order.max() >= n_sequences):
        bad = int(order[(order < 0) | (order >= n_sequences)][0])
        raise StrataInputError(f"the ordering names sequence {bad}, outside the packing's {n_sequences} sequences", path=path, fix=fix)
    if schedule:
        return
    if order.size != n_sequences:
        raise StrataInputError(f"the ordering has {order.size} positions for {n_sequences} sequences: not a permutation",
                               path=path, fix=fix)
    counts = np.bincount(order, minlength=n_sequences)
    if (counts != 1).any():
        twice = int(np.flatnonzero(counts > 1)[0])
        raise StrataInputError(f"the ordering is not a permutation: sequence {twice} appears {int(counts[twice])} times and "
                               f"{int((counts == 0).sum())} sequences are missing", path=path, fix=fix)
