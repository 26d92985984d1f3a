"""Speed and quality of the ordering engine on synthetic corpora, against its targets.

Instances: Zipf(1) cluster sizes over K=1000 clusters, log-normal document lengths
(stream length incl. EOS, median e^5.5 ~ 245, mean ~ 500 tokens), documents in random order
packed into L=2048-token sequences, B=100 length bins. Above 1M sequences the instance is packed
1M sequences at a time (same documents' distribution, bin edges from a 2M-document sample) to bound the
memory of building it. Each case runs in a fresh process so its peak RSS is its own (it includes
building the instance). Printed per case: wall seconds of the ordering alone (numba compilation
excluded) and its CPU seconds (the ordering is single-threaded, so on a shared, loaded machine the
CPU time is the better estimate of the time on one free core), peak RSS, the mean, median and worst per-batch max deviation of cluster
shares and of length-bin shares, batch = 32 sequences (`pipeline.reports.diagnostics.batch_deviations`: full
batches only), and the same for a `random` order of the same instance.

Modes: `greedy_exact` (exact greedy at any size), `greedy_blocked` (the blocked greedy at any
size), `greedy` (exact up to `greedy_exact_max`, blocked above: what the pipeline runs),
`greedy_fast`, `random`.

Curriculum (`--curriculum`): `greedy_curriculum` on the same instances with a 3-knot curriculum
over the K=1000 clusters (`bench_curriculum`: knots at 1%, 10% and 100% of the stream's tokens,
logits log tau + 0.5 z, log tau, log tau - 0.5 z with z ~ N(0, 1) per cluster, shifted so that
E(S_total) is the corpus's composition, i.e. the corpus can realize it). Printed: CPU and wall
seconds of the ordering, peak RSS (and, to tell the instance's memory from the ordering's, the
peak RSS of building the instance and the RSS held when the ordering starts), and the mean / median / worst per-batch deviation from the
curriculum (`curriculum_batch_deviations`: max_j |share_j - the curriculum's increment over the
batch|, batch 32) of the exact curriculum greedy, the blocked one and `random` on a shared M=20k
instance, then of `greedy_curriculum` (blocked above greedy_exact_max) at M=1M or 10M.

Drift (docs/ordering.md, "Drift"): on held-out instances (K = 30, 300, 1000; L = 256 and 2048;
Zipf cluster sizes, log-normal lengths; seeds not used to choose the default), every objective's
exact greedy (the `greedy` strategy: exact below `greedy_exact_max`, then the batch repair) and
`random`: distinct clusters and documents per sequence in the 1st, 5th and 10th tenth of the
stream, the characteristics outside random's band (`pipeline.reports.stationarity`, 20 shuffles,
prefix = 480 sequences as the demo trains on), and the mean / worst per-batch max deviation of
cluster and length-bin shares (batch 32) with its ratio to f3's exact greedy without the repair
(the order f3 gave before the repair was part of `greedy` in exact mode).

    python benchmarks/bench_order.py             # sizes up to M=1M (minutes), then the drift table
    python benchmarks/bench_order.py --10m       # and greedy at M=10M (the longest case)
    python benchmarks/bench_order.py --quick     # 10x smaller
    python benchmarks/bench_order.py --drift     # only the drift table (every objective)
    python benchmarks/bench_order.py --drift --1m   # and f3 / stationary blocked at M=1M (CPU seconds, drift)
    python benchmarks/bench_order.py --objective f3   # the speed cases with another objective (default stationary)
    python benchmarks/bench_order.py --curriculum       # greedy_curriculum: exact vs blocked at M=20k, then M=1M
    python benchmarks/bench_order.py --curriculum --10m # ... then M=10M
    python benchmarks/bench_order.py --prefix       # the prefix table at 300k and 1M (exact, independent blocks, greedy)
    python benchmarks/bench_order.py --prefix --10m # ... and at 10M
    python benchmarks/bench_order.py --prefix --design  # the designs not taken, at 300k
    python benchmarks/bench_order.py --prefix [--design] --table  # the results file as docs/ordering.md's table
    taskset -c 0 python benchmarks/bench_order.py   # pin to one core
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

import polars as pl  # noqa: E402

from pipeline.ordering import (  # noqa: E402
    Objective,
    OrderParams,
    greedy_blocked_order,
    greedy_order,
    sequence_features,
    sequence_order,
)
from pipeline.ordering.composition import Composition, composition  # noqa: E402
from pipeline.ordering.curriculum import Curriculum, curriculum_batch_deviations, curriculum_from_dict  # noqa: E402
from pipeline.ordering.documents import stratified_order  # noqa: E402
from pipeline.ordering.features import Csr, SequenceFeatures, length_bin_edges  # noqa: E402
from pipeline.ordering.repair import repair_batches  # noqa: E402
from pipeline.packing.pack import pack_concat  # noqa: E402
from pipeline.reports.diagnostics import batch_deviations, prepare  # noqa: E402
from pipeline.reports.stationarity import out_of_band_summary, stationarity_table  # noqa: E402

L, K, B, BATCH = 2048, 1000, 100, 32
CHUNK = 1_000_000  # sequences packed at a time above this size
MODES = {  # benchmark mode -> (strategy, OrderParams overrides)
    "greedy": ("greedy", {}),
    "greedy_exact": ("greedy", {"greedy_exact_max": 2**62}),
    "greedy_blocked": ("greedy", {"greedy_exact_max": 0}),
    "greedy_fast": ("greedy_fast", {}),
    "random": ("random", {}),
}


def synthetic_docs(n_docs: int, seed: int, k: int = K, zipf: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, k + 1) ** zipf
    cluster = rng.choice(k, n_docs, p=p / p.sum())
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
        "cluster_dev_median": float(np.median(c)),
        "cluster_dev_max": float(c.max()),
        "bin_dev": float(b.mean()),
        "bin_dev_median": float(np.median(b)),
        "bin_dev_max": float(b.max()),
        "clusters_per_seq": float(clusters.unique_per_sequence().mean()),
    }


def shuffle_positions(m: int, n: int, seed: int) -> list[np.ndarray]:
    """Each sequence's position in ``n`` uniform shuffles of ``m`` sequences (seeds ``seed + 1`` …): the baselines
    a constructed order's prefixes and windows are compared with."""
    out = []
    for s in range(n):
        p = np.empty(m, dtype=np.int64)
        p[np.random.default_rng(seed + 1 + s).permutation(m)] = np.arange(m)
        out.append(p)
    return out


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def rss_mb() -> float:
    """The process's resident memory now (Linux /proc)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize() / 2**20


def warm_up() -> None:
    f = sequence_features(np.array([0, 0, 1, 2]), np.array([0, 1, 1, 0]), np.array([3, 4, 5, 6]), np.array([1, 2, 3, 3]), 2)
    greedy_order(f, Objective.named("f3", 1.0))
    greedy_blocked_order(f, Objective.named("f3", 1.0), greedy_block=2)
    repair_batches(np.arange(f.n_sequences), f, 1)  # compiles the batch repair
    stratified_order(np.array([0, 1, 0]), np.array([1, 2, 3]))


def _pack(n_docs: int, seed: int, m: int, edges: np.ndarray | None = None, offset: int = 0, k: int = K, zipf: float = 1.0,
          seq_len: int = L) -> SequenceFeatures:
    cluster, length = synthetic_docs(n_docs, seed, k, zipf)
    seg = pack_concat(np.random.default_rng(seed + 1).permutation(n_docs), length, seq_len).segments
    seg = seg.filter(seg["sequence_id"] < m)
    d = seg["doc_id"].to_numpy()
    f = sequence_features(
        seg["sequence_id"].to_numpy() + offset, cluster[d], length[d], seg["n_tokens"].to_numpy(), B, d, edges
    )  # fmt: skip
    return f


def _concat(parts: list[SequenceFeatures]) -> SequenceFeatures:
    def csr(xs: list[Csr]) -> Csr:
        ends = np.cumsum([x.indptr[-1] for x in xs])[:-1]
        indptr = np.concatenate([xs[0].indptr[:1]] + [x.indptr[1:] + e for x, e in zip(xs, np.r_[0, ends])])
        return Csr(indptr, np.concatenate([x.indices for x in xs]), np.concatenate([x.data for x in xs]), max(x.n_cols for x in xs))

    joint = np.zeros((max(p.cluster_bin_tokens.shape[0] for p in parts), parts[0].cluster_bin_tokens.shape[1]))
    for p in parts:
        joint[: p.cluster_bin_tokens.shape[0]] += p.cluster_bin_tokens
    return SequenceFeatures(
        np.concatenate([p.sequence_ids for p in parts]), csr([p.clusters for p in parts]), csr([p.bins for p in parts]),
        np.concatenate([p.lengths for p in parts]), parts[0].bin_edges, joint,
    )  # fmt: skip


def instance(m: int, seed: int, k: int = K, zipf: float = 1.0, seq_len: int = L) -> SequenceFeatures:
    """The synthetic instance with M=m sequences (Zipf(``zipf``) sizes over ``k`` clusters, packed
    into ``seq_len`` tokens); above CHUNK, built CHUNK sequences at a time (each chunk its own
    documents, seeds seed*1000+i; length bins from a sample of 2M documents of the same
    distribution) and concatenated."""
    per_seq = seq_len / 500 * 1.08  # documents per sequence, with room to spare
    if m <= CHUNK:
        return _pack(int(m * per_seq), seed, m, k=k, zipf=zipf, seq_len=seq_len)
    edges = length_bin_edges(synthetic_docs(2_000_000, seed, k, zipf)[1], B)
    parts, done = [], 0
    for i in range(-(-m // CHUNK)):
        size = min(CHUNK, m - done)
        parts.append(_pack(int(size * per_seq), seed * 1000 + i, size, edges, done, k, zipf, seq_len))
        done += size
    return _concat(parts)


def case_sequences(mode: str, m: int, seed: int, objective: str) -> dict:
    t0 = time.perf_counter()
    f = instance(m, seed)
    build = time.perf_counter() - t0
    warm_up()
    name, overrides = MODES[mode]
    t0, c0 = time.perf_counter(), time.process_time()
    rows = sequence_order(name, f, OrderParams(objective=objective, length_bins=B, **overrides), seed)
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    out = {"mode": mode, "objective": objective, "M": f.n_sequences, "seconds": secs, "cpu_s": cpu, "build_s": build,
           "peak_rss_mb": peak_rss_mb()}
    assert np.array_equal(np.sort(rows), np.arange(f.n_sequences)), "not a permutation"
    out.update(quality(f, rows))
    del rows
    out["random"] = quality(f, np.random.default_rng(seed).permutation(f.n_sequences))
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


CURRICULUM_MODES = {  # benchmark mode -> greedy_exact_max
    "curriculum": OrderParams().greedy_exact_max,
    "curriculum_exact": 2**62,
    "curriculum_blocked": 0,
}
CURRICULUM_SWING = 0.5  # logits log tau +- this * z at the first and last knot


def bench_curriculum(f: SequenceFeatures, seed: int) -> dict:
    """The 3-knot curriculum of the module docstring, as a knots document, for the instance f."""
    total = float(f.lengths.sum())
    tau = np.maximum(f.clusters.column_totals(), 1e-12) / total
    z = np.random.default_rng(seed + 77).standard_normal(tau.size)
    logits = [np.log(tau) + CURRICULUM_SWING * z, np.log(tau), np.log(tau) - CURRICULUM_SWING * z]
    knots = [{"tokens": total * q, "logits": lg.tolist()} for q, lg in zip((0.01, 0.1, 1.0), logits)]
    for _ in range(30):  # shift every knot's logits until E(S_total) / S_total = tau
        e = curriculum_from_dict({"knots": knots}, tau.size).cumulative(np.array([total]))[0] / total
        for k in knots:
            k["logits"] = (np.asarray(k["logits"]) + np.log(tau) - np.log(e)).tolist()
    return {"knots": knots}


def curriculum_quality(f: SequenceFeatures, rows: np.ndarray, cur: Curriculum) -> dict:
    """Per-batch deviation from the curriculum, and the cumulative tracking of E(S) (TerRIFIC
    curricula): ||T(t) - E(S(t))|| / S(t) over cluster tokens at PREFIX_POINTS log-spaced prefixes,
    its median and its largest value over the last 90% of the stream."""
    from pipeline.reports.diagnostics import log_spaced_points, prefix_totals

    d = curriculum_batch_deviations(f, rows, cur, BATCH)
    t = log_spaced_points(f.n_sequences, PREFIX_POINTS)
    t = t[t < f.n_sequences]
    position = np.empty(rows.size, dtype=np.int64)
    position[rows] = np.arange(rows.size)
    totals, s = prefix_totals(entries(f.clusters), position, t)
    err = np.linalg.norm(totals - cur.cumulative(s), axis=1) / s
    return {"dev": float(d.mean()), "dev_median": float(np.median(d)), "dev_max": float(d.max()),
            "cum_err_median": float(np.median(err)), "cum_err_max_last90": float(err[t > f.n_sequences / 10].max())}


def case_curriculum(mode: str, m: int, seed: int) -> dict:
    import tempfile

    f = instance(m, seed)
    doc = bench_curriculum(f, seed)
    cur = curriculum_from_dict(doc, f.clusters.n_cols)
    warm_up()
    with tempfile.TemporaryDirectory() as tmp:
        knots = Path(tmp) / "curriculum.json"
        knots.write_text(json.dumps(doc))
        params = OrderParams(objective=OBJECTIVE, length_bins=B, curriculum=str(knots), greedy_exact_max=CURRICULUM_MODES[mode])
        build_peak, held = peak_rss_mb(), rss_mb()
        t0, c0 = time.perf_counter(), time.process_time()
        rows = sequence_order("greedy_curriculum", f, params, seed)
        secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert np.array_equal(np.sort(rows), np.arange(f.n_sequences)), "not a permutation"
    out = {"mode": mode, "objective": OBJECTIVE, "M": f.n_sequences, "seconds": secs, "cpu_s": cpu, "peak_rss_mb": peak_rss_mb(),
           "build_peak_rss_mb": build_peak, "held_rss_mb": held}
    out.update(curriculum_quality(f, rows, cur))
    out["random"] = curriculum_quality(f, np.random.default_rng(seed).permutation(f.n_sequences), cur)
    return out


def show_curriculum(r: dict, exact: dict | None = None) -> None:
    dev = lambda q: f"{q['dev']:.4f}/{q['dev_median']:.4f}/{q['dev_max']:.4f}"  # noqa: E731
    line = (f"{r['mode']:<19} M={r['M']:<11,} {r['seconds']:8.1f} s (cpu {r['cpu_s']:.1f} s)  peak RSS {r['peak_rss_mb']:6.0f} MB"
            f" (building the instance: peak {r['build_peak_rss_mb']:.0f} MB, {r['held_rss_mb']:.0f} MB held into the ordering)"
            f"  batch{BATCH} deviation from the curriculum mean/median/worst {dev(r)} (random {dev(r['random'])})"
            f"  cumulative ||T - E(S)||/S median {r['cum_err_median']:.2e}, worst past the first tenth {r['cum_err_max_last90']:.2e}"
            f" (random {r['random']['cum_err_median']:.2e}, {r['random']['cum_err_max_last90']:.2e})")
    if exact is not None:
        line += f"  mean {r['dev'] / exact['dev']:.3f}x exact's (target <= 1.2)"
    print(line, flush=True)


def curriculum_cases(scale: int, ten_m: bool) -> None:
    print(f"-- greedy_curriculum, 3-knot curriculum over K={K} clusters, objective {OBJECTIVE}; one process per case, one core", flush=True)
    exact = run_case("curriculum_exact", 20_000 // scale)
    show_curriculum(exact)
    show_curriculum(run_case("curriculum_blocked", 20_000 // scale), exact)
    size = (10_000_000 if ten_m else 1_000_000) // scale
    show_curriculum(run_case("curriculum" if size > CURRICULUM_MODES["curriculum"] else "curriculum_blocked", size), exact)


def child(argv: list[str]) -> dict:
    global OBJECTIVE
    kind, size, seed, objective = argv[0], int(argv[1]), int(argv[2]), argv[3]
    if kind.startswith("prefix:"):
        _, mode, k, zipf, seq_len = kind.split(":")
        return case_prefix(mode, size, int(k), float(zipf), int(seq_len), seed, objective)
    if kind == "stratified":
        return case_stratified(size, seed)
    if kind in CURRICULUM_MODES:
        OBJECTIVE = objective
        return case_curriculum(kind, size, seed)
    return case_sequences(kind, size, seed, objective)


OBJECTIVE = "stationary"  # the speed cases' objective (--objective)


def run_case(kind: str, size: int, seed: int = 0) -> dict:
    argv = [sys.executable, __file__, "--child", kind, str(size), str(seed), OBJECTIVE]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _dev(q: dict, what: str) -> str:
    return f"{q[what + '_dev']:.4f}/{q[what + '_dev_median']:.4f}/{q[what + '_dev_max']:.4f}"


def show(r: dict) -> None:
    size = f"M={r['M']:,}" if "M" in r else f"docs={r['docs']:,}"
    cpu = f" (cpu {r['cpu_s']:.2f} s)" if "cpu_s" in r else ""
    line = f"{r['mode']:<15} {r.get('objective', ''):<11} {size:<14} {r['seconds']:8.2f} s{cpu}  peak RSS {r['peak_rss_mb']:7.0f} MB"
    if "cluster_dev" in r:
        rnd = r["random"]
        line += (
            f"  batch{BATCH} max-dev mean/median/worst: clusters {_dev(r, 'cluster')} (random {_dev(rnd, 'cluster')})"
            f"  bins {_dev(r, 'bin')} (random {_dev(rnd, 'bin')})"
        )
    print(line, flush=True)


def ratios(r: dict, exact: dict, label: str) -> None:
    """The issue-12 targets: mean within 1.10x exact's, worst <= random's median batch."""
    rc, rb = r["cluster_dev"] / exact["cluster_dev"], r["bin_dev"] / exact["bin_dev"]
    wc = r["cluster_dev_max"] <= r["random"]["cluster_dev_median"]
    wb = r["bin_dev_max"] <= r["random"]["bin_dev_median"]
    print(
        f"   {r['mode']} M={r['M']:,} vs {label}: mean ratio clusters {rc:.3f}, bins {rb:.3f} (target <= 1.10);"
        f" worst <= random's median: clusters {wc}, bins {wb}",
        flush=True,
    )


def main() -> None:
    global OBJECTIVE
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="10x smaller instances")
    ap.add_argument("--10m", dest="ten_m", action="store_true", help="also greedy at M=10M")
    ap.add_argument("--drift", action="store_true", help="only the drift table of every objective")
    ap.add_argument("--1m", dest="one_m", action="store_true", help="with --drift: also the blocked greedy at M=1M")
    ap.add_argument("--objective", default=OBJECTIVE, help="objective of the speed cases (default stationary)")
    ap.add_argument("--curriculum", action="store_true",
                    help="only greedy_curriculum: exact vs blocked at M=20k, then M=1M (10M with --10m)")
    ap.add_argument("--prefix", action="store_true", help="only the prefix table (issue 41): exact, independent blocks and greedy "
                    "at 300k and 1M (10M with --10m); writes benchmarks/results/order_prefix.json")
    ap.add_argument("--design", action="store_true", help="with --prefix: the design alternatives at 300k instead")
    ap.add_argument("--table", action="store_true", help="with --prefix: print the markdown table of the results file instead")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return
    OBJECTIVE = args.objective
    s = 10 if args.quick else 1
    if args.curriculum:
        curriculum_cases(s, args.ten_m)
        return
    if args.prefix and args.table:
        name = "order_prefix_design.json" if args.design else "order_prefix.json"
        print(prefix_markdown(Path(__file__).resolve().parent / "results" / name))
        return
    if args.prefix:
        prefix_table(s, args.ten_m, args.design)
        return
    if args.drift:
        drift_table(s)
        if args.one_m:
            drift_blocked(1_000_000 // s)
        return
    print(f"L={L} K={K} B={B} batch={BATCH}; one process per case, one core", flush=True)
    print("-- exact greedy vs the blocked greedy (and greedy_fast) on the same instances", flush=True)
    exact = {}
    for m in (25_000 // s, 50_000 // s, 100_000 // s):
        exact[m] = run_case("greedy_exact", m)
        blocked = run_case("greedy_blocked", m)
        show(exact[m])
        show(blocked)
        ratios(blocked, exact[m], "exact greedy, same instance")
    fast = run_case("greedy_fast", 50_000 // s)
    show(fast)
    ratios(fast, exact[50_000 // s], "exact greedy, same instance")
    print("-- exact greedy at M=200k (size stability of its deviations)", flush=True)
    show(run_case("greedy_exact", 200_000 // s))
    ref = exact[100_000 // s]
    sizes = [1_000_000 // s] + ([10_000_000 // s] if args.ten_m else [])
    print(f"-- greedy (blocked above greedy_exact_max) vs exact greedy at M={ref['M']:,}", flush=True)
    for m in sizes:
        r = run_case("greedy", m)
        show(r)
        ratios(r, ref, f"exact greedy at M={ref['M']:,}")
    print("-- greedy_fast at M=1M", flush=True)
    show(run_case("greedy_fast", 1_000_000 // s))
    print("-- Diversity-ordered training stratified greedy, documents x K=1000 (sequences in packing order)", flush=True)
    r = run_case("stratified", 1_000_000 // s)
    show(r)
    for name in ("stratified", "random"):
        q = r[name]
        print(
            f"   packed {name:<10} batch{BATCH} max-dev clusters {q['cluster_dev']:.5f}  bins {q['bin_dev']:.5f}"
            f"  clusters/sequence {q['clusters_per_seq']:.2f}"
        )
    drift_table(s)


# ---------------------------------------------------------------------------------------------
# The prefix table (--prefix): Don't Shuffle, Optimize's "at all times during training" at scale
# ---------------------------------------------------------------------------------------------

PREFIX_POINTS = 240  # log-spaced prefixes t < M
PREFIX_SHUFFLES = 5  # random shuffles; a prefix counts when the order is below each of them
TODAY_BLOCK = 8_192  # the independent-blocks greedy's block before the tracked deal
PREFIX_INSTANCES = (  # (M, K, Zipf exponent, L); seeds 41_000 + i, not used to choose the design
    (300_000, 1000, 1.0, 2048), (300_000, 100, 1.3, 2048), (300_000, 1000, 1.1, 256),
    (1_000_000, 1000, 1.0, 2048), (1_000_000, 100, 1.3, 256),
)
PREFIX_10M = (10_000_000, 1000, 1.0, 2048)


def independent_blocks_order(f: SequenceFeatures, objective: Objective, block: int, seed: int) -> np.ndarray:
    """The blocked greedy as it was before the tracked deal: block i is every n-th row of the
    stratified stream from row i, each block ordered by the exact greedy on its own targets from an
    empty state (a block a core), the blocks concatenated."""
    from pipeline.ordering.greedy import GreedyState, greedy_rows, stratified_stream
    from pipeline.threads import parallel_map

    n_blocks = max(1, -(-f.n_sequences // block))
    chars = objective.matrix(f)
    stream = stratified_stream(f, np.random.default_rng(seed))

    def one(i: int) -> np.ndarray:
        rows = np.sort(stream[i::n_blocks])
        sub, lengths = chars.take_rows(rows), f.lengths[rows]
        return rows[greedy_rows(sub, lengths, sub.targets(lengths), GreedyState.empty(sub.n_cols), None, 0.0, seed + i)]

    return np.concatenate(parallel_map(one, list(range(n_blocks))))


def prefix_check(f: SequenceFeatures, rows: np.ndarray, seed: int) -> dict:
    """Per family: the fraction of PREFIX_POINTS log-spaced prefixes t < M where the order's
    ||T(t) - tau S(t)|| / S(t) is below that of each of PREFIX_SHUFFLES shuffles (all prefixes; the
    last 90% of the stream, t > M / 10), and the median error of the order and of the shuffles."""
    from pipeline.reports.diagnostics import log_spaced_points, prefix_errors

    m = f.n_sequences
    t = log_spaced_points(m, PREFIX_POINTS)
    t = t[t < m]
    position = np.empty(m, dtype=np.int64)
    position[rows] = np.arange(m)
    shuffles = shuffle_positions(m, PREFIX_SHUFFLES, seed)
    out = {"prefixes": int(t.size)}
    for kind, x in (("cluster", f.clusters), ("bin", f.bins)):
        comp = entries(x)
        g = prefix_errors(comp, position, t)
        r = np.stack([prefix_errors(comp, p, t) for p in shuffles])
        below = np.all(g[None, :] < r, axis=0)
        out[f"{kind}_below_all"] = float(below.mean())
        out[f"{kind}_below_last90"] = float(below[t > m / 10].mean())
        out[f"{kind}_err_median"] = float(np.median(g))
        out[f"{kind}_random_err_median"] = float(np.median(r))
    return out


def carried_blocks_order(f: SequenceFeatures, objective: Objective, block: int, seed: int) -> np.ndarray:
    """A design not taken: the tracked deal's blocks, each ordered by the exact greedy from the
    deal's running totals before it against the *global* targets (instead of its own targets)."""
    from pipeline.ordering.greedy import GreedyState, greedy_rows, stratified_stream, tracked_blocks

    chars = objective.matrix(f)
    lengths = np.asarray(f.lengths, dtype=np.float64)
    targets = chars.targets(lengths)
    state = GreedyState.empty(chars.n_cols)
    blocks = tracked_blocks(chars, lengths, targets, state, stream=stratified_stream(f, np.random.default_rng(seed)), greedy_block=block)
    parts = []
    while True:
        before = GreedyState(state.X.copy(), state.S, state.n)
        try:
            rows, ordered = next(blocks)
        except StopIteration:
            break
        parts.append(rows if ordered else rows[greedy_rows(chars.take_rows(rows), lengths[rows], targets, before)])
    return np.concatenate(parts)


