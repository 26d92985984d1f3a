"""Exact and semantic duplicates without the gather holding their inputs: the hash space in ranges
and the clusters in groups, each a task on the configured engine (``clean_tasks``; docs/cleaning.md).

The gather's default reads every shard's normalized-text hashes into its own process
(:func:`pipeline.clean.stage._exact_representatives`) and searches every cluster there
(:func:`pipeline.clean.stage.semantic_candidates`). With ``clean_tasks: N``:

- **exact**: the 64-bit hash space is cut into N equal ranges; a task reads every shard's stored
  ``hashes.npy`` (memory-mapped, a batch of rows at a time), keeps its range's (hash, doc id) and
  writes, for each document whose hash an earlier document holds, (doc id, that first doc id). A
  hash lies in one range, so the ranges' pairs are disjoint, and a document in no pair is its own
  representative: the driver's answer is :func:`pipeline.clean.exact.exact_representatives`'
  exactly, and it never holds a hash.
- **semantic**: the clusters holding two or more near representatives are dealt into N groups
  balanced by their work (the sum of the squared cluster sizes, largest first onto the lightest
  group); a task reads its documents' embeddings through the embedding index
  (:func:`pipeline.represent.embedding_index.open_embeddings`) and runs
  :func:`pipeline.clean.semantic.semantic_pairs` (``forest``) on its clusters, the default's code on
  the same rows. The driver puts the groups' pairs back in cluster order: the default's pairs, in
  the default's order.

A task writes its files under the data root's work folder and returns the path; only paths travel
back, and the folder is removed once the driver has read the pairs.
"""

from __future__ import annotations

import heapq
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from pipeline.clean.semantic import semantic_pairs
from pipeline.distributed.engine import map_tasks
from pipeline.distributed.shards import Shard
from pipeline.represent.embedding_index import open_embeddings
from pipeline.storage.atomic import write_npy

BATCH = 1 << 20  # hashes of a shard read (and filtered to a range) at a time
SPACE = 1 << 64  # the normalized-text hashes are uint64


def hash_ranges(tasks: int) -> list[tuple[int, int]]:
    """The uint64 hash space in ``tasks`` equal ranges, as (first, last) inclusive."""
    p = max(int(tasks), 1)
    cuts = [SPACE * i // p for i in range(p + 1)]
    return [(a, b - 1) for a, b in zip(cuts[:-1], cuts[1:])]


def hash_range_pairs(shards: Sequence[tuple[str, str, int]], first: int, last: int, out: str) -> str:
    """A task: for the documents of ``shards`` ((hashes file, rows file or "" for every row, first
    doc id) each, in doc order) whose hash lies in ``first .. last``, (doc id, the first doc id with
    its hash) of each document that is not that first one, written to ``out`` as (k, 2) int64 sorted
    by doc id; returns ``out``."""
    lo, hi = np.uint64(first), np.uint64(last)
    hashes, docs = [], []
    for path, rows_path, start in shards:
        arr = np.load(path, mmap_mode="r")
        rows = np.load(rows_path, allow_pickle=False) if rows_path else None
        n = arr.shape[0] if rows is None else rows.size
        for a in range(0, n, BATCH):
            h = np.asarray(arr[a:a + BATCH] if rows is None else arr[rows[a:a + BATCH]], np.uint64)
            at = np.flatnonzero((h >= lo) & (h <= hi))
            hashes.append(h[at])
            docs.append(int(start) + a + at)
    h = np.concatenate(hashes) if hashes else np.zeros(0, np.uint64)
    d = np.concatenate(docs).astype(np.int64) if docs else np.zeros(0, np.int64)
    order = np.argsort(h, kind="stable")  # equal hashes keep doc order: the first is the representative
    h, d = h[order], d[order]
    head = np.ones(h.size, bool)
    head[1:] = h[1:] != h[:-1]
    rep = d[np.flatnonzero(head)][np.cumsum(head) - 1]
    dup = np.flatnonzero(rep != d)
    pairs = np.column_stack([d[dup], rep[dup]]).astype(np.int64).reshape(-1, 2)
    write_npy(np.ascontiguousarray(pairs[np.argsort(pairs[:, 0], kind="stable")]), out)
    return out


def _run(fn, jobs: list[Shard], engine: str, ray_cfg: Any) -> None:
    """``jobs`` on ``engine``: worker processes (as many at once as cores) or Ray tasks, a dead one retried."""
    retries = ray_cfg.max_retries if ray_cfg is not None else 3
    map_tasks(fn, jobs, engine=engine, ray_cfg=ray_cfg, workers=max(1, min(len(jobs), len(os.sched_getaffinity(0)))), retries=retries)


def _hash_files(scan, path: Path) -> tuple[str, str, int]:
    """The scan's hashes file, the file of its gathered rows (written to ``path``; "" when every row is), its first doc id."""
    rows = ""
    if scan.rows is not None:
        rows = str(write_npy(np.asarray(scan.rows, np.int64), path))
    return str(scan.files["hashes"]), rows, int(scan.start)


def exact_by_hash_ranges(scans: Sequence, n: int, tasks: int, work_dir: Path, engine: str = "local",
                         ray_cfg: Any = None) -> np.ndarray:
    """Each of the ``n`` documents of ``scans``' exact representative (the first document with its
    normalized-text hash, :func:`pipeline.clean.exact.exact_representatives`' answer), from
    ``tasks`` ranges of the hash space, each a task (:func:`hash_range_pairs`) on ``engine``."""
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="exact-ranges-", dir=work_dir))
    out_rep = np.arange(n, dtype=np.int64)
    try:
        shards = [_hash_files(scan, work / f"rows{j:05d}.npy") for j, scan in enumerate(scans) if scan.n]
        ranges = hash_ranges(tasks)
        outs = [work / f"exact{r:04d}.npy" for r in range(len(ranges))]
        _run(hash_range_pairs, [Shard(f"exact hashes {r}/{len(ranges)}", (shards, a, b, str(out)), (out,))
                                for r, ((a, b), out) in enumerate(zip(ranges, outs))], engine, ray_cfg)
        for out in outs:
            pairs = np.load(out, allow_pickle=False)
            out_rep[pairs[:, 0]] = pairs[:, 1]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out_rep


