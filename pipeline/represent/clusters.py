"""The clusters stage: optional PCA, then seeded k-means (faiss on CPU or GPU; scikit-learn fallback).

Diversity-ordered training clusters (optionally PCA-reduced) embeddings with k-means; TerRIFIC curricula used k = 10,000.

Training sample. k-means centroids are means, whose standard error falls as 1/sqrt(m) with m
points per centroid; faiss's default cap of m = 256 training points per centroid (a seeded
subsample of ``k * 256`` documents) puts that error near 6% of the within-cluster spread, below
what changes between seeds, while bounding the cost of training at ``k * 256 * k * d`` per
iteration whatever N is. We keep that cap by default (``max_points_per_centroid``); every document
is still *assigned* to its nearest centroid. With N <= 256 k (e.g. 1M docs, k = 10k) all
documents train.

Seeding. faiss seeds with k random documents, which for small k often puts two seeds in one true
cluster and leaves Lloyd's iterations stuck with two clusters merged. For k <= ``KMEANSPP_MAX_K``
we seed with k-means++ (Arthur & Vassilvitskii 2007; scikit-learn's ``kmeans_plusplus``, seeded)
on a subsample of ``max(16 k, 4096)`` training documents, costing about one Lloyd iteration.
Beyond that its O(N k d) sequential cost is minutes and random seeds hit each of the many small
clusters about evenly, so faiss's own seeding is kept.

Spherical option: inputs are L2-normalized and centroids renormalized after each update
(spherical k-means, cosine similarity); documents go to the centroid of highest inner product.
After PCA the reduced vectors are renormalized too, so the geometry stays cosine.

Determinism: same inputs, k, seed and options => identical output on CPU (faiss's exact search
and per-centroid sums have a fixed order). GPU faiss is not bitwise reproducible.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from pipeline.errors import StrataInputError
from pipeline.heavy import lazy
from pipeline.represent.embedding_index import open_embeddings
from pipeline.storage.atomic import atomic_dir
from pipeline.storage.layout import Layout

faiss = lazy("faiss")  # imported on first use (pipeline/heavy.py)
sklearn_cluster = lazy("sklearn.cluster")
sklearn_decomposition = lazy("sklearn.decomposition")
threadpoolctl = lazy("threadpoolctl")

BACKENDS = ("auto", "faiss", "sklearn")
KMEANSPP_MAX_K = 1024
PCA_FIT_MAX = 100_000  # rows for the covariance: >= 100 rows per dimension up to d = 1,000


ASSIGN_BATCH = 1 << 16  # rows assigned per faiss search: memory is this many rows, not N


def pca_fit(x: np.ndarray, n_components: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(mean (d,), axes (d, n_components))`` of the top principal axes of ``x`` (array or memmap).

    scikit-learn's PCA (eigendecomposition of the covariance) on a seeded sample of at most
    ``PCA_FIT_MAX`` rows; each axis's sign is fixed (largest-magnitude loading positive), so results
    are reproducible.
    """
    n, d = x.shape
    if not 1 <= n_components <= d:
        raise StrataInputError(f"pca={n_components} components for {d}-dimensional embeddings is impossible",
                               fix=f"use 0 (no PCA) or 1..{d}")
    if n < n_components:
        raise StrataInputError(f"pca={n_components} components from {n} embeddings is impossible", fix=f"use 0 (no PCA) or 1..{n}")
    fit = np.asarray(x) if n <= PCA_FIT_MAX else np.asarray(x[np.sort(np.random.default_rng(seed).choice(n, PCA_FIT_MAX, replace=False))])
    pca = sklearn_decomposition.PCA(n_components, svd_solver="covariance_eigh").fit(fit)
    return pca.mean_.astype(np.float32), np.ascontiguousarray(pca.components_.T, dtype=np.float32)