DESIGNS = {  # --design: the alternatives measured against `greedy` (tracked deal, blocks of 4,096, pool 1.5, head 16)
    "design_block8192": "blocks of 8,192",
    "design_pool1.25": "a pool of 1.25 blocks",
    "design_head1.5": "the first block from a pool of 1.5 blocks",
    "design_carried": "blocks ordered from the carried state against the global targets",
    "design_no_carry": "each block's order drained whole (no rows carried to the next block's)",
}


def case_prefix(mode: str, m: int, k: int, zipf: float, seq_len: int, seed: int, objective: str) -> dict:
    t0 = time.perf_counter()
    f = instance(m, seed, k, zipf, seq_len)
    build = time.perf_counter() - t0
    warm_up()
    obj = Objective.named(objective)
    t0, c0 = time.perf_counter(), time.process_time()
    if mode == "independent_blocks":
        rows = repair_batches(independent_blocks_order(f, obj, TODAY_BLOCK, seed), f, BATCH)[0]
    elif mode == "design_carried":
        rows = repair_batches(carried_blocks_order(f, obj, OrderParams().greedy_block, seed), f, BATCH)[0]
    elif mode.startswith("design_"):
        import pipeline.ordering.greedy as G

        block = 8_192 if mode == "design_block8192" else OrderParams().greedy_block
        G.POOL_SLACK = 0.25 if mode == "design_pool1.25" else G.POOL_SLACK
        G.HEAD_POOL = 1.5 if mode == "design_head1.5" else G.HEAD_POOL
        G.CARRY = 0 if mode == "design_no_carry" else G.CARRY
        rows = sequence_order("greedy", f, OrderParams(objective=objective, length_bins=B, greedy_exact_max=0, greedy_block=block), seed)
    else:
        name, overrides = MODES[mode]
        rows = sequence_order(name, f, OrderParams(objective=objective, length_bins=B, **overrides), seed)
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert np.array_equal(np.sort(rows), np.arange(f.n_sequences)), "not a permutation"
    out = {"mode": mode, "objective": objective, "M": f.n_sequences, "K": k, "zipf": zipf, "L": seq_len, "seed": seed,
           "seconds": secs, "cpu_s": cpu, "build_s": build, "peak_rss_mb": peak_rss_mb()}
    out.update(quality(f, rows))
    out.update(prefix_check(f, rows, seed))
    return out


