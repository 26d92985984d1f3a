"""Benchmark: the stationarity table (7 characteristics x 11 parts, random's band of 20 shuffles)
for M sequences, K clusters (target: M=1M in seconds, not minutes).

Synthetic corpus as ``bench_diagnostics.py``: log-normal document lengths, Zipf-like cluster
sizes, three source labels, concat-packed into 2,048-token sequences until M sequences exist;
one random ordering. Prints seconds for ``prepare`` and for the table, and the table's
clusters_per_seq rows.

With ``--false-alarms N``: N uniform shuffles (seeds 1..N), each against its own band of
``--shuffles`` shuffles (seed 1000 + i), on the instance; prints how often some part, and each
characteristic (tenths / prefix), is outside the band (docs/diagnostics.md, "False alarms" was
measured with ``--sequences 20000 --clusters 50 --bins 20 --seq-len 256 --prefix 960``).

    nice python benchmarks/bench_stationarity.py [--sequences 1000000] [--clusters 1000] [--shuffles 20]
    nice python benchmarks/bench_stationarity.py --sequences 20000 --clusters 50 --bins 20 --seq-len 256 \
        --prefix 960 --false-alarms 300
"""

from __future__ import annotations

import argparse
import dataclasses
import resource
import time

import numpy as np
import polars as pl

from pipeline.packing.pack import pack_concat
from pipeline.reports import diagnostics as D
from pipeline.reports import stationarity as S


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sequences", type=int, default=1_000_000)
    ap.add_argument("--clusters", type=int, default=1000)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--bins", type=int, default=100)
    ap.add_argument("--shuffles", type=int, default=S.DEFAULT_SHUFFLES)
    ap.add_argument("--prefix", type=int, default=60 * 32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--false-alarms", type=int, default=0, help="uniform shuffles to test against their own band")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)

    t0 = time.perf_counter()
    mean_len = min(700, args.seq_len // 2)
    n_docs = int(args.sequences * args.seq_len / mean_len * 1.05)
    lengths = np.maximum(1, rng.lognormal(np.log(mean_len) - 0.5, 1.0, n_docs)).astype(np.int64) + 1
    weights = 1.0 / np.arange(1, args.clusters + 1) ** 0.8
    clusters = rng.choice(args.clusters, size=n_docs, p=weights / weights.sum())
    sources = rng.choice(np.array(["web", "code", "books"]), size=n_docs, p=[0.6, 0.3, 0.1])
    packing = pack_concat(rng.permutation(n_docs), lengths, args.seq_len)
    m = min(packing.n_sequences, args.sequences)
    segments = packing.segments.filter(packing.segments["sequence_id"] < m)
    print(f"synthetic: {n_docs:,} docs, M={m:,} sequences, {segments.height:,} segments, K={args.clusters}, "
          f"B={args.bins}  ({time.perf_counter() - t0:.1f} s to build)")

    t = time.perf_counter()
    sched = D.prepare(segments, rng.permutation(m), clusters, lengths, length_bins=args.bins, n_clusters=args.clusters,
                      doc_source=sources)
    print(f"  {time.perf_counter() - t:7.2f} s  prepare (incl. source codes)")
    t = time.perf_counter()
    table = S.stationarity_table(sched, prefix=args.prefix, strategy="random", n_random=args.shuffles, seed=args.seed)
    print(f"  {time.perf_counter() - t:7.2f} s  stationarity table ({table.height} rows, {args.shuffles} shuffles)")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 / 1024:.2f} GiB")
    print(table.filter(table["characteristic"] == "clusters_per_seq"))
    print("outside:", S.out_of_band_summary(table) or "none")
    if args.false_alarms:
        false_alarms(sched, args)


def false_alarms(sched: D.Schedule, args: argparse.Namespace) -> None:
    """How often a uniform shuffle has a part outside its own band (overall and per characteristic)."""
    hits: dict[str, int] = {}
    warned = 0
    for i in range(1, args.false_alarms + 1):
        order = np.random.default_rng(i).permutation(sched.n_sequences)
        position = np.empty_like(order)
        position[order] = np.arange(order.size)
        frame = S.stationarity_table(dataclasses.replace(sched, order=order, position=position), prefix=args.prefix,
                                     n_random=args.shuffles, seed=1000 + i)
        out = frame.filter(~pl.col("inside"))
        warned += out.height > 0
        for c, where in set(zip(out["characteristic"], np.where(out["part"] == S.PREFIX, "prefix", "tenths"))):
            hits[f"{c} ({where})"] = hits.get(f"{c} ({where})", 0) + 1
    n = args.false_alarms
    print(f"R={args.shuffles}: {warned / n:.3f} of {n} uniform shuffles have some part outside their band")
    for key in sorted(hits):
        print(f"  {key}: {hits[key] / n:.3f}")


if __name__ == "__main__":
    main()