def pca_reduce(x: np.ndarray, n_components: int, seed: int = 0) -> np.ndarray:
    """Project ``x`` on its top ``n_components`` principal axes (float32 ``(N, n_components)``; see :func:`pca_fit`)."""
    mu, w = pca_fit(x, n_components, seed)
    n = x.shape[0]
    out = np.empty((n, n_components), dtype=np.float32)
    for a in range(0, n, 1 << 16):
        out[a : a + (1 << 16)] = (x[a : a + (1 << 16)] - mu) @ w
    return out


def _row_norms(x: np.ndarray, block: int = 1 << 15) -> np.ndarray:
    """``np.linalg.norm(x, axis=1, keepdims=True)``, the same values, a block of rows at a time (the
    whole-matrix call makes an x * x temporary as large as x)."""
    return np.concatenate([np.linalg.norm(x[a : a + block], axis=1, keepdims=True) for a in range(0, x.shape[0], block)]
                          or [np.zeros((0, 1), dtype=x.dtype)])


def _normalize(x: np.ndarray) -> np.ndarray:
    return (x / np.maximum(_row_norms(x), 1e-12)).astype(np.float32, copy=False)


class Transform:
    """What k-means sees of an embedding row: L2-normalized (spherical), PCA-projected (then
    normalized again when spherical). Row-wise, so batches give the rows of the whole."""

    def __init__(self, spherical: bool, pca: tuple[np.ndarray, np.ndarray] | None):
        self.spherical, self.pca = spherical, pca

    def __call__(self, rows: np.ndarray, inplace: bool = False) -> np.ndarray:
        """The transformed rows; ``inplace``: ``rows`` is a float32 array the caller owns and gives
        up (a gathered sample), so normalizing reuses its memory instead of copying it."""
        x = np.ascontiguousarray(rows, dtype=np.float32)
        if not np.isfinite(x).all():
            raise StrataInputError("embeddings contain NaN/inf", fix="recompute the embeddings asset")
        if self.spherical and inplace and x is rows:
            x /= np.maximum(_row_norms(x), 1e-12)
        elif self.spherical:
            x = _normalize(x)
        if self.pca is not None:
            mu, w = self.pca
            x = (x - mu) @ w
            if self.spherical:
                x = _normalize(x)
        return np.ascontiguousarray(x, dtype=np.float32)


