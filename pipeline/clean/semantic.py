"""Semantic duplicates (SemDeDup, Abbas et al. 2023): within each k-means cluster, the pairs of
documents whose embeddings' cosine similarity exceeds a threshold, by a faiss range search over
that cluster's rows alone: the work is the sum of the clusters' squared sizes, the memory one
cluster's rows and its pairs, never all pairs of the corpus."""

from __future__ import annotations

import numpy as np

from pipeline.heavy import lazy

sparse = lazy("scipy.sparse")  # imported on first use (pipeline/heavy.py)
csgraph = lazy("scipy.sparse.csgraph")


def semantic_pairs(take, cluster: np.ndarray, docs: np.ndarray, threshold: float, chunk: int = 1024,
                   forest: bool = False) -> tuple[np.ndarray, int]:
    """(k, 2) pairs (lower doc id, higher) of the documents ``docs`` (sorted doc ids) with cosine
    similarity above ``threshold`` and the same ``cluster[doc]``; ``take(ids)`` gives the unit-norm
    embeddings of sorted doc ids. Also the largest cluster searched (rows).

    With ``forest``, each cluster's pairs are reduced as each chunk of queries is searched to one
    pair a grouped document, (the smallest doc id of its group, it): the same groups (connected
    components), in memory linear in the cluster's documents however many pairs it holds (a
    cluster of near-identical documents holds a number of pairs quadratic in its size)."""
    import faiss

    docs = np.asarray(docs, np.int64)
    by = np.argsort(np.asarray(cluster)[docs], kind="stable")
    labels = np.asarray(cluster)[docs][by]
    cuts = np.flatnonzero(np.diff(labels)) + 1
    found, largest = [], 0
    for ids in np.split(docs[by], cuts):
        if ids.size < 2:
            continue
        largest = max(largest, int(ids.size))
        x = np.ascontiguousarray(take(ids), dtype=np.float32)
        index = faiss.IndexFlatIP(x.shape[1])
        index.add(x)
        label = np.arange(ids.size, dtype=np.int64)  # with forest: each row's smallest row of its group so far
        for a in range(0, ids.size, chunk):
            lims, _, hit = index.range_search(x[a:a + chunk], float(threshold))
            query = np.repeat(np.arange(a, min(a + chunk, ids.size)), np.diff(lims).astype(np.int64))
            hit = hit.astype(np.int64)
            later = hit > query  # each pair once, never a row with itself
            if forest:
                label = _merge(label, query[later], hit[later])
            else:
                found.append(np.stack([ids[query[later]], ids[hit[later]]], axis=1))
        if forest:
            grouped = np.flatnonzero(label != np.arange(ids.size))
            found.append(np.stack([ids[label[grouped]], ids[grouped]], axis=1))
    return (np.concatenate(found) if found else np.zeros((0, 2), np.int64)), largest


def _merge(label: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Each row's smallest row among the rows ``label`` already joins it to and the pairs (a, b)."""
    if not a.size:
        return label
    m = label.size
    rows, cols = np.concatenate([np.arange(m), a]), np.concatenate([label, b])
    _, comp = csgraph.connected_components(sparse.coo_matrix((np.ones(rows.size, np.int8), (rows, cols)), shape=(m, m)), directed=False)
    first = np.full(int(comp.max()) + 1, m, np.int64)
    np.minimum.at(first, comp, np.arange(m, dtype=np.int64))
    return first[comp]
