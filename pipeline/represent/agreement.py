"""Agreement between two clusterings of the same documents (Diversity-ordered training's shallow-vs-deep check).

Adjusted Rand Index (ARI; 1 = identical partitions up to relabeling, ~0 = chance agreement) and
normalized mutual information (NMI, arithmetic normalization; 1 = identical, 0 = independent).
Diversity-ordered training's reading: ARI < 0.3 means the two representations produce very different clusterings,
so the richer (deep) one is likely worth its cost; we report ARI >= 0.3 as shared structure.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import polars as pl

from pipeline.errors import StrataInputError

DIFFERENT_STRUCTURE_ARI = 0.3


def _agreement(a: np.ndarray, b: np.ndarray) -> dict:
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    a, b = np.asarray(a).ravel(), np.asarray(b).ravel()
    if a.size != b.size or a.size == 0:
        raise StrataInputError(f"the labelings cover {a.size} and {b.size} documents",
                               fix="compare two non-empty labelings of the same documents")
    return {
        "ari": float(adjusted_rand_score(a, b)),
        "nmi": float(normalized_mutual_info_score(a, b)),
        "documents": int(a.size),
    }


def compare(a: np.ndarray, b: np.ndarray) -> dict:
    """ARI, NMI, cluster counts and Diversity-ordered training's reading for two labelings of the same documents."""
    out = _agreement(a, b)
    out["clusters_a"], out["clusters_b"] = int(np.unique(a).size), int(np.unique(b).size)
    out["reading"] = reading(out["ari"])
    return out


def reading(ari: float) -> str:
    if ari < DIFFERENT_STRUCTURE_ARI:
        return f"different structure (ARI < {DIFFERENT_STRUCTURE_ARI}): the representations group documents differently"
    return f"shared structure (ARI >= {DIFFERENT_STRUCTURE_ARI}): the representations group documents alike"


def label_agreement(assign: np.ndarray, labels: np.ndarray | list) -> dict:
    """ARI/NMI of a clustering against ground-truth labels (e.g. the demo corpus's domains)."""
    labels = np.asarray(labels)
    out = _agreement(assign, labels)
    out["clusters"], out["labels"] = int(np.unique(assign).size), int(np.unique(labels).size)
    return out


def load_labels(path: str | os.PathLike) -> np.ndarray:
    """Cluster labels by doc_id from ``clusters.parquet`` (doc_id, cluster) or a 1-D integer ``.npy``."""
    path = Path(path)
    if not path.is_file():
        raise StrataInputError("clustering file not found", path=path, fix="pass a clusters.parquet or a .npy label array")
    if path.suffix == ".npy":
        try:
            arr = np.load(path, allow_pickle=False)
        except ValueError as exc:
            raise StrataInputError(f"not a plain .npy array ({exc})", path=path,
                                   fix="save labels with np.save of an integer array") from exc
        if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
            raise StrataInputError(f"expected a 1-D integer label array, got {arr.dtype} {arr.shape}", path=path,
                                   fix="save one integer cluster per document")
        return arr.astype(np.int64)
    if path.suffix != ".parquet":
        raise StrataInputError("unknown clustering file type", path=path, fix="use .parquet (doc_id, cluster) or .npy")
    df = pl.read_parquet(path)
    missing = {"doc_id", "cluster"} - set(df.columns)
    if missing:
        raise StrataInputError(f"missing column(s) {sorted(missing)}", path=path,
                               fix="use the clusters asset's clusters.parquet (doc_id, cluster)")
    df = df.sort("doc_id")
    if not np.array_equal(df["doc_id"].to_numpy(), np.arange(df.height)):
        raise StrataInputError("doc_id is not 0..N-1 without gaps or repeats", path=path,
                               fix="write one row per document with dense doc_id")
    return df["cluster"].to_numpy()
