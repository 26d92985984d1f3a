"""Benchmark: every ordering metric for M sequences, K clusters (target: M=1M, K=1000 in <= 60 s).

Synthetic corpus: log-normal document lengths, Zipf-like cluster sizes, concat-packed into
2,048-token sequences until M sequences exist; one random ordering. Prints seconds per step.

    nice python benchmarks/bench_diagnostics.py [--sequences 1000000] [--clusters 1000]
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np

from pipeline.packing.pack import pack_concat
from pipeline.reports import diagnostics as D


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sequences", type=int, default=1_000_000)
    ap.add_argument("--clusters", type=int, default=1000)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--bins", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)

    t0 = time.perf_counter()
    mean_len = 700
    n_docs = int(args.sequences * args.seq_len / mean_len * 1.05)
    lengths = np.maximum(1, rng.lognormal(np.log(mean_len) - 0.5, 1.0, n_docs)).astype(np.int64) + 1
    weights = 1.0 / np.arange(1, args.clusters + 1) ** 0.8
    clusters = rng.choice(args.clusters, size=n_docs, p=weights / weights.sum())
    packing = pack_concat(rng.permutation(n_docs), lengths, args.seq_len)
    m = min(packing.n_sequences, args.sequences)
    segments = packing.segments.filter(packing.segments["sequence_id"] < m)
    order = rng.permutation(m)
    print(f"synthetic: {n_docs:,} docs, M={m:,} sequences, {segments.height:,} segments, "
          f"K={args.clusters}, B={args.bins}  ({time.perf_counter() - t0:.1f} s to build)")

    steps: list[tuple[str, float]] = []
    start = time.perf_counter()

    def lap(name: str, t: float) -> float:
        now = time.perf_counter()
        steps.append((name, now - t))
        return now

    t = time.perf_counter()
    sched = D.prepare(segments, order, clusters, lengths, length_bins=args.bins, n_clusters=args.clusters)
    t = lap("prepare (join, bins, sparse c_s and l_s)", t)
    rows = D.diversity_rows("random", sched)
    t = lap("unique clusters per sequence", t)
    rows += D.batch_rows("random", sched)
    t = lap("per-batch deviation, batch 8/32/128, clusters + bins", t)
    rows += D.prefix_rows("random", sched)
    t = lap("prefix error, 64 log-spaced t, clusters + bins", t)
    rows += D.drift_rows("random", sched)
    t = lap("drift per decile", t)
    at = D.log_spaced_points(m, 10)
    target = np.tile(sched.clusters.global_share(), (at.size, 1))
    rows += D.curriculum_rows("random", sched, at, target)
    t = lap("curriculum realized vs target (10 checkpoints)", t)
    frame = D.rows_frame(rows)
    t = lap("rows -> frame", t)
    total = time.perf_counter() - start

    for name, sec in steps:
        print(f"  {sec:7.2f} s  {name}")
    print(f"  {total:7.2f} s  TOTAL all metrics ({frame.height:,} rows)  target <= 60 s")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 / 1024:.2f} GiB")
    for metric in ("unique_clusters_per_seq_mean", "batch_dev_clusters_max", "batch_dev_length_bins_max"):
        sub = frame.filter(frame["metric"] == metric)
        print("  " + metric + ": " + ", ".join(f"{s or '-'}={v:.4g}" for s, v in zip(sub["setting"], sub["value"])))


if __name__ == "__main__":
    main()
