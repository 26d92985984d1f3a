"""Choosing the number of clusters k: silhouette vs k on a sample (Diversity-ordered training's calibration).

Diversity-ordered training sweeps k = 5..100 with k-means on a 10K random sample, scores each clustering by the
cosine silhouette, and recommends "the highest k within 5% of the peak": more clusters give the
ordering finer diversity categories, and the plateau says they are still real groupings. Here
the clustering is seeded faiss k-means (spherical, on L2-normalized embeddings, so it matches the
cosine metric); the cosine distances of the sample are computed once and reused for every k.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from pipeline.errors import StrataInputError
from pipeline.heavy import lazy

faiss = lazy("faiss")  # imported on first use (pipeline/heavy.py)
sklearn_metrics = lazy("sklearn.metrics")

DEFAULT_KS = (5, 10, 15, 20, 25, 30, 40, 50, 75, 100)


@dataclass(frozen=True)
class Calibration:
    """Silhouette per k on one seeded sample, and the recommended k."""

    ks: np.ndarray
    silhouettes: np.ndarray
    recommended_k: int
    sample_size: int
    seed: int

    def rows(self, strategy: str = "corpus") -> list[tuple[str, str, str, float]]:
        """Tidy rows (strategy, metric, setting, value) like ``pipeline.reports.diagnostics``."""
        out = [(strategy, "silhouette_vs_k", f"k={k};sample={self.sample_size};seed={self.seed}", float(s))
               for k, s in zip(self.ks, self.silhouettes)]
        out.append((strategy, "recommended_k", f"sample={self.sample_size};seed={self.seed}", float(self.recommended_k)))
        return out


def recommend_k(ks: Sequence[int], silhouettes: Sequence[float], tolerance: float = 0.05) -> int:
    """The largest k whose silhouette is within ``tolerance`` (relative) of the peak (Diversity-ordered training)."""
    ks_a = np.asarray(ks)
    sil = np.asarray(silhouettes, dtype=np.float64)
    if ks_a.size == 0 or ks_a.size != sil.size:
        raise StrataInputError("no silhouettes to choose k from", fix="sweep at least one k")
    peak = sil.max()
    return int(ks_a[sil >= peak - tolerance * abs(peak)].max())


def kmeans_pp(x: np.ndarray, k: int, seed: int) -> np.ndarray:
    """k-means++ seeding (Arthur & Vassilvitskii 2007): each next centre drawn with probability
    proportional to the squared distance to the nearest centre chosen so far. Seeded."""
    rng = np.random.default_rng(seed)
    n = x.shape[0]
    centres = np.empty((k, x.shape[1]), dtype=x.dtype)
    centres[0] = x[rng.integers(n)]
    sq = (x * x).sum(axis=1)
    d2 = np.maximum(sq - 2 * x @ centres[0] + sq.dtype.type(centres[0] @ centres[0]), 0)
    for i in range(1, k):
        total = float(d2.sum())
        j = int(rng.choice(n, p=d2 / total)) if total > 0 else int(rng.integers(n))
        centres[i] = x[j]
        d2 = np.minimum(d2, np.maximum(sq - 2 * x @ centres[i] + sq.dtype.type(centres[i] @ centres[i]), 0))
    return centres


def calibrate_k(
    embeddings: np.ndarray,
    ks: Sequence[int] = DEFAULT_KS,
    *,
    sample_size: int = 10_000,
    seed: int = 0,
    niter: int = 20,
    tolerance: float = 0.05,
    threads: int = 1,
) -> Calibration:
    """Sweep k on a seeded sample of ``embeddings``; k >= the sample size is skipped.

    faiss k-means starts from random points and often merges two true clusters while splitting
    another; it is seeded here with k-means++ (:func:`kmeans_pp`, as scikit-learn's k-means in
    Diversity-ordered training), which finds well-separated clusters reliably.

    faiss runs on ``threads`` OpenMP threads (restored afterwards): on a shared machine its
    spinning threads are slower than one thread for sample-sized problems.
    """

    # a memory map or the sharded matrix: only the sample is read
    x = embeddings if hasattr(embeddings, "shape") else np.asarray(embeddings)
    if x.ndim != 2 or x.shape[0] < 3:
        raise StrataInputError(f"embeddings have shape {x.shape}", fix="pass an (N, d) array with N >= 3")
    rng = np.random.default_rng(seed)
    idx = np.sort(rng.choice(x.shape[0], size=min(sample_size, x.shape[0]), replace=False))
    sample = np.ascontiguousarray(x[idx], dtype=np.float32)
    norms = np.linalg.norm(sample, axis=1, keepdims=True)
    if (norms == 0).any():
        raise StrataInputError("an embedding is all zeros", fix="drop or re-embed empty documents")
    sample /= norms
    dist = np.clip(1.0 - sample @ sample.T, 0.0, 2.0)
    np.fill_diagonal(dist, 0.0)
    used, scores = [], []
    previous = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(threads)
    try:
        for k in sorted(set(int(k) for k in ks)):
            if k < 2 or k >= sample.shape[0]:
                continue
            km = faiss.Kmeans(sample.shape[1], k, niter=niter, seed=seed, spherical=True,
                              max_points_per_centroid=sample.shape[0])
            km.train(sample, init_centroids=kmeans_pp(sample, k, seed))
            labels = km.index.search(sample, 1)[1].ravel()
            if np.unique(labels).size < 2:
                continue
            used.append(k)
            scores.append(float(sklearn_metrics.silhouette_score(dist, labels, metric="precomputed")))
    finally:
        faiss.omp_set_num_threads(previous)
    if not used:
        raise StrataInputError(f"no k in {list(ks)} fits a sample of {sample.shape[0]}",
                               fix="pass ks between 2 and the sample size - 1")
    return Calibration(np.array(used), np.array(scores), recommend_k(used, scores, tolerance), int(idx.size), seed)
