"""Near duplicates without one index: the LSH bands of the stored MinHash signatures split into
groups, each group a task on the configured engine (``near_band_tasks``; docs/cleaning.md).

The gather's default (:func:`pipeline.clean.stage._near_pairs`) cuts every band key of every
document in its own process. Here each task reads, for the documents the driver lists, only its
bands' columns of every shard's signature file (memory-mapped, a batch of rows at a time), sorts
the keys band by band (:func:`pipeline.clean.near.lsh_pairs`, the default's code) and verifies each
candidate by the signatures' Jaccard estimate, reading whole signatures of the candidates alone. A
pair that also shares a bucket in an earlier band (of an earlier group) is left to that group, so
the groups' pairs are disjoint and their union is the default's pairs, exactly: the same buckets,
the same check. A task writes its pairs under the data root's work folder and returns the path;
the driver holds the pairs, never a key.

The duplicate groups are the connected components of the pairs, each represented by its lowest
doc id (:func:`pipeline.clean.union_find.pair_components`, which :func:`pipeline.clean.groups.components`
runs whichever path found the pairs).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Sequence

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


class _Members:
    """The documents a task compares: per shard, (doc id, row of the shard's signature file), doc
    ids ascending across shards; the signatures memory-mapped."""

    def __init__(self, shards: Sequence[tuple[str, str]]):
        self.sigs = [np.load(sig, mmap_mode="r") for sig, _ in shards]
        parts = [np.load(members, allow_pickle=False).reshape(-1, 2) for _, members in shards]
        self.offsets = np.cumsum([0] + [p.shape[0] for p in parts])
        self.keys = np.concatenate([p[:, 0] for p in parts]) if parts else np.zeros(0, np.int64)
        self.rows = np.concatenate([p[:, 1] for p in parts]) if parts else np.zeros(0, np.int64)

    def fetch(self, positions: np.ndarray, cols: slice = slice(None)) -> np.ndarray:
        """Columns ``cols`` of the signatures of the members at ``positions`` (any order)."""
        positions = np.asarray(positions, np.int64)
        which = np.searchsorted(self.offsets, positions, side="right") - 1
        width = self.sigs[0][:, cols].shape[1] if self.sigs else 0
        out = np.empty((positions.size, width), np.uint32)
        for j in np.unique(which):
            at = np.flatnonzero(which == j)
            order = np.argsort(self.rows[positions[at]], kind="stable")
            out[at[order]] = self.sigs[j][self.rows[positions[at][order]], cols]
        return out


def band_group_pairs(shards: Sequence[tuple[str, str]], first: int, end: int, rows: int, threshold: float, out: str) -> str:
    """A task: the near pairs that share a bucket in bands ``first .. end`` (and in no earlier band)
    among the members of ``shards`` ((signature file, members file) each, in doc order), written to
    ``out`` as (k, 2) int64 (earlier doc id, later), sorted, with the number of candidates compared
    in ``<out>.candidates.npy``; returns ``out``."""
    m = _Members(shards)
    cols = slice(first * rows, end * rows)
    keep, keyed = [], []
    for j in range(len(m.sigs)):
        a0, a1 = int(m.offsets[j]), int(m.offsets[j + 1])
        for a in range(a0, a1, BATCH):
            pos = np.arange(a, min(a + BATCH, a1))
            block = m.fetch(pos, cols)
            real = ~(block == EMPTY).all(axis=1)
            maybe = np.flatnonzero(~real)  # these bands empty: is the whole signature (an empty text's)?
            if maybe.size:
                real[maybe] = ~(m.fetch(pos[maybe]) == EMPTY).all(axis=1)
            keep.append(pos[real])
            keyed.append(band_keys(block[real], end - first, rows))
    pos = np.concatenate(keep) if keep else np.zeros(0, np.int64)
    keyed_all = np.concatenate(keyed) if keyed else np.zeros((0, end - first), np.uint64)
    pairs, candidates = lsh_pairs(m.keys[pos], keyed_all, lambda p: m.fetch(pos[p]), threshold)
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
    groups = band_groups(int(num_perm) // int(rows), tasks)
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="near-bands-", dir=work_dir))
    try:
        exact_rep = np.asarray(exact_rep, np.int64)
        shards = [_members_file(scan, exact_rep, work / f"members{j:05d}.npy") for j, scan in enumerate(scans) if scan.n]
        outs = [work / f"pairs{g:04d}.npy" for g in range(len(groups))]
        jobs = [Shard(f"near bands {a}-{b - 1}", (shards, a, b, int(rows), float(threshold), str(out)),
                      (Path(f"{out}.candidates.npy"), out)) for (a, b), out in zip(groups, outs)]
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
