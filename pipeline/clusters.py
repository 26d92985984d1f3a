"""The clusters stage: seeded faiss k-means over document embeddings.

``faiss.Kmeans`` subsamples to 256 points per centroid by default; we lift that cap so every
document is used, and assign each document to its nearest centroid. faiss-gpu is used when
installed with CUDA present.
"""

from __future__ import annotations

import numpy as np

from pipeline.errors import StrataInputError


def kmeans(embeddings: np.ndarray, k: int, seed: int = 0, niter: int = 20) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(assignment int64 (N,), centroids float32 (k, dim))``."""
    import faiss

    x = np.ascontiguousarray(embeddings, dtype=np.float32)
    n = x.shape[0]
    if k < 1 or k > n:
        raise StrataInputError(
            f"k={k} clusters for {n} documents is impossible",
            fix=f"set k between 1 and {n} (the number of training documents)",
        )
    if not np.isfinite(x).all():
        raise StrataInputError("embeddings contain NaN/inf", fix="recompute the embeddings asset")
    gpu = hasattr(faiss, "get_num_gpus") and faiss.get_num_gpus() > 0
    km = faiss.Kmeans(x.shape[1], k, niter=niter, seed=seed, max_points_per_centroid=max(256, n), gpu=gpu, verbose=False)
    km.train(x)
    _, assign = km.index.search(x, 1)
    return assign[:, 0].astype(np.int64), km.centroids.astype(np.float32)
