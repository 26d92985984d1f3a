"""Ordering at scale: `greedy` is exact up to `greedy_exact_max` sequences and blocked above it."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from pipeline.config import StrataConfig, config_from_dict
from pipeline.errors import StrataInputError
from pipeline.ordering import (
    Objective,
    OrderParams,
    greedy_blocked_order,
    greedy_mode,
    greedy_order,
    greedy_scaled_order,
    run_strategy,
    sequence_features,
)
from pipeline.ordering.composition import composition
from pipeline.ordering.features import Csr, SequenceFeatures, packed_sequence_features
from pipeline.ordering.repair import repair_batches
from pipeline.packing.pack import pack_concat
from pipeline.reports.diagnostics import batch_deviations

F3 = Objective.named("f3", 1.0)


def bench_instance(m: int, seed: int = 0, k: int = 1000, length_bins: int = 100, seq_len: int = 2048) -> SequenceFeatures:
    """benchmarks/bench_order.py's instance: Zipf(1) clusters, log-normal lengths, random packing."""
    rng = np.random.default_rng(seed)
    n_docs = int(m * seq_len / 500 * 1.08)
    p = 1.0 / np.arange(1, k + 1)
    cluster = rng.choice(k, n_docs, p=p / p.sum())
    length = np.clip(rng.lognormal(5.5, 1.2, n_docs), 1, 200_000).astype(np.int64)
    seg = pack_concat(rng.permutation(n_docs), length, seq_len).segments.filter(pl.col("sequence_id") < m)
    d = seg["doc_id"].to_numpy()
    return sequence_features(seg["sequence_id"].to_numpy(), cluster[d], length[d], seg["n_tokens"].to_numpy(), length_bins, d)