def show_prefix(r: dict, ref: dict | None) -> None:
    pct = lambda v: f"{100 * v:5.1f}%"  # noqa: E731
    ratio = ""
    if ref is not None and ref is not r:
        ratio = f"  vs {ref['mode']}: mean " + " ".join(
            f"{w} {r[w + '_dev'] / ref[w + '_dev']:.3f}x" for w in ("cluster", "bin")) + ", worst " + " ".join(
            f"{w} {r[w + '_dev_max'] / ref[w + '_dev_max']:.3f}x" for w in ("cluster", "bin"))
    print(
        f"{r['mode']:<19} M={r['M']:<10,} K={r['K']:<5} zipf={r['zipf']:<4} L={r['L']:<5}"
        f" clusters {pct(r['cluster_below_all'])} {pct(r['cluster_below_last90'])}"
        f" (median {r['cluster_err_median']:.2e}/{r['cluster_random_err_median']:.2e})"
        f"  bins {pct(r['bin_below_all'])} {pct(r['bin_below_last90'])}"
        f" (median {r['bin_err_median']:.2e}/{r['bin_random_err_median']:.2e})"
        f"  batch{BATCH} mean/worst clusters {r['cluster_dev']:.4f}/{r['cluster_dev_max']:.4f}"
        f" bins {r['bin_dev']:.4f}/{r['bin_dev_max']:.4f}"
        f"  {r['seconds']:7.1f} s (cpu {r['cpu_s']:.1f} s)  peak RSS {r['peak_rss_mb']:6.0f} MB{ratio}",
        flush=True,
    )