def cluster_groups(sizes: np.ndarray, tasks: int) -> list[np.ndarray]:
    """The clusters with two or more documents (``sizes[c]``: cluster c's) dealt into at most
    ``tasks`` groups balanced by work (a cluster's is its size squared): largest first, each onto
    the group with the least work so far (ties: the lower group, the lower cluster first). Each
    group's clusters ascending; empty groups left out."""
    sizes = np.asarray(sizes, np.int64)
    searched = np.flatnonzero(sizes >= 2)
    p = min(max(int(tasks), 1), searched.size)
    if not p:
        return []
    heap = [(0, g) for g in range(p)]
    members: list[list[int]] = [[] for _ in range(p)]
    for c in searched[np.lexsort((searched, -sizes[searched]))].tolist():
        work, g = heapq.heappop(heap)
        members[g].append(c)
        heapq.heappush(heap, (work + int(sizes[c]) ** 2, g))
    return [np.sort(np.array(m, np.int64)) for m in members if m]


def cluster_group_pairs(members: str, embeddings: str, threshold: float, out: str) -> str:
    """A task: SemDeDup (:func:`pipeline.clean.semantic.semantic_pairs`, ``forest``) among the
    documents of ``members`` ((doc id, cluster) rows, doc ids ascending), their embeddings read
    through the index ``embeddings`` (its ``runs.parquet``); writes ``out`` as (k, 3) int64
    (cluster, lower doc id, higher) in the order the clusters are searched, and the largest
    cluster searched in ``<out>.largest.npy``; returns ``out``."""
    m = np.load(members, allow_pickle=False).reshape(-1, 2)
    docs, labels = m[:, 0], m[:, 1]
    emb = open_embeddings(embeddings)
    pos, largest = semantic_pairs(lambda at: emb.take(docs[at]), labels, np.arange(docs.size, dtype=np.int64), threshold, forest=True)
    found = np.column_stack([labels[pos[:, 1]], docs[pos[:, 0]], docs[pos[:, 1]]]).astype(np.int64).reshape(-1, 3)
    write_npy(np.array([largest], np.int64), f"{out}.largest.npy")
    write_npy(np.ascontiguousarray(found), out)
    return out


def semantic_by_cluster_groups(embeddings: str | Path, cluster: np.ndarray, survivors: np.ndarray, threshold: float, tasks: int,
                               work_dir: Path, engine: str = "local", ray_cfg: Any = None) -> tuple[np.ndarray, int]:
    """SemDeDup among ``survivors`` (sorted doc ids) within their clusters (``cluster[doc]``), as
    :func:`pipeline.clean.semantic.semantic_pairs` with ``forest`` gives it over all of them (the
    same pairs in the same order, and the largest cluster searched), from ``tasks`` groups of
    clusters (:func:`cluster_groups`), each a task (:func:`cluster_group_pairs`) on ``engine``."""
    survivors = np.asarray(survivors, np.int64)
    labels = np.asarray(cluster)[survivors].astype(np.int64)
    groups = cluster_groups(np.bincount(labels) if labels.size else np.zeros(0, np.int64), tasks)
    if not groups:
        return np.zeros((0, 2), np.int64), 0
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="semantic-groups-", dir=work_dir))
    try:
        jobs, outs = [], []
        for g, clusters in enumerate(groups):
            mine = np.isin(labels, clusters)
            members = write_npy(np.column_stack([survivors[mine], labels[mine]]).astype(np.int64), work / f"members{g:04d}.npy")
            out = work / f"semantic{g:04d}.npy"
            jobs.append(Shard(f"semantic clusters group {g}", (str(members), str(embeddings), float(threshold), str(out)),
                              (Path(f"{out}.largest.npy"), out)))
            outs.append(out)
        _run(cluster_group_pairs, jobs, engine, ray_cfg)
        found = np.concatenate([np.load(out, allow_pickle=False) for out in outs])
        largest = max(int(np.load(f"{out}.largest.npy")[0]) for out in outs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    found = found[np.argsort(found[:, 0], kind="stable")]  # cluster by cluster, as the one process searches them
    return np.ascontiguousarray(found[:, 1:]), largest


def clean_tasks_exact(layout, params, scans: Sequence, n: int) -> np.ndarray:
    """The clean gather's :func:`exact_by_hash_ranges` (``params``: its CleanParams) in ``clean_tasks`` tasks under ``work/clean/``."""
    return exact_by_hash_ranges(scans, n, params.clean_tasks, layout.inside("work", "clean"), engine=params.engine, ray_cfg=params.ray)


def clean_tasks_semantic(layout, params, cluster: np.ndarray, survivors: np.ndarray) -> tuple[np.ndarray, int]:
    """The clean gather's :func:`semantic_by_cluster_groups` in ``clean_tasks`` tasks under ``work/clean/``."""
    return semantic_by_cluster_groups(layout.embeddings, cluster, survivors, params.dedup.semantic_threshold, params.clean_tasks,
                                      layout.inside("work", "clean"), engine=params.engine, ray_cfg=params.ray)
