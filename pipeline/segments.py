"""Kernels over segment rows grouped by sequence (a packing's order), shared by packing, the
sequence features and the diagnostics: one pass, no per-row temporaries."""

from __future__ import annotations

import threading

import numba
import numpy as np
from numba import njit

from pipeline.threads import cores, parallel_map

CHUNKS_PER_THREAD = 4  # chunks of sequences differ in rows: a few a thread balance the load
MIN_CHUNK_ROWS = 1 << 16  # a chunk smaller than this costs more in scheduling than it saves


def n_chunks(rows: int) -> int:
    """Chunks of a parallel pass over ``rows`` rows: a few a thread, one for a small input."""
    return max(1, min(CHUNKS_PER_THREAD * numba.get_num_threads(), rows // MIN_CHUNK_ROWS))


_WARM: list = []


def warm_kernels() -> None:
    """Start loading numba (its compiler's context, the cached kernels' runtime and the parallel
    threading layer) on a thread of its own, once per process: the first kernel call of a process
    pays for it on one core, even for a cached kernel, and this overlaps that with the caller's
    reading. Later calls wait for it where they need it (numba's compiler lock)."""
    if not _WARM:
        thread = threading.Thread(target=_touch, args=(np.zeros(2, np.int64),), name="numba-warm", daemon=True)
        _WARM.append(thread)
        thread.start()


@njit(cache=True, parallel=True)
def _touch(x: np.ndarray) -> int:
    total = 0
    for i in numba.prange(x.size):
        total += x[i]
    return total


def even_cuts(n: int, chunks: int) -> np.ndarray:
    """``cuts[c]:cuts[c+1]`` (c < ``chunks``): ``range(n)`` in about equal parts."""
    return n * np.arange(chunks + 1, dtype=np.int64) // chunks


@njit(cache=True)
def grouped(seq: np.ndarray) -> bool:
    """Rows grouped by ascending sequence id (a packing's order, a composition's order)."""
    for i in range(1, seq.size):
        if seq[i] < seq[i - 1]:
            return False
    return True


@njit(cache=True)
def docs_per_sequence(seq: np.ndarray, doc: np.ndarray, n_sequences: int) -> np.ndarray:
    """Distinct documents of each sequence id, for rows :func:`grouped` by sequence."""
    out = np.zeros(n_sequences, np.int64)
    lo = 0
    while lo < seq.size:
        hi = lo + 1
        while hi < seq.size and seq[hi] == seq[lo]:
            hi += 1
        for i in range(lo, hi):
            new = True
            for j in range(lo, i):
                if doc[j] == doc[i]:
                    new = False
                    break
            if new:
                out[seq[lo]] += 1
        lo = hi
    return out


@njit(cache=True)
def insert_sorted(values: np.ndarray, lo: int, hi: int, v) -> None:
    """Insert ``v`` into the ascending ``values[lo:hi]`` (``values[hi]`` is free), shifting the
    larger ones right: a sequence's few distinct groups, kept sorted as they come."""
    j = hi
    while j > lo and values[j - 1] > v:
        values[j] = values[j - 1]
        j -= 1
    values[j] = v


def as_integers(values) -> np.ndarray:
    """An integer array as it is (no copy: a documents table's int32 columns stay int32), anything
    else (a polars Series, a float column of whole values) as int64."""
    out = values.to_numpy() if hasattr(values, "to_numpy") else np.asarray(values)
    return out if np.issubdtype(out.dtype, np.integer) else out.astype(np.int64)


def ids_by_key(key: np.ndarray, n_keys: int) -> np.ndarray:
    """The indices i with ``key[i] >= 0`` (keys below ``n_keys``), ordered by key and, within a key,
    ascending: ``np.flatnonzero(key >= 0)`` stably sorted by key, as a counting sort in chunks of
    indices on every core (each chunk counts its keys, then writes its indices from where the
    chunks before it end in each key)."""
    key = np.asarray(key)
    cuts = even_cuts(key.size, n_chunks(key.size))
    counts = _key_counts(key, int(n_keys), cuts)  # (chunks, keys)
    total = counts.sum(axis=0)
    start = (np.cumsum(total) - total)[None, :] + np.cumsum(counts, axis=0) - counts
    out = np.empty(int(total.sum()), np.int64)
    _key_place(key, cuts, start, out)
    return out


MIN_SORT_PART = 1 << 17  # values a part of :func:`stable_argsort` at least: below, one sort is as fast


def stable_argsort(values: np.ndarray) -> np.ndarray:
    """``np.argsort(values, kind="stable")`` for values without NaN, on every core: the values in
    one part a core, each sorted by NumPy on a thread of its own (its sort releases the GIL), then
    merged pairwise, the left part's index first among equal values, so the order is the stable one."""
    values = np.asarray(values)
    parts = min(cores(), values.size // MIN_SORT_PART)
    if parts < 2:
        return np.argsort(values, kind="stable")
    cuts = even_cuts(values.size, parts)
    runs = parallel_map(lambda c: np.argsort(values[cuts[c] : cuts[c + 1]], kind="stable") + cuts[c], list(range(parts)))
    while len(runs) > 1:  # each round merges neighbours, the merges of a round on threads of their own
        pairs = [(runs[i], runs[i + 1]) for i in range(0, len(runs) - 1, 2)]
        runs = parallel_map(lambda ab: _merge_runs(values, ab[0], ab[1]), pairs) + runs[len(pairs) * 2 :]
    return runs[0]


@njit(cache=True, nogil=True)
def _merge_runs(values, a, b):
    """Indices ``a`` then ``b`` (each sorted by value; every index of ``a`` below those of ``b``)
    merged by value, ``a``'s first among equal values."""
    out = np.empty(a.size + b.size, np.int64)
    i = j = k = 0
    while i < a.size and j < b.size:
        if values[b[j]] < values[a[i]]:
            out[k] = b[j]
            j += 1
        else:
            out[k] = a[i]
            i += 1
        k += 1
    out[k : k + a.size - i] = a[i:]
    k += a.size - i
    out[k:] = b[j:]
    return out


@njit(cache=True, parallel=True)
def _key_counts(key, n_keys, cuts):
    counts = np.zeros((cuts.size - 1, n_keys), np.int64)
    for c in numba.prange(cuts.size - 1):
        for i in range(cuts[c], cuts[c + 1]):
            if key[i] >= 0:
                counts[c, key[i]] += 1
    return counts


@njit(cache=True, parallel=True)
def _key_place(key, cuts, start, out):
    for c in numba.prange(cuts.size - 1):
        at = start[c].copy()
        for i in range(cuts[c], cuts[c + 1]):
            k = key[i]
            if k >= 0:
                out[at[k]] = i
                at[k] += 1
