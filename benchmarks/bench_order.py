"""Speed and quality of the ordering engine on synthetic corpora (issue 3's targets).

Instances: Zipf(1) cluster sizes over K=1000 clusters, log-normal document lengths
(stream length incl. EOS, median e^5.5 ~ 245, mean ~ 500 tokens), documents in random order
packed into L=2048-token sequences, B=100 length bins. Each case runs in a fresh process so
its peak RSS is its own. Printed per case: seconds (numba compilation excluded), peak RSS,
mean (and worst) per-batch max deviation of cluster shares and of length-bin shares, batch = 32
sequences (`pipeline.reports.diagnostics.batch_deviations`: full batches only), and the same for `random`
on the same instance.

    python benchmarks/bench_order.py            # full sizes (minutes)
    python benchmarks/bench_order.py --quick    # 10x smaller
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.reports.diagnostics import Composition, batch_deviations, composition  # noqa: E402
from pipeline.ordering import Objective, OrderParams, greedy_order, sequence_features, sequence_order  # noqa: E402
from pipeline.ordering.documents import stratified_order  # noqa: E402
from pipeline.ordering.features import Csr  # noqa: E402
from pipeline.packing.pack import pack_concat  # noqa: E402

L, K, B, BATCH = 2048, 1000, 100, 32


def synthetic_docs(n_docs: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, K + 1)
    cluster = rng.choice(K, n_docs, p=p / p.sum())
    length = np.clip(rng.lognormal(5.5, 1.2, n_docs), 1, 200_000).astype(np.int64)
    return cluster, length


def entries(x: Csr) -> Composition:
    """The diagnostics' composition of a scheduler matrix: its CSR entries are the (sequence,
    group, tokens) rows. Read off f rather than kept from the segments, so the segment table need
    not stay alive through the timed, RSS-measured run."""
    return composition(np.repeat(np.arange(x.n_rows), np.diff(x.indptr)), x.indices, x.data, x.n_rows, x.n_cols)


def quality(f, rows) -> dict:
    """Batch deviations (full batches) of the order ``rows`` (rows of f: dense sequence ids)."""
    position = np.empty(rows.size, dtype=np.int64)
    position[rows] = np.arange(rows.size)
    clusters = entries(f.clusters)
    c = batch_deviations(clusters, position, BATCH)
    b = batch_deviations(entries(f.bins), position, BATCH)
    return {
        "cluster_dev": float(c.mean()),
        "cluster_dev_max": float(c.max()),
        "bin_dev": float(b.mean()),
        "bin_dev_max": float(b.max()),
        "clusters_per_seq": float(clusters.unique_per_sequence().mean()),
    }


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def warm_up() -> None:
    f = sequence_features(np.array([0, 0, 1, 2]), np.array([0, 1, 1, 0]), np.array([3, 4, 5, 6]), np.array([1, 2, 3, 3]), 2)
    greedy_order(f, Objective.named("f3", 1.0))
    stratified_order(np.array([0, 1, 0]), np.array([1, 2, 3]))


def case_sequences(mode: str, m: int, seed: int) -> dict:
    t0 = time.perf_counter()
    n_docs = int(m * L / 500 * 1.08)
    cluster, length = synthetic_docs(n_docs, seed)
    seg = pack_concat(np.random.default_rng(seed + 1).permutation(n_docs), length, L).segments
    seg = seg.filter(seg["sequence_id"] < m)
    d = seg["doc_id"].to_numpy()
    f = sequence_features(seg["sequence_id"].to_numpy(), cluster[d], length[d], seg["n_tokens"].to_numpy(), B, d)
    del seg, d
    build = time.perf_counter() - t0
    warm_up()
    t0 = time.perf_counter()
    rows = sequence_order(mode, f, OrderParams(bins=B), seed)
    secs = time.perf_counter() - t0
    out = {"mode": mode, "M": f.n_sequences, "seconds": secs, "build_s": build, "peak_rss_mb": peak_rss_mb()}
    out.update(quality(f, rows))
    return out


def case_stratified(n_docs: int, seed: int) -> dict:
    cluster, length = synthetic_docs(n_docs, seed)
    warm_up()
    t0 = time.perf_counter()
    order = stratified_order(cluster, length)
    secs = time.perf_counter() - t0
    out = {"mode": "stratified", "docs": n_docs, "seconds": secs, "peak_rss_mb": peak_rss_mb()}
    for name, doc_order in (("stratified", order), ("random", np.random.default_rng(seed).permutation(n_docs))):
        seg = pack_concat(doc_order, length, L).segments
        d = seg["doc_id"].to_numpy()
        f = sequence_features(seg["sequence_id"].to_numpy(), cluster[d], length[d], seg["n_tokens"].to_numpy(), B, d)
        out[name] = quality(f, np.arange(f.n_sequences))
    return out


def child(argv: list[str]) -> dict:
    kind, size, seed = argv[0], int(argv[1]), int(argv[2])
    if kind == "stratified":
        return case_stratified(size, seed)
    return case_sequences(kind, size, seed)


def run_case(kind: str, size: int, seed: int = 0) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", kind, str(size), str(seed)], capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def show(r: dict) -> None:
    size = f"M={r['M']:,}" if "M" in r else f"docs={r['docs']:,}"
    line = f"{r['mode']:<12} {size:<14} {r['seconds']:8.2f} s  peak RSS {r['peak_rss_mb']:7.0f} MB"
    if "cluster_dev" in r:
        line += (
            f"  batch{BATCH} max-dev clusters {r['cluster_dev']:.5f} (worst {r['cluster_dev_max']:.5f})"
            f"  bins {r['bin_dev']:.5f} (worst {r['bin_dev_max']:.5f})"
        )
    print(line, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="10x smaller instances")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return
    s = 10 if args.quick else 1
    print(f"L={L} K={K} B={B} batch={BATCH}; one process per case, one core", flush=True)
    print("-- exact greedy vs greedy_fast at the comparison size", flush=True)
    cmp = {mode: run_case(mode, 50_000 // s) for mode in ("greedy", "greedy_fast", "random")}
    for r in cmp.values():
        show(r)
    ratio = cmp["greedy_fast"]["cluster_dev"] / cmp["greedy"]["cluster_dev"]
    ratio_b = cmp["greedy_fast"]["bin_dev"] / cmp["greedy"]["bin_dev"]
    print(f"greedy_fast / greedy mean batch deviation: clusters {ratio:.3f}, bins {ratio_b:.3f} (target <= 1.10)")
    print("-- exact greedy at M=100k", flush=True)
    for mode in ("greedy", "random"):
        show(run_case(mode, 100_000 // s))
    print("-- greedy_fast at M=1M", flush=True)
    for mode in ("greedy_fast", "random"):
        show(run_case(mode, 1_000_000 // s))
    print("-- Diversity-ordered training stratified greedy, documents x K=1000 (sequences in packing order)", flush=True)
    r = run_case("stratified", 1_000_000 // s)
    show(r)
    for name in ("stratified", "random"):
        q = r[name]
        print(
            f"   packed {name:<10} batch{BATCH} max-dev clusters {q['cluster_dev']:.5f}  bins {q['bin_dev']:.5f}"
            f"  clusters/sequence {q['clusters_per_seq']:.2f}"
        )


if __name__ == "__main__":
    main()
