"""The disk's bound on ``centroids``' sample read: the seeded sample of ``k x max_points_per_centroid``
embedding rows that ``centroids`` trains on, read from a data root's embedding shards with the page
cache dropped before each read (needs root: ``/proc/sys/vm/drop_caches``), with 4 to 64 requests in
flight (``pipeline.storage.npy_rows.READERS``; ``centroids`` uses 16). Where the seconds do not fall
as requests are added, the read runs at the disk's rate for this pattern, which bounds the stage
beside the libraries' own k-means (``bench_scale.py`` prints those). Figures are printed, never asserted.

    python benchmarks/bench_sample_read.py /tmp/bs10m/n10000000/root --k 1000 --repeats 2
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.represent.clusters import _sample_rows  # noqa: E402
from pipeline.represent.embedding_index import open_embeddings  # noqa: E402
from pipeline.storage import npy_rows  # noqa: E402


def drop_page_cache() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as fh:
        fh.write("1\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path, help="a data root with materialized embeddings")
    ap.add_argument("--k", type=int, default=1000)
    ap.add_argument("--max-points-per-centroid", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--readers", type=int, nargs="+", default=[4, 16, 64])
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    emb = open_embeddings(args.root / "embeddings" / "runs.parquet")
    rows = _sample_rows(emb.shape[0], args.k * args.max_points_per_centroid, args.seed)
    mb = len(rows) * emb.shape[1] * emb.dtype.itemsize / 1e6
    print(f"{len(rows):,} of {emb.shape[0]:,} rows ({mb:.0f} MB) from {len(emb.runs.paths)} shard files, page cache dropped before each "
          "read")
    for _ in range(args.repeats):
        for readers in args.readers:
            npy_rows.READERS = readers
            drop_page_cache()
            t0 = time.perf_counter()
            emb[rows]
            print(f"  {readers:>3} requests in flight: {time.perf_counter() - t0:.2f} s", flush=True)


if __name__ == "__main__":
    main()