def kmeans(embeddings: np.ndarray, k: int, seed: int = 0, niter: int = 20, **options: Any) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(assignment int64 (N,), centroids float32 (k, d'))``: :func:`train_kmeans` with
    ``options`` (its keywords), then every row assigned in batches of ``ASSIGN_BATCH``.

    ``embeddings`` may be a memory-mapped ``.npy``: only the training sample (``k *
    max_points_per_centroid`` rows at most) is read whole. ``d'`` is ``pca`` when PCA is on
    (centroids live in the reduced space), else the input dim.
    """
    centroids, transform, _ = train_kmeans(embeddings, k, seed, niter, **options)
    return assign_clusters(embeddings, centroids, transform, transform.spherical, options.get("threads", 0)), centroids


def train_kmeans(
    embeddings: np.ndarray,
    k: int,
    seed: int = 0,
    niter: int = 20,
    *,
    pca: int = 0,
    spherical: bool = False,
    max_points_per_centroid: int = 256,
    threads: int = 0,
    backend: str = "auto",
) -> tuple[np.ndarray, Transform, str]:
    """Centroids trained on the seeded sample (module docstring), the row transform and the backend used.

    ``threads`` > 0 sets faiss's OpenMP threads for this call. ``backend``: ``auto`` (faiss, or
    scikit-learn's MiniBatchKMeans if faiss cannot be imported), ``faiss`` or ``sklearn``.
    """
    x = embeddings
    if x.ndim != 2 or x.shape[0] == 0:
        raise StrataInputError(f"embeddings must be a non-empty 2-D array, got shape {x.shape}", fix="recompute the embeddings asset")
    n = x.shape[0]
    if not isinstance(k, (int, np.integer)) or k < 1 or k > n:
        raise StrataInputError(
            f"k={k} clusters for {n} documents is impossible",
            fix=f"set k between 1 and {n} (the number of training documents)",
        )
    if niter < 1 or max_points_per_centroid < 1:
        raise StrataInputError(f"niter={niter}, max_points_per_centroid={max_points_per_centroid} are impossible",
                               fix="use positive integers")
    if backend not in BACKENDS:
        raise StrataInputError(f"unknown k-means backend {backend!r}", fix=f"use one of {list(BACKENDS)}")
    pca_params = None
    if pca:
        pca_params = pca_fit(Transform(spherical, None)(x[_sample_rows(n, PCA_FIT_MAX, seed)]), pca, seed)
    transform = Transform(spherical, pca_params)
    rows = _sample_rows(n, int(k) * max_points_per_centroid, seed)
    train = transform(x[rows], inplace=not isinstance(rows, slice))  # a gathered sample is ours: normalized in place
    if backend == "auto":
        try:
            import faiss  # noqa: F401

            backend = "faiss"
        except ImportError:
            backend = "sklearn"
    run = _faiss_train if backend == "faiss" else _sklearn_train
    return run(train, int(k), seed, niter, spherical, max_points_per_centroid, threads), transform, backend


def assign_clusters(embeddings: np.ndarray, centroids: np.ndarray, transform: Transform, spherical: bool,
                    threads: int = 0, batch_rows: int = ASSIGN_BATCH) -> np.ndarray:
    """Nearest centroid (inner product when spherical, else L2) of every row, ``batch_rows`` at a time."""
    n = embeddings.shape[0]
    out = np.empty(n, dtype=np.int64)
    for a in range(0, n, batch_rows):
        out[a : a + batch_rows] = assign_batch(transform(embeddings[a : a + batch_rows]), centroids, spherical, threads)
    return out


def assign_batch(x: np.ndarray, centroids: np.ndarray, spherical: bool, threads: int = 0) -> np.ndarray:
    """Exact nearest centroid of already transformed rows (faiss flat index, else numpy)."""
    try:
        import faiss
    except ImportError:
        sq = (centroids**2).sum(1)
        return np.argmax(x @ centroids.T if spherical else 2 * x @ centroids.T - sq, axis=1).astype(np.int64)
    before = faiss.omp_get_max_threads()
    if threads > 0:
        faiss.omp_set_num_threads(threads)
    try:
        index = faiss.IndexFlatIP(centroids.shape[1]) if spherical else faiss.IndexFlatL2(centroids.shape[1])
        index.add(np.ascontiguousarray(centroids, dtype=np.float32))
        _, a = index.search(x, 1)
    finally:
        faiss.omp_set_num_threads(before)
    return a[:, 0].astype(np.int64)


# --------------------------------------------------------------------------- kept centroids
def save_model(model_dir: Path, centroids: np.ndarray, transform: Transform, meta: dict) -> str:
    """Write a trained model (centroids, PCA, ``meta``: what it was trained with and on) atomically;
    return its key (a digest of the arrays: per-shard assignments are named by it)."""
    arrays = {"centroids": centroids, **({"pca_mean": transform.pca[0], "pca_w": transform.pca[1]} if transform.pca else {})}
    key = model_key(arrays)
    with atomic_dir(model_dir) as tmp:
        for name, arr in arrays.items():
            np.save(tmp / f"{name}.npy", np.ascontiguousarray(arr, dtype=np.float32), allow_pickle=False)
        (tmp / "model.json").write_text(json.dumps({**meta, "key": key, "spherical": transform.spherical}, indent=1, sort_keys=True))
    return key


def load_model(model_dir: Path) -> tuple[np.ndarray, Transform, dict] | None:
    """A saved model, or None when there is none (or it is incomplete)."""
    try:
        meta = json.loads((model_dir / "model.json").read_text())
        centroids = np.load(model_dir / "centroids.npy", allow_pickle=False)
        pca = (np.load(model_dir / "pca_mean.npy"), np.load(model_dir / "pca_w.npy")) if (model_dir / "pca_w.npy").is_file() else None
    except (OSError, ValueError):
        return None
    return centroids, Transform(bool(meta["spherical"]), pca), meta


def model_key(arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name in sorted(arrays):
        h.update(name.encode() + np.ascontiguousarray(arrays[name], dtype=np.float32).tobytes())
    return h.hexdigest()[:16]


def keeps(meta: dict, params: dict, shards: set[str]) -> bool:
    """Whether a saved model still serves: trained with these ``params`` and on shards (by
    ``docs_digest``) all still in the corpus unchanged, i.e. the corpus was only appended to."""
    return meta.get("params") == params and set(meta.get("trained_shards", [])) <= shards


def assign_transformed(centroids: np.ndarray, spherical: bool, rows: np.ndarray) -> np.ndarray:
    """Cluster (int32) of each row already through the model's :class:`Transform`."""
    return assign_batch(rows, centroids, spherical).astype(np.int32)


def _sample_rows(n: int, m: int, seed: int) -> np.ndarray | slice:
    """All rows (a slice, read in order) when ``n <= m``, else a sorted seeded sample of ``m``."""
    return slice(None) if n <= m else np.sort(np.random.default_rng(seed).choice(n, m, replace=False))


def _kmeanspp_seeds(train: np.ndarray, k: int, seed: int) -> np.ndarray | None:
    """k-means++ initial centroids for k <= KMEANSPP_MAX_K (module docstring), else None."""
    if k > KMEANSPP_MAX_K:
        return None

    m = min(train.shape[0], max(16 * k, 4096))
    rng = np.random.default_rng(seed)
    sample = train if m == train.shape[0] else train[np.sort(rng.choice(train.shape[0], m, replace=False))]

    # One BLAS thread: its k sequential steps multiply tiny matrices, where threads only add
    # synchronization (above all on a busy machine), and results then do
    # not depend on the core count.
    with threadpoolctl.threadpool_limits(1):
        seeds, _ = sklearn_cluster.kmeans_plusplus(sample, k, random_state=seed)
    return np.ascontiguousarray(seeds, dtype=np.float32)


def _faiss_train(train: np.ndarray, k: int, seed: int, niter: int, spherical: bool, mppc: int, threads: int) -> np.ndarray:
    before = faiss.omp_get_max_threads()
    if threads > 0:
        faiss.omp_set_num_threads(threads)
    try:
        gpu = faiss.get_num_gpus() > 0
        km = faiss.Kmeans(
            train.shape[1], k, niter=niter, seed=seed, spherical=spherical, max_points_per_centroid=mppc,
            min_points_per_centroid=1, gpu=gpu, verbose=False,
        )
        km.train(train, init_centroids=_kmeanspp_seeds(train, k, seed))
    finally:
        faiss.omp_set_num_threads(before)
    return np.asarray(km.centroids, dtype=np.float32)


def _sklearn_train(train: np.ndarray, k: int, seed: int, niter: int, spherical: bool, mppc: int, threads: int) -> np.ndarray:
    """MiniBatchKMeans on the same seeded training sample; spherical = unit inputs and centroids."""
    km = sklearn_cluster.MiniBatchKMeans(n_clusters=k, random_state=seed, max_iter=niter, n_init=1,
                                         batch_size=min(train.shape[0], max(1024, 4 * k)))
    km.fit(train)
    centroids = km.cluster_centers_.astype(np.float32)
    return _normalize(centroids) if spherical else centroids


def diversity_clusters(layout: Layout, cfg, docs: pl.DataFrame) -> tuple[np.ndarray, int]:
    """Cluster of every document (doc_id order) at ``claims.k`` clusters, and that k."""
    k = cfg.claims_k or cfg.k
    if k == cfg.k:
        return docs["cluster"].to_numpy().astype(np.int64), k
    emb = open_embeddings(layout)
    k = min(k, emb.shape[0])
    assign, _ = kmeans(emb, k, seed=cfg.seed, niter=cfg.kmeans_iters, pca=cfg.pca_components, spherical=cfg.kmeans_spherical,
                       max_points_per_centroid=cfg.kmeans_max_points_per_centroid)
    return np.asarray(assign, dtype=np.int64), k