def deviations(f: SequenceFeatures, rows: np.ndarray, batch: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """Per-batch max deviation of cluster and of length-bin shares of the order ``rows``."""
    position = np.empty(rows.size, dtype=np.int64)
    position[rows] = np.arange(rows.size)
    out = []
    for x in (f.clusters, f.bins):
        comp = composition(np.repeat(np.arange(x.n_rows), np.diff(x.indptr)), x.indices, x.data, x.n_rows, x.n_cols)
        out.append(batch_deviations(comp, position, batch))
    return out[0], out[1]


@pytest.fixture(scope="module")
def big():
    return bench_instance(20_000)


def test_blocked_is_a_deterministic_permutation(big):
    rows = greedy_blocked_order(big, F3, greedy_block=4096, seed=3)
    assert np.array_equal(np.sort(rows), np.arange(big.n_sequences))
    assert np.array_equal(rows, greedy_blocked_order(big, F3, greedy_block=4096, seed=3))
    assert not np.array_equal(rows, greedy_blocked_order(big, F3, greedy_block=4096, seed=4))  # the seed deals the blocks
    noisy = greedy_blocked_order(big, F3, greedy_block=4096, seed=3, noise=0.1)
    assert np.array_equal(noisy, greedy_blocked_order(big, F3, greedy_block=4096, seed=3, noise=0.1))
    assert np.array_equal(np.sort(noisy), np.arange(big.n_sequences))


def test_blocked_stays_within_its_bound_of_exact_greedy(big):
    """docs/ordering.md: mean per-batch max deviation within 1.10x exact greedy's (clusters and
    length bins); worst batch no worse than random's median batch. M=20k, K=1000, B=100."""
    ec, eb = deviations(big, greedy_order(big, F3))
    bc, bb = deviations(big, greedy_blocked_order(big, F3, greedy_block=4096))
    rc, rb = deviations(big, np.random.default_rng(0).permutation(big.n_sequences))
    assert bc.mean() <= 1.10 * ec.mean() and bb.mean() <= 1.10 * eb.mean()
    assert bc.max() <= np.median(rc) and bb.max() <= np.median(rb)


def test_batch_repair_lowers_the_worst_batches_and_moves_few_sequences(big):
    """On a random order (many bad batches): the worst 1% of the batches each get at most one swap."""
    order = np.random.default_rng(1).permutation(big.n_sequences)
    fixed, swaps = repair_batches(order, big, 32, fraction=0.01, passes=1)
    n_fix = int(0.01 * (big.n_sequences // 32))
    assert np.array_equal(np.sort(fixed), np.arange(big.n_sequences))
    assert 0 < swaps <= n_fix and (fixed != order).sum() == 2 * swaps
    before, after = deviations(big, order), deviations(big, fixed)
    worst_before = np.maximum(before[0], before[1])
    worst_after = np.maximum(after[0], after[1])
    assert worst_after.max() < worst_before.max()
    assert np.sort(worst_after)[-n_fix:].sum() < np.sort(worst_before)[-n_fix:].sum()
    assert np.array_equal(repair_batches(order, big, 32, fraction=0.01, passes=1)[0], fixed)
    more, _ = repair_batches(order, big, 32, fraction=0.01, passes=3)  # later passes take the batches then worst
    assert np.maximum(*deviations(big, more)).max() <= worst_after.max()


def test_one_block_is_the_exact_greedy():
    f = bench_instance(600, seed=2, k=40, length_bins=10)
    for obj in (F3, Objective.named("f1", 1.0), Objective.named("f2", 0.5), Objective.named("stationary")):
        assert np.array_equal(greedy_blocked_order(f, obj, greedy_block=f.n_sequences, seed=5), greedy_order(f, obj))


def test_threshold_switches_modes_and_names_them():
    f = bench_instance(600, seed=1, k=40, length_bins=10)
    m = f.n_sequences
    assert greedy_mode(m, m) == "exact" and greedy_mode(m, m - 1) == "blocked"
    rows, mode = greedy_scaled_order(f, F3, greedy_exact_max=m, batch_size=32)  # then the swap repair of the worst batches
    assert mode == "exact" and np.array_equal(rows, repair_batches(greedy_order(f, F3), f, 32)[0])
    rows, mode = greedy_scaled_order(f, F3, greedy_exact_max=m - 1, greedy_block=128, seed=7, batch_size=32)
    assert mode == "blocked" and np.array_equal(rows, repair_batches(greedy_blocked_order(f, F3, greedy_block=128, seed=7), f, 32)[0])
    assert not np.array_equal(rows, greedy_order(f, F3))
    with pytest.raises(StrataInputError):
        greedy_scaled_order(f, F3, greedy_exact_max=-1)
    with pytest.raises(StrataInputError):
        greedy_blocked_order(f, F3, greedy_block=0)


def _tables(rng, n=900, k=6, seq_len=128):
    length = rng.integers(5, 400, n)
    docs = pl.DataFrame({"doc_id": np.arange(n), "cluster": rng.integers(0, k, n), "n_tokens": length})
    return docs, pack_concat(rng.permutation(n), length, seq_len).segments


@pytest.mark.parametrize("strategy", ["greedy", "greedy_block_shuffle"])
def test_run_strategy_reports_the_mode(strategy):
    docs, seg = _tables(np.random.default_rng(0))
    m = int(seg["sequence_id"].max()) + 1
    exact = run_strategy(strategy, docs, seg, 128, OrderParams(length_bins=8), seed=1)
    blocked = run_strategy(strategy, docs, seg, 128, OrderParams(length_bins=8, greedy_exact_max=m // 2, greedy_block=200), seed=1)
    assert exact.greedy_mode == "exact" and blocked.greedy_mode == "blocked"
    assert sorted(blocked.order["sequence_id"].to_list()) == list(range(m))
    assert blocked.order.equals(
        run_strategy(strategy, docs, seg, 128, OrderParams(length_bins=8, greedy_exact_max=m // 2, greedy_block=200), seed=1).order
    )
    assert run_strategy("random", docs, seg, 128, OrderParams(), seed=1).greedy_mode is None


def test_config_keys_match_the_engine_defaults_and_are_validated():
    cfg, params = StrataConfig(), OrderParams()
    assert (cfg.greedy_exact_max, cfg.greedy_block) == (params.greedy_exact_max, params.greedy_block)
    with pytest.raises(StrataInputError, match="greedy_exact_max"):
        config_from_dict({"greedy_exact_max": -1})
    with pytest.raises(StrataInputError, match="greedy_block"):
        config_from_dict({"greedy_block": 0})


MATERIALIZE = """
import json, sys
import dagster as dg
from assets.common import sync_partitions
from assets.runner import plan, prepare_environment, selected_keys
cfg = prepare_environment(sys.argv[1], None)
from assets.definitions import defs
upstream = [name for pdef, names in plan(defs, selected_keys(defs, "*sequences"), cfg, True) if pdef is None for name in names]
sync_partitions(dg.DagsterInstance.get(), cfg)  # strategies are dynamic partitions that follow the config
kw = dict(instance=dg.DagsterInstance.get(), resources=defs.resources, raise_on_error=True)
everything = list(defs.assets) + list(defs.asset_checks or [])
dg.materialize(everything, selection=upstream, **kw)
modes = {}
for strategy in ("greedy", "random"):
    res = dg.materialize(everything, selection=["orderings"], partition_key=strategy, **kw)
    modes[strategy] = res.asset_materializations_for_node("orderings")[0].metadata["greedy_mode"].value
print(json.dumps(modes))
"""


@pytest.mark.integration
def test_orderings_asset_names_the_greedy_mode_in_metadata_and_lineage(tmp_path, write_jsonl, request):
    import json
    import os
    import subprocess
    import sys

    import duckdb
    import yaml
    from helpers import demo_slice

    from pipeline.storage.layout import Layout

    corpus = write_jsonl(demo_slice(200))
    cfg = {
        "data_root": str(tmp_path / "root"), "corpus": {"path": str(corpus)}, "heldout_fraction": 0.05,
        "vocab_size": 400, "k": 4, "seq_len": 64, "length_bins": 8, "embed_method": "shallow", "embed_max_tokens": 64,
        "strategies": ["random", "greedy"], "greedy_exact_max": 10, "greedy_block": 64,
    }  # fmt: skip
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "DAGSTER_HOME": ""}
    proc = subprocess.run(
        [sys.executable, "-c", MATERIALIZE, str(tmp_path / "cfg.yaml")],
        capture_output=True, text=True, env=env, cwd=request.config.rootpath, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"greedy": "blocked", "random": "none"}
    layout = Layout(tmp_path / "root")
    with duckdb.connect(str(layout.duckdb), read_only=True) as con:
        rows = con.execute("SELECT partition, parameters FROM lineage WHERE asset = 'orderings'").fetchall()
    params = {p: json.loads(v) for p, v in rows}
    assert params["greedy"]["greedy_mode"] == "blocked" and params["greedy"]["greedy_exact_max"] == 10
    assert params["random"]["greedy_mode"] is None
    order = pl.read_parquet(layout.ordering("greedy"))["sequence_id"].to_numpy()
    assert order.size > 10 and np.array_equal(np.sort(order), np.arange(order.size))


def test_features_of_grouped_and_shuffled_segments_agree():
    """Segments grouped by sequence (a packing) take the one-pass path; the same rows in any other
    order take the sorting path; both give the same characteristic matrices and objective matrix."""
    from pipeline.ordering.characteristics import Family, _hstack, characteristics

    rng = np.random.default_rng(3)
    n_docs, k = 3000, 40
    cluster, length = rng.integers(0, k, n_docs), rng.integers(1, 900, n_docs)
    seg = pack_concat(rng.permutation(n_docs), length, 256).segments
    shuffled = seg.sample(fraction=1.0, shuffle=True, seed=0)
    feats = []
    for s in (seg, shuffled):
        d = s["doc_id"].to_numpy()
        feats.append(sequence_features(s["sequence_id"].to_numpy(), cluster[d], length[d], s["n_tokens"].to_numpy(), 16, d))
    source = rng.integers(0, 5, n_docs)
    d = seg["doc_id"].to_numpy()
    feats.append(sequence_features(seg["sequence_id"].to_numpy(), cluster[d], length[d], seg["n_tokens"].to_numpy(), 16, d,
                                   seg_columns={"source": source[d]}))
    feats.append(packed_sequence_features(seg["sequence_id"].to_numpy(), d, seg["n_tokens"].to_numpy(), cluster, length, 16,
                                          {"source": source}))
    a = feats[0]
    for b in feats[1:]:
        assert np.array_equal(a.sequence_ids, b.sequence_ids) and np.array_equal(a.bin_edges, b.bin_edges)
        for x, y in ((a.clusters, b.clusters), (a.bins, b.bins)):
            assert np.array_equal(x.indptr, y.indptr) and np.array_equal(x.indices, y.indices) and np.array_equal(x.data, y.data)
        assert np.array_equal(a.lengths, b.lengths) and np.array_equal(a.spans, b.spans)
        assert np.array_equal(a.cluster_bin_tokens, b.cluster_bin_tokens)
    src = feats[2].columns["source"]
    assert all(np.array_equal(getattr(src, f), getattr(feats[3].columns["source"], f)) for f in ("indptr", "indices", "data"))
    fams = (Family("cluster"), Family("length_bin", 0.5), Family("norm", 0.1), Family("concentration", 0.25, 8))
    x = characteristics(a, fams).x
    # the reference: every entry as (row, column) pairs, sorted
    parts = [a.clusters, a.bins]
    rows = np.concatenate([np.repeat(np.arange(p.n_rows), np.diff(p.indptr)) for p in parts])
    cols = np.concatenate([parts[0].indices, parts[1].indices + parts[0].n_cols])
    o = np.lexsort((cols, rows))
    two = _hstack(parts)
    assert np.array_equal(two.indices, cols[o]) and np.array_equal(two.data, np.concatenate([p.data for p in parts])[o])
    classes = characteristics(a, fams[3:]).x.n_cols
    assert x.n_cols == a.clusters.n_cols + a.bins.n_cols + 1 + classes
    assert (np.diff(x.indptr) == np.diff(a.clusters.indptr) + np.diff(a.bins.indptr) + 2).all()


def _sequential_repair(order: np.ndarray, f: SequenceFeatures, batch: int, n_fix: int, reach: int) -> np.ndarray:
    """One repair pass as a plain scan: each of the worst batches takes, among the swaps with a
    batch at most ``reach`` away, the first (in order b, i, j) that is strictly better than every
    earlier one, if it lowers the larger of the two batches' deviations."""
    total = float(f.lengths.sum())
    shares = [f.clusters.column_totals() / total, f.bins.column_totals() / total]

    def dev(rows):
        out = 0.0
        for x, share in zip((f.clusters, f.bins), shares):
            tok = np.zeros(x.n_cols)
            for r in rows:
                np.add.at(tok, x.indices[x.indptr[r] : x.indptr[r + 1]], x.data[x.indptr[r] : x.indptr[r + 1]])
            present = tok > 0
            worst = np.abs(tok[present] / f.lengths[rows].sum() - share[present]).max()
            absent = share[~present]
            out = max(out, worst, absent.max() if absent.size else 0.0)
        return out

    order = order.copy()
    nb = order.size // batch
    devs = np.array([dev(order[a * batch : (a + 1) * batch]) for a in range(nb)])
    for a in np.argsort(-devs, kind="mergesort")[:n_fix]:
        best, pick = devs[a], None
        for b in range(max(0, a - reach), min(nb, a + reach + 1)):
            for i in range(batch):
                for j in range(batch if b != a else 0):
                    ra, rb = order[a * batch : (a + 1) * batch].copy(), order[b * batch : (b + 1) * batch].copy()
                    ra[i], rb[j] = rb[j], ra[i]
                    v = max(dev(ra), dev(rb))
                    if v < best:
                        best, pick = v, (b, i, j)
        if pick is not None:
            b, i, j = pick
            order[a * batch + i], order[b * batch + j] = order[b * batch + j], order[a * batch + i]
            devs[a], devs[b] = dev(order[a * batch : (a + 1) * batch]), dev(order[b * batch : (b + 1) * batch])
    return order


def _uneven_instance(m: int, seed: int, k: int, length_bins: int) -> SequenceFeatures:
    """Sequences of uneven lengths (a padded packing's), each split over up to 5 clusters and 3 length bins."""
    rng = np.random.default_rng(seed)
    lengths = np.where(rng.random(m) < 0.3, 256, rng.integers(20, 256, m))

    def split(n_cols: int, most: int) -> Csr:
        indptr, indices, data = [0], [], []
        for total in lengths:
            cols = np.sort(rng.choice(n_cols, min(int(rng.integers(1, most + 1)), n_cols), replace=False))
            cuts = np.sort(rng.choice(np.arange(1, total), cols.size - 1, replace=False))
            indices += list(cols)
            data += list(np.diff(np.r_[0, cuts, total]).astype(float))
            indptr.append(len(indices))
        return Csr(np.array(indptr), np.array(indices), np.array(data), n_cols)

    return SequenceFeatures(np.arange(m), split(k, 5), split(length_bins, 3), lengths.astype(float), np.arange(length_bins - 1),
                            np.zeros((k, length_bins)))


def test_parallel_swap_scoring_picks_what_a_sequential_scan_picks():
    """The swap scores sum each batch once and add / take away the candidate rows, dropping a swap
    at the first term past the batch's deviation: the repair still takes the swaps a plain scan
    summing every swapped batch takes (full sequences, and sequences of uneven lengths), with the
    batches scored in waves of far-apart batches (200 batches, 40 repaired: many waves hold several)."""
    cases = ((bench_instance(160, seed=4, k=12, length_bins=6, seq_len=256), 4), (_uneven_instance(150, 3, 9, 5), 5),
             (bench_instance(800, seed=5, k=12, length_bins=6, seq_len=256), 4))
    for f, batch in cases:
        order = np.random.default_rng(0).permutation(f.n_sequences)
        fixed, swaps = repair_batches(order, f, batch, fraction=0.2, passes=1)
        assert swaps > 0
        assert np.array_equal(fixed, _sequential_repair(order, f, batch, int(0.2 * (f.n_sequences // batch)), 2))


def test_features_in_chunks_on_every_thread_equal_one_pass(monkeypatch):
    """The grouped CSR, the lengths and the (cluster, length bin) tokens are built in chunks on
    every core: with every input split (one chunk per 1 row minimum) and on 1 or 2 threads, the
    features are bit-identical to one chunk's."""
    import numba
    from helpers import chunked_threads

    from pipeline import segments
    from pipeline.ordering.features import SequenceIds

    rng = np.random.default_rng(11)
    n_docs, k = 4000, 50
    cluster, length, source = rng.integers(0, k, n_docs), rng.integers(1, 700, n_docs), rng.integers(0, 6, n_docs)
    seg = pack_concat(rng.permutation(n_docs), length, 256).segments
    args = (seg["sequence_id"].to_numpy(), seg["doc_id"].to_numpy(), seg["n_tokens"].to_numpy(), cluster, length, 16, {"source": source})
    one = packed_sequence_features(*args)
    assert segments.n_chunks(seg.height) == 1
    with chunked_threads(monkeypatch) as counts:
        for threads in counts:
            numba.set_num_threads(threads)
            assert segments.n_chunks(seg.height) == 4 * threads
            many = packed_sequence_features(*args)
            for x, y in ((one.clusters, many.clusters), (one.bins, many.bins), (one.columns["source"], many.columns["source"])):
                assert all(getattr(x, f).tobytes() == getattr(y, f).tobytes() for f in ("indptr", "indices", "data"))
            assert one.lengths.tobytes() == many.lengths.tobytes() and one.cluster_bin_tokens.tobytes() == many.cluster_bin_tokens.tobytes()
            assert one.cluster_bin_tokens.sum() == one.lengths.sum() == seg["n_tokens"].sum()
    ids = SequenceIds.of_segments(seg["sequence_id"].to_numpy())  # what random and original read instead of the features
    assert np.array_equal(ids.sequence_ids, one.sequence_ids)
    assert np.array_equal(SequenceIds.of_segments(seg["sequence_id"].to_numpy()[::-1]).sequence_ids, one.sequence_ids)


def independent_blocks_order(f: SequenceFeatures, objective: Objective, block: int, seed: int = 0) -> np.ndarray:
    """The blocked greedy before the tracked deal: every n-th row of the stratified stream a block,
    each block ordered on its own targets from an empty state, the blocks concatenated."""
    from pipeline.ordering.greedy import GreedyState, greedy_rows, stratified_stream

    n_blocks = -(-f.n_sequences // block)
    stream = stratified_stream(f, np.random.default_rng(seed))
    chars = objective.matrix(f)
    parts = []
    for i in range(n_blocks):
        rows = np.sort(stream[i::n_blocks])
        sub, lengths = chars.take_rows(rows), f.lengths[rows]
        parts.append(rows[greedy_rows(sub, lengths, sub.targets(lengths), GreedyState.empty(sub.n_cols))])
    return np.concatenate(parts)


def below_random(f: SequenceFeatures, rows: np.ndarray, n_random: int = 5) -> dict[str, tuple[float, float]]:
    """Don't Shuffle, Optimize's prefix check: per family (clusters, length bins), the fraction of
    240 log-spaced prefixes t < M where the order's prefix error ||T(t) - tau S(t)|| / S(t) is below
    that of *each* of ``n_random`` shuffles, over all prefixes and over the last 90% of the stream."""
    from pipeline.reports.diagnostics import log_spaced_points, prefix_errors

    m = f.n_sequences
    t = log_spaced_points(m, 240)
    t = t[t < m]
    position = np.empty(m, dtype=np.int64)
    position[rows] = np.arange(m)
    shuffles = []
    for s in range(n_random):
        p = np.empty(m, dtype=np.int64)
        p[np.random.default_rng(100 + s).permutation(m)] = np.arange(m)
        shuffles.append(p)
    out = {}
    for kind, x in (("clusters", f.clusters), ("length_bins", f.bins)):
        comp = composition(np.repeat(np.arange(x.n_rows), np.diff(x.indptr)), x.indices, x.data, x.n_rows, x.n_cols)
        g = prefix_errors(comp, position, t)
        below = np.all(g[None, :] < np.stack([prefix_errors(comp, p, t) for p in shuffles]), axis=0)
        out[kind] = (float(below.mean()), float(below[t > 0.1 * m].mean()))
    return out


def test_blocked_greedy_keeps_every_prefix_on_target_where_independent_blocks_drift():
    """Issue 41's instance in small: 40 blocks of 500 sequences (K=100, L=256). Blocks ordered
    independently drift like a random walk, so past the first tenth they beat every shuffle at
    few prefixes; the tracked deal keeps the cumulative shares on target: below every shuffle at
    >= 98% of the last 90%'s prefixes. Over all prefixes the bar is 97%, not 99%: at this size the
    log-spaced grid has a prefix for each t <= 20 sequences, where the best of 5 shuffles can tie
    any order within a fraction of a percent (the exact greedy too loses one of them for clusters here)."""
    f = bench_instance(20_000, seed=4, k=100, seq_len=256)
    obj = Objective.named("stationary")
    old = below_random(f, independent_blocks_order(f, obj, 500))
    new = below_random(f, greedy_blocked_order(f, obj, greedy_block=500))
    for kind in ("clusters", "length_bins"):
        assert old[kind][1] < 0.8, old
        assert new[kind][0] >= 0.97 and new[kind][1] >= 0.98, new


def test_greedy_repair_false_is_the_papers_greedy():
    """``greedy_repair: false``: `greedy` in exact mode is the exact greedy's order, untouched; with
    the repair (the default) the worst batches get swaps, so the orders differ on this instance."""
    f = bench_instance(3_000, seed=6, k=50, length_bins=20)
    plain = greedy_order(f, F3)
    off = run_strategy_rows(f, OrderParams(objective="f3", length_bins=20, greedy_repair=False))
    on = run_strategy_rows(f, OrderParams(objective="f3", length_bins=20))
    assert np.array_equal(off, plain)
    assert not np.array_equal(on, plain)
    blocked = greedy_scaled_order(f, F3, greedy_exact_max=0, greedy_block=500, greedy_repair=False)[0]
    assert np.array_equal(blocked, greedy_blocked_order(f, F3, greedy_block=500))
    assert StrataConfig(greedy_repair=False).greedy_repair is False
    assert OrderParams.from_config(StrataConfig(greedy_repair=False)).greedy_repair is False


def run_strategy_rows(f: SequenceFeatures, params: OrderParams) -> np.ndarray:
    from pipeline.ordering import sequence_order

    return sequence_order("greedy", f, params, 0)