def _commit() -> tuple[str, list[str]]:
    """HEAD's commit and the tracked files that differ from it (none: the results are HEAD's)."""
    root = Path(__file__).resolve().parents[1]
    rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "diff", "--name-only", "HEAD"], cwd=root, capture_output=True, text=True).stdout.split()
    return rev, dirty


def _machine() -> dict:
    import os
    import platform

    model = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                  if ln.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else platform.processor()
    return {"cpu": model, "cores": len(os.sched_getaffinity(0)),
            "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "loadavg_at_start": os.getloadavg()[0]}


def prefix_table(scale: int, ten_m: bool, design: bool = False) -> None:
    """Issue 41's table: for each instance, the exact greedy (at 300k), the independent-blocks
    greedy of before (blocks of TODAY_BLOCK, then the batch repair) and ``greedy`` (the tracked
    deal above greedy_exact_max); one process per case. Writes benchmarks/results/order_prefix.json.
    ``design``: instead, the DESIGNS alternatives and ``greedy`` on the 300k instances
    (benchmarks/results/order_prefix_design.json)."""
    cases = [c for c in PREFIX_INSTANCES if not design or c[0] == 300_000] + ([PREFIX_10M] if ten_m and not design else [])
    name = "order_prefix_design" if design else "order_prefix"
    out = Path(__file__).resolve().parent / "results" / (f"{name}.json" if scale == 1 else f"{name}_quick.json")
    commit, dirty = _commit()
    doc = {"benchmark": "bench_order.py --prefix" + (" --design" if design else ""), "commit": commit, "modified_files": dirty,
           "machine": _machine(),
           "date": time.strftime("%Y-%m-%d %H:%M:%S"), "objective": OBJECTIVE, "batch": BATCH, "points": PREFIX_POINTS,
           "shuffles": PREFIX_SHUFFLES, "cases": []}
    print(f"-- prefix check: below each of {PREFIX_SHUFFLES} shuffles at {PREFIX_POINTS} log-spaced prefixes (all; last 90%),"
          f" objective {OBJECTIVE}, B={B}; one process per case", flush=True)
    for i, (m, k, zipf, seq_len) in enumerate(cases):
        m //= scale
        modes = (["greedy_exact"] if m <= 300_000 // scale else []) + ["independent_blocks", "greedy"]
        if design:
            modes = ["greedy", *DESIGNS]
        ref = None
        for mode in modes:
            r = run_case(f"prefix:{mode}:{k}:{zipf}:{seq_len}", m, 41_000 + i)
            show_prefix(r, ref if mode == "greedy" or design else None)
            ref = r if mode == ("greedy" if design else "independent_blocks") else ref
            doc["cases"].append(r)
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_suffix(".tmp")
            tmp.write_text(json.dumps(doc, indent=1))
            tmp.replace(out)
    print(f"wrote {out}", flush=True)


def prefix_markdown(path: Path) -> str:
    """The table of a --prefix results file, as docs/ordering.md shows it (``benchmarks/tables.py``)."""
    from tables import order_prefix_markdown

    return order_prefix_markdown(json.loads(path.read_text()))


DRIFT_INSTANCES = ((30, 256, 20_000), (300, 256, 20_000), (1000, 256, 60_000), (30, 2048, 12_000), (300, 2048, 20_000),
                   (1000, 2048, 60_000))  # (K, L, sequences); the last is the drift issue's instance
DRIFT_OBJECTIVES = ("f1", "f2", "f3", "stationary")


def drift_instance(k: int, seq_len: int, m: int, seed: int) -> tuple[SequenceFeatures, pl.DataFrame, np.ndarray, np.ndarray]:
    """Zipf(1) cluster sizes over k clusters, log-normal lengths, a random packing into seq_len; m sequences
    (the instance of tests/test_ordering_scale.py's ``bench_instance``, with the segments kept)."""
    rng = np.random.default_rng(seed)
    n_docs = int(m * seq_len / 500 * 1.08)
    p = 1.0 / np.arange(1, k + 1)
    cluster = rng.choice(k, n_docs, p=p / p.sum())
    length = np.clip(rng.lognormal(5.5, 1.2, n_docs), 1, 200_000).astype(np.int64)
    seg = pack_concat(rng.permutation(n_docs), length, seq_len).segments.filter(pl.col("sequence_id") < m)
    d = seg["doc_id"].to_numpy()
    f = sequence_features(seg["sequence_id"].to_numpy(), cluster[d], length[d], seg["n_tokens"].to_numpy(), B, d)
    return f, seg, cluster, length


def drift_row(name: str, f: SequenceFeatures, seg: pl.DataFrame, cluster: np.ndarray, length: np.ndarray, rows: np.ndarray,
              ref: dict) -> None:
    sched = prepare(seg, f.sequence_ids[rows], cluster, length, bin_edges=f.bin_edges)
    table = stationarity_table(sched, prefix=min(480, f.n_sequences), strategy=name)
    tenth = lambda c: table.filter((pl.col("characteristic") == c) & pl.col("part").is_in(["0", "4", "9"]))["value"]  # noqa: E731
    q = quality(f, rows)
    print(
        f"   {name:<11} clusters/seq {' > '.join(f'{v:.2f}' for v in tenth('clusters_per_seq'))}"
        f"  docs/seq {' > '.join(f'{v:.2f}' for v in tenth('docs_per_seq'))}"
        f"  batch dev clusters {q['cluster_dev']:.4f}/{q['cluster_dev_max']:.4f} ({q['cluster_dev'] / ref['cluster_dev']:.2f}x/"
        f"{q['cluster_dev_max'] / ref['cluster_dev_max']:.2f}x) bins {q['bin_dev']:.4f}/{q['bin_dev_max']:.4f}"
        f" ({q['bin_dev'] / ref['bin_dev']:.2f}x/{q['bin_dev_max'] / ref['bin_dev_max']:.2f}x)"
        f"  outside band: {out_of_band_summary(table) or 'none'}",
        flush=True,
    )


def drift_blocked(m: int) -> None:
    """f3 and stationary through `greedy` above greedy_exact_max (blocked, then the repair) at M=m:
    CPU seconds of the ordering, drift and batch deviation; ratios to f3's blocked greedy as it was
    before the sequence families (the worst 0.1% of the batches repaired)."""
    f, seg, cluster, length = drift_instance(K, L, m, 9100)
    warm_up()
    exact_max = OrderParams().greedy_exact_max
    if f.n_sequences <= exact_max:
        raise SystemExit(f"--1m needs more than greedy_exact_max={exact_max} sequences (drop --quick)")
    print(f"-- drift at scale: `greedy` (blocked) K={K} L={L} M={f.n_sequences:,}; ratios to f3's blocked greedy with 0.1% repaired",
          flush=True)
    orders = {}
    for obj in ("f3", "stationary"):
        c0 = time.process_time()
        orders[obj] = sequence_order("greedy", f, OrderParams(objective=obj, length_bins=B), 0)
        print(f"   {obj}: {time.process_time() - c0:.1f} CPU s", flush=True)
    orders["random"] = np.random.default_rng(0).permutation(f.n_sequences)
    f3 = Objective.named("f3")
    orders["f3 (0.1%)"] = repair_batches(greedy_blocked_order(f, f3), f, BATCH, fraction=0.001)[0]
    ref = quality(f, orders["f3 (0.1%)"])
    for name, rows in orders.items():
        drift_row(name, f, seg, cluster, length, rows, ref)


def drift_table(scale: int) -> None:
    """Per objective: clusters and documents per sequence by tenth, what leaves random's band, batch deviations."""
    print(f"-- drift: every objective's `greedy` (exact) and random; batch {BATCH}; ratios to f3's exact greedy before the repair",
          flush=True)
    for i, (k, seq_len, m) in enumerate(DRIFT_INSTANCES):
        f, seg, cluster, length = drift_instance(k, seq_len, m // scale, 9000 + i)
        orders = {obj: sequence_order("greedy", f, OrderParams(objective=obj, length_bins=B), 0) for obj in DRIFT_OBJECTIVES}
        orders["random"] = np.random.default_rng(0).permutation(f.n_sequences)
        ref = quality(f, greedy_order(f, Objective.named("f3")))
        print(f"K={k} L={seq_len} M={f.n_sequences:,}", flush=True)
        for name, rows in orders.items():
            drift_row(name, f, seg, cluster, length, rows, ref)


if __name__ == "__main__":
    main()
