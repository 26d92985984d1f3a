"""k-means scale: 1M synthetic documents x 384 dims, PCA, k = 10,000 (TerRIFIC curricula's k) on CPU.

    python benchmarks/bench_cluster.py            # 1M docs, d=384 -> PCA 64, k=10,000
    python benchmarks/bench_cluster.py --quick    # 100k docs, k=1,000

Synthetic data: unit vectors around ``k_true`` random directions (a mixture like topic clusters),
so the run also reports how well the clusters recover the generating mixture (NMI).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.represent.agreement import label_agreement  # noqa: E402
from pipeline.represent.clusters import kmeans, pca_reduce  # noqa: E402


def synthetic(n: int, d: int, k_true: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((k_true, d), dtype=np.float32)
    centers /= np.linalg.norm(centers, axis=1, keepdims=True)
    truth = rng.integers(0, k_true, n)
    x = np.empty((n, d), dtype=np.float32)
    for a in range(0, n, 1 << 16):
        t = truth[a : a + (1 << 16)]
        x[a : a + t.size] = centers[t] + 0.04 * rng.standard_normal((t.size, d), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x, truth


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="100k docs, k=1,000")
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--d", type=int, default=384)
    ap.add_argument("--k", type=int, default=10_000)
    ap.add_argument("--pca", type=int, default=64, help="0 = no PCA")
    ap.add_argument("--niter", type=int, default=20)
    ap.add_argument("--max-points-per-centroid", type=int, default=256)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    if args.quick:
        args.n, args.k = 100_000, 1_000
    x, truth = synthetic(args.n, args.d, args.k)
    print(f"{args.n:,} docs x {args.d} dims, k={args.k:,}, pca={args.pca}, niter={args.niter}, "
          f"max_points_per_centroid={args.max_points_per_centroid}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    if args.pca:
        t0 = time.perf_counter()
        pca_reduce(x, args.pca)
        print(f"PCA alone: {time.perf_counter() - t0:.1f} s")
    t0 = time.perf_counter()
    assign, centroids = kmeans(x, args.k, seed=0, niter=args.niter, pca=args.pca, spherical=True,
                               max_points_per_centroid=args.max_points_per_centroid, threads=args.threads)
    dt = time.perf_counter() - t0
    sizes = np.bincount(assign, minlength=args.k)
    r = label_agreement(assign, truth)
    print(f"k-means total (PCA + train + assign all): {dt:.1f} s = {dt / 60:.1f} min")
    print(f"non-empty clusters {int((sizes > 0).sum()):,}/{args.k:,}; sizes min {sizes.min()} median {int(np.median(sizes))} max "
          f"{sizes.max()}")
    print(f"agreement with the generating mixture: ARI {r['ari']:.3f}, NMI {r['nmi']:.3f}")


if __name__ == "__main__":
    main()
