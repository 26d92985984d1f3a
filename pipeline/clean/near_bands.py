"""Near duplicates without one index: the LSH bands of the stored MinHash signatures split into
groups, each group a task on the configured engine (``near_band_tasks``; docs/cleaning.md).

The gather's default (:func:`pipeline.clean.stage._near_pairs`) cuts every band key of every
document in its own process. Here each task reads, for the documents the driver lists, only its
bands' columns of every shard's signature file (plain reads, a span of rows at a time, so the
file's pages are never this process's memory), sorts the keys band by band
(:func:`pipeline.clean.near.lsh_pairs`, the default's code) and verifies each candidate by the
signatures' Jaccard estimate, reading whole signatures of the candidates alone (plain reads too). A
pair that also shares a bucket in an earlier band (of an earlier group) is left to that group, so
the groups' pairs are disjoint and their union is the default's pairs, exactly: the same buckets,
the same check. With more tasks than bands each band is a task per key part (``key % parts``):
a bucket is one part's whole, so the pairs are the same, and a task holds only the documents whose
key falls in its part (about ``1 / parts`` of them). A task writes its pairs under the data root's
work folder and returns the path; the driver holds the pairs, never a key.

The duplicate groups are the connected components of the pairs, each represented by its lowest
doc id (:func:`pipeline.clean.union_find.pair_components`, which :func:`pipeline.clean.groups.components`
runs whichever path found the pairs).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from pipeline.clean.near import EMPTY, band_keys, lsh_pairs
from pipeline.distributed.engine import map_tasks
from pipeline.distributed.shards import Shard
from pipeline.storage.atomic import write_npy

BATCH = 4096  # rows of a signature file read (and cut into band keys) at a time
VERIFY = 1 << 15  # pairs whose earlier bands are recomputed at a time


def band_groups(bands: int, tasks: int) -> list[tuple[int, int]]:
    """``bands`` LSH bands split into ``tasks`` contiguous groups (at most one a band), as (first, end)."""
    cuts = np.linspace(0, bands, min(max(int(tasks), 1), bands) + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(cuts[:-1], cuts[1:]) if b > a]


def band_jobs(bands: int, tasks: int) -> list[tuple[int, int, int, int]]:
    """The tasks as (first band, end band, key part, parts): up to ``bands`` tasks, the
    :func:`band_groups`; more, each band alone, its keys dealt into ``ceil(tasks / bands)`` parts by
    ``key % parts`` (a bucket's documents share a key, so each bucket is one part's whole)."""
    if int(tasks) <= bands:
        return [(a, b, 0, 1) for a, b in band_groups(bands, tasks)]
    parts = -(-int(tasks) // bands)
    return [(b, b + 1, k, parts) for b in range(bands) for k in range(parts)]


def _npy_layout(path: str) -> tuple[int, tuple[int, ...], np.dtype]:
    """Where a 2-D C-order ``.npy`` file's data starts, its shape and dtype."""
    with open(path, "rb") as fh:
        version = np.lib.format.read_magic(fh)
        header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = header(fh)
        if fortran or len(shape) != 2:
            raise ValueError(f"{path}: a signature file is a 2-D array in C order")
        return fh.tell(), shape, dtype


class _Members:
    """The documents a task compares: doc ids ascending, each one's signature file (shard) and row in
    it; signatures read (plain reads, never memory-mapped: a mapped page's neighbours would count in
    the task's memory too) for the documents asked alone."""

    def __init__(self, sig_files: Sequence[str], keys: np.ndarray, shard: np.ndarray, rows: np.ndarray):
        self.files, self.layout = list(sig_files), [_npy_layout(f) for f in sig_files]
        self.keys, self.shard, self.rows = keys, shard, rows

    def fetch(self, positions: np.ndarray, cols: slice = slice(None)) -> np.ndarray:
        """Columns ``cols`` of the signatures of the members at ``positions`` (any order)."""
        positions = np.asarray(positions, np.int64)
        which = self.shard[positions]
        width = self.layout[0][1][1] if self.layout else 0
        out = np.empty((positions.size, width), np.uint32)
        for j in np.unique(which):
            at = np.flatnonzero(which == j)
            start, shape, dtype = self.layout[j]
            size = shape[1] * dtype.itemsize
            fd = os.open(self.files[j], os.O_RDONLY)
            try:
                data = b"".join(os.pread(fd, size, start + r * size) for r in self.rows[positions[at]].tolist())
            finally:
                os.close(fd)
            out[at] = np.frombuffer(data, dtype).reshape(at.size, shape[1])
        return out[:, cols]


def _row_blocks(sig_file: str, rows: np.ndarray, cols: slice) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(positions in ``rows``, their signatures' columns ``cols``) of a signature file, rows ascending,
    a span of at most :data:`BATCH` file rows at a time, read with plain reads: the file's pages stay
    in the page cache, never in this process's memory (a memory map would count every page read)."""
    start, shape, dtype = _npy_layout(sig_file)
    size, a = shape[1] * dtype.itemsize, 0
    with open(sig_file, "rb") as fh:
        while a < rows.size:
            b = int(np.searchsorted(rows, rows[a] + BATCH, side="left"))
            r0, r1 = int(rows[a]), int(rows[b - 1]) + 1
            fh.seek(start + r0 * size)
            block = np.frombuffer(fh.read((r1 - r0) * size), dtype).reshape(r1 - r0, shape[1])
            yield np.arange(a, b), block[rows[a:b] - r0][:, cols]
            a = b


def _band_members(shards: Sequence[tuple[str, str]], first: int, end: int, rows: int, part: int, parts: int
                  ) -> tuple[_Members, np.ndarray]:
    """The members that take part in bands ``first .. end`` (a real signature; with ``parts`` > 1, the
    one band's key in ``part``) and their band keys, read shard by shard: what the task holds is
    these members' alone."""
    cols, keep, keyed = slice(first * rows, end * rows), [], []
    for j, (sig, members) in enumerate(shards):
        m = np.load(members, allow_pickle=False).reshape(-1, 2)
        order = np.argsort(m[:, 1], kind="stable")  # rows ascending (they are, as _members_file writes them)
        for at, block in _row_blocks(sig, m[order, 1], cols):
            real = ~(block == EMPTY).all(axis=1)
            maybe = np.flatnonzero(~real)  # these bands empty: is the whole signature (an empty text's)?
            if maybe.size:
                whole = np.concatenate([b for _, b in _row_blocks(sig, m[order[at[maybe]], 1], slice(None))])
                real[maybe] = ~(whole == EMPTY).all(axis=1)
            k = band_keys(block, end - first, rows)
            if parts > 1:
                real &= (k[:, 0] % np.uint64(parts)) == np.uint64(part)
            idx = order[at[real]]
            keep.append(np.column_stack([m[idx, 0], np.full(idx.size, j), m[idx, 1]]))
            keyed.append(k[real])
    kept = np.concatenate(keep) if keep else np.zeros((0, 3), np.int64)
    by_doc = np.argsort(kept[:, 0], kind="stable")
    members = _Members([sig for sig, _ in shards], kept[by_doc, 0], kept[by_doc, 1], kept[by_doc, 2])
    return members, (np.concatenate(keyed) if keyed else np.zeros((0, end - first), np.uint64))[by_doc]


def band_group_pairs(shards: Sequence[tuple[str, str]], first: int, end: int, rows: int, threshold: float, out: str,
                     part: int = 0, parts: int = 1) -> str:
    """A task: the near pairs that share a bucket in bands ``first .. end`` (and in no earlier band)
    among the members of ``shards`` ((signature file, members file) each, in doc order), with
    ``parts`` > 1 (one band) only the buckets whose key is ``part`` modulo ``parts``, written to
    ``out`` as (k, 2) int64 (earlier doc id, later), sorted, with the number of candidates compared
    in ``<out>.candidates.npy``; returns ``out``."""
    m, keyed_all = _band_members(shards, first, end, rows, part, parts)
    pairs, candidates = lsh_pairs(m.keys, keyed_all, m.fetch, threshold)
    del keyed_all
    if first and pairs.size:  # a pair sharing an earlier band's bucket is an earlier group's
        mine = np.ones(pairs.shape[0], bool)
        for at in range(0, pairs.shape[0], VERIFY):
            chunk = pairs[at:at + VERIFY]
            sa, sb = (m.fetch(np.searchsorted(m.keys, chunk[:, c]), slice(0, first * rows)) for c in (0, 1))
            mine[at:at + VERIFY] = ~(band_keys(sa, first, rows) == band_keys(sb, first, rows)).any(axis=1)
        pairs = pairs[mine]
    write_npy(np.array([candidates], np.int64), f"{out}.candidates.npy")
    write_npy(np.ascontiguousarray(pairs, np.int64), out)
    return out


def _members_file(scan, exact_rep: np.ndarray, path: Path) -> tuple[str, str]:
    """The scan's exact representatives as (doc id, row of its signature file), written to ``path``."""
    local = np.flatnonzero(exact_rep[scan.start:scan.start + scan.n] == np.arange(scan.start, scan.start + scan.n))
    rows = local if scan.rows is None else np.asarray(scan.rows, np.int64)[local]
    write_npy(np.column_stack([scan.start + local, rows]).astype(np.int64), path)
    return str(scan.files["sig"]), str(path)


def band_near_pairs(scans: Sequence, exact_rep: np.ndarray, num_perm: int, rows: int, threshold: float, tasks: int,
                    work_dir: Path, engine: str = "local", ray_cfg: Any = None) -> tuple[np.ndarray, int]:
    """Near pairs among the exact representatives ``exact_rep[i] == i`` of ``scans`` (their stored
    signatures), as the gather's one index finds them (:func:`pipeline.clean.stage._near_pairs`),
    from ``tasks`` groups of bands, each a task (:func:`band_group_pairs`) on ``engine``; the pairs
    sorted and the candidates compared (a pair is counted in each group where it is a candidate)."""
    groups = band_jobs(int(num_perm) // int(rows), tasks)
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="near-bands-", dir=work_dir))
    try:
        exact_rep = np.asarray(exact_rep, np.int64)
        shards = [_members_file(scan, exact_rep, work / f"members{j:05d}.npy") for j, scan in enumerate(scans) if scan.n]
        outs = [work / f"pairs{g:04d}.npy" for g in range(len(groups))]
        jobs = [Shard(f"near bands {a}-{b - 1} part {k} of {parts}", (shards, a, b, int(rows), float(threshold), str(out), k, parts),
                      (Path(f"{out}.candidates.npy"), out)) for (a, b, k, parts), out in zip(groups, outs)]
        retries = ray_cfg.max_retries if ray_cfg is not None else 3
        map_tasks(band_group_pairs, jobs, engine=engine, ray_cfg=ray_cfg, workers=max(1, min(len(jobs), len(os.sched_getaffinity(0)))),
                  retries=retries)
        found = [np.load(out, allow_pickle=False) for out in outs]
        candidates = sum(int(np.load(f"{out}.candidates.npy")[0]) for out in outs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    pairs = np.concatenate(found) if found else np.zeros((0, 2), np.int64)
    return (np.unique(pairs, axis=0) if pairs.size else pairs.reshape(0, 2)).astype(np.int64), candidates


def near_by_bands(layout, params, scans: Sequence, exact_rep: np.ndarray) -> tuple[np.ndarray, int]:
    """The clean gather's :func:`band_near_pairs` (``params``: its CleanParams), in ``near_band_tasks``
    tasks under the data root's ``work/clean/``."""
    d = params.dedup
    return band_near_pairs(scans, exact_rep, d.near_num_perm, d.near_rows, d.near_threshold, params.near_band_tasks,
                           layout.inside("work", "clean"), engine=params.engine, ray_cfg=params.ray)
