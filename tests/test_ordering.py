"""Ordering engine: exactness against a brute-force f3 greedy, permutations, noise, curriculum,
quality on the demo corpus, and the two CLI commands."""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import scipy.stats

from pipeline.cli.schedule import run_cli
from pipeline.config import StrataConfig
from pipeline.errors import StrataInputError
from pipeline.ordering import (
    STRATEGIES,
    Objective,
    OrderParams,
    curriculum_from_dict,
    greedy_order,
    greedy_windowed_order,
    run_strategy,
    sequence_features,
    sequence_order,
    tie_tolerance,
)
from pipeline.ordering.composition import composition
from pipeline.ordering.curriculum import curriculum_greedy_order
from pipeline.ordering.documents import cluster_queues, stratified_order
from pipeline.ordering.features import quantile_classes
from pipeline.ordering.strategies.duplicate_separated import duplicate_subsets
from pipeline.ordering.strategies.greedy import block_shuffle, block_unshuffle, reseed_block_shuffle
from pipeline.packing.pack import pack_concat
from pipeline.reports.diagnostics import batch_deviations, prefix_errors, prepare, window_unique

SHARED = Path(os.environ.get("STRATA_SHARED", Path(__file__).resolve().parents[1].parent / "shared"))
CORPUS = SHARED / "data" / "corpus" / "demo_corpus.jsonl.gz"


def dense(x, m):
    out = np.zeros((m, x.n_cols))
    out[np.repeat(np.arange(m), np.diff(x.indptr)), x.indices] = x.data
    return out


def family_dense(f, fam, unit):
    """x^f of one family as a dense matrix and its row weights w^f_s, built here from the features."""
    m = f.n_sequences
    C = dense(f.clusters, m)
    if fam.name == "cluster":
        return C, C.sum(1)
    if fam.name == "length_bin":
        return dense(f.bins, m), C.sum(1)
    if fam.name == "norm":
        return np.sqrt((C**2).sum(1))[:, None], C.sum(1)
    if fam.level == "tokens":
        return dense(f.columns[fam.name], m), C.sum(1)
    value = {"concentration": np.sqrt((C**2).sum(1)) / C.sum(1), "documents": f.spans, "cluster_count": (C > 0).sum(1)}[fam.name]
    cls = quantile_classes(value, fam.classes)
    return np.eye(cls.max() + 1)[cls] * unit, np.full(m, unit)


def brute_force_greedy(f, obj: Objective) -> np.ndarray:
    """Reference: evaluate the greedy's objective for every unscheduled sequence at every step.

    f(s) = sum_families w_f sum_g [(X_g + x_sg) - t_g (W_f + w_f(s))]^2, t = the family's share
    (Don't Shuffle, Optimize f1/f2/f3; TerRIFIC curricula J_sched). Same documented tie rule as the
    library: scores within tie_tolerance of the minimum tie, the lowest row wins.
    """
    m = f.n_sequences
    unit = f.lengths.mean()
    fams = []
    for fam in obj.families:
        x, w = family_dense(f, fam, unit)
        fams.append((fam.weight, x, w, x.sum(0) / w.sum(), np.zeros(x.shape[1]), [0.0]))
    live = np.ones(m, bool)
    tol = tie_tolerance(max(f.lengths.max(), unit), obj.total_weight)
    out = []
    for _ in range(m):
        idx = np.flatnonzero(live)
        score = np.zeros(idx.size)
        for wt, x, w, t, X, W in fams:
            score += wt * (((X + x[idx]) - t * (W[0] + w[idx])[:, None]) ** 2).sum(1)
        s = idx[np.flatnonzero(score <= score.min() + tol)[0]]
        out.append(s)
        live[s] = False
        for _wt, x, w, _t, X, W in fams:
            X += x[s]
            W[0] += w[s]
    return np.array(out)


def packed_instance(rng, n_docs, seq_len, k, max_len, ties=False):
    if ties:  # equal-length documents of few clusters: many identical sequences
        lengths = np.full(n_docs, seq_len // 4)
        cluster = rng.integers(0, k, n_docs) // 2 * 2
    else:
        lengths = rng.integers(1, max_len, n_docs)
        cluster = rng.integers(0, k, n_docs)
    seg = pack_concat(np.arange(n_docs), lengths, seq_len).segments
    d = seg["doc_id"].to_numpy()
    return sequence_features(seg["sequence_id"].to_numpy(), cluster[d], lengths[d], seg["n_tokens"].to_numpy(), 12, d)


def variable_instance(rng, m, k):
    """Sequences of variable length l_s (TerRIFIC curricula) with 1-4 spans each, and a source column."""
    spans = rng.integers(1, 5, m)
    seq = np.repeat(np.arange(m), spans)
    return sequence_features(seq, rng.integers(0, k, seq.size), rng.integers(5, 400, seq.size), rng.integers(1, 50, seq.size), 10,
                             seg_columns={"source": rng.integers(0, 3, seq.size)})


def instances():
    rng = np.random.default_rng(2024)
    out = []
    for i in range(24):
        kind = i % 4
        if kind == 0:
            f = packed_instance(rng, int(rng.integers(200, 1500)), 64, int(rng.integers(2, 15)), 150)
        elif kind == 1:
            f = packed_instance(rng, int(rng.integers(400, 2400)), 64, int(rng.integers(4, 9)), 0, ties=True)
        elif kind == 2:
            f = variable_instance(rng, int(rng.integers(100, 1500)), int(rng.integers(2, 20)))
        else:
            f = packed_instance(rng, int(rng.integers(60, 400)), 32, 40, 300)
        objective = ["f3", "stationary", "custom", "f2", "stationary", "f1"][i % 6 if i < 20 else 0]
        families = ["cluster:0.5", "length_bin", "concentration:2:3", "documents:1:4", "norm:0.5"]
        if kind == 2 and objective == "custom":
            families += ["source:0.7"]
        out.append((f, objective, [1.0, 0.5, 2.0, 1.0][i % 4], families if objective == "custom" else []))
    return out


def test_exact_greedy_matches_brute_force():
    has_ties = 0
    seen = set()
    for f, objective, lam, families in instances():
        assert f.n_sequences <= 2000
        obj = Objective.named(objective, lam, families)
        seen |= {fam.name for fam in obj.families}
        fast = greedy_order(f, obj)
        ref = brute_force_greedy(f, obj)
        assert np.array_equal(fast, ref), (objective, f.n_sequences)
        key = np.round(dense(f.clusters, f.n_sequences), 6)
        has_ties += np.unique(key, axis=0).shape[0] < f.n_sequences
    assert has_ties >= 6  # instances with identical sequences (exact ties) are covered
    assert seen == {"cluster", "length_bin", "norm", "concentration", "documents", "cluster_count", "source"}


def test_windowed_mode_is_exact_when_the_pool_holds_everything():
    f = packed_instance(np.random.default_rng(3), 1500, 64, 7, 120)
    obj = Objective.named("f3", 1.0)
    assert np.array_equal(greedy_windowed_order(f, obj, window=f.n_sequences), greedy_order(f, obj))
    small = greedy_windowed_order(f, obj, window=64, seed=1)
    assert np.array_equal(np.sort(small), np.arange(f.n_sequences))


def toy_tables(rng, n=900, k=6, seq_len=128):
    lengths = rng.integers(2, 220, n)
    docs = pl.DataFrame(
        {"doc_id": np.arange(n), "cluster": rng.integers(0, k, n), "n_tokens": lengths, "content_hash": rng.integers(0, 700, n)}
    )
    return docs, pack_concat(np.arange(n), lengths, seq_len).segments


def test_every_strategy_returns_a_permutation(tmp_path):
    rng = np.random.default_rng(5)
    docs, seg = toy_tables(rng)
    knots = tmp_path / "cur.yaml"
    knots.write_text("knots:\n  - tokens: 1000\n    logits: {0: 2.0}\n  - tokens: 100000\n    logits: {5: 2.0}\n")
    weights = tmp_path / "weights.json"
    weights.write_text('{"0": 0.4, "3": 0.6}')
    from pipeline.ordering.blend import Blend

    blend = Blend("cluster", 0, (1.0,), ((("0", 0.4), ("3", 0.6)),))  # greedy_blend over the documents' cluster column
    params = OrderParams(length_bins=16, curriculum=str(knots), mixture_weights_file=str(weights), blend=blend)
    for name, strategy in STRATEGIES.items():
        res = run_strategy(name, docs, seg, 128, params, seed=1)
        assert res.order.columns == ["position", "sequence_id"]
        assert np.array_equal(res.order["position"].to_numpy(), np.arange(len(res.order)))
        if strategy.level == "sequence":
            assert res.segments is None
            packing = seg
        else:
            packing = res.segments
            # repacking keeps every document's tokens, except the incomplete last sequence
            kept = packing.group_by("doc_id").agg(pl.col("n_tokens").sum())
            parts = 1 if name != "duplicate_separated" else int(np.unique(docs["content_hash"], return_counts=True)[1].max())
            assert kept["doc_id"].n_unique() >= len(docs) - 4 * parts  # duplicate_separated packs each subset on its own
            assert int(packing["n_tokens"].sum()) > int(docs["n_tokens"].sum()) - 128 * parts
        ids = np.unique(packing["sequence_id"].to_numpy())
        if strategy.realizes_mixture:  # a schedule: packed ids, each at most max_sequence_copies times
            counts = np.bincount(res.order["sequence_id"].to_numpy())
            assert counts.size <= ids.size and counts.max() <= params.max_sequence_copies, name
            continue
        assert np.array_equal(np.sort(res.order["sequence_id"].to_numpy()), ids), name
    again = run_strategy("greedy_block_shuffle", docs, seg, 128, params, seed=1)
    assert again.order.equals(run_strategy("greedy_block_shuffle", docs, seg, 128, params, seed=1).order)


def test_each_strategy_reads_only_what_its_order_needs():
    """random reads the sequence ids alone, a document-level strategy no segments; each gives the
    order it gives from the whole inputs (the orderings asset reads segment_columns(name))."""
    from pipeline.ordering.engine import segment_columns

    docs, seg = toy_tables(np.random.default_rng(6))
    params = OrderParams(length_bins=16)

    def never():
        raise AssertionError("read although the strategy does not read it")

    assert segment_columns("random") == ["sequence_id"] and segment_columns("cluster_packed") == []
    assert segment_columns("random", frozen=True) == segment_columns("greedy") == ["sequence_id", "doc_id", "n_tokens"]
    ids_only = run_strategy("random", never, lambda: seg.select(segment_columns("random")), 128, params, seed=3)
    assert ids_only.order.equals(run_strategy("random", docs, seg, 128, params, seed=3).order)
    repacked = run_strategy("cluster_packed", docs, never, 128, params, seed=3)
    whole = run_strategy("cluster_packed", docs, seg, 128, params, seed=3)
    assert repacked.order.equals(whole.order) and repacked.segments.equals(whole.segments)
    with pytest.raises(StrataInputError, match="no `sequence_id` column"):
        run_strategy("random", never, lambda: seg.select("doc_id"), 128, params, seed=3)


def test_block_shuffle_keeps_greedy_blocks():
    f = packed_instance(np.random.default_rng(8), 1200, 64, 5, 100)
    p = OrderParams(batch_size=32)
    g = sequence_order("greedy", f, p, 0)
    b = sequence_order("greedy_block_shuffle", f, p, 0)
    blocks = {int(g[i]): g[i : i + 32] for i in range(0, g.size, 32)}  # first row -> block
    p, seen = 0, 0
    while p < b.size:  # b is the greedy blocks (the last one partial) in another order
        block = blocks[int(b[p])]
        assert np.array_equal(b[p : p + block.size], block)
        p, seen = p + block.size, seen + 1
    assert seen == len(blocks) and not np.array_equal(b, g)


def test_block_shuffle_matches_the_block_loop_and_inverts():
    rows = np.random.default_rng(3).permutation(103)
    for size, seed in ((32, 0), (32, 4), (1, 2), (103, 1), (200, 5)):
        blocks = np.random.default_rng(seed).permutation(-(-rows.size // size))
        loop = np.concatenate([rows[b * size : (b + 1) * size] for b in blocks])  # the former implementation
        shuffled = block_shuffle(rows, size, seed)
        assert shuffled.dtype == loop.dtype and np.array_equal(shuffled, loop)
        assert np.array_equal(block_unshuffle(shuffled, size, seed), rows)


def test_reseeded_block_shuffle_equals_rerunning_the_strategy():
    docs, seg = toy_tables(np.random.default_rng(6))
    params = OrderParams(length_bins=16, batch_size=16)
    base = run_strategy("greedy_block_shuffle", docs, seg, 128, params, seed=0).order["sequence_id"].to_numpy()
    assert np.array_equal(run_strategy("greedy", docs, seg, 128, params, seed=0).order["sequence_id"].to_numpy(),
                          run_strategy("greedy", docs, seg, 128, params, seed=3).order["sequence_id"].to_numpy())
    for seed in (1, 2, 7):
        again = run_strategy("greedy_block_shuffle", docs, seg, 128, params, seed=seed).order["sequence_id"].to_numpy()
        reseeded = reseed_block_shuffle(base, params, 0, seed)
        assert reseeded.dtype == again.dtype and np.array_equal(reseeded, again)
    assert reseed_block_shuffle(base, OrderParams(length_bins=16, batch_size=16, noise=0.5), 0, 1) is None  # noisy greedy: re-run
    assert reseed_block_shuffle(base, OrderParams(length_bins=16, batch_size=16, greedy_exact_max=10), 0, 1) is None  # blocked greedy


def test_noise_zero_is_deterministic_and_large_noise_is_a_shuffle():
    f = packed_instance(np.random.default_rng(11), 700, 64, 6, 120)
    obj = Objective.named("f3", 1.0)
    g = greedy_order(f, obj)
    assert np.array_equal(greedy_order(f, obj, noise=0.0, seed=9), g)
    assert np.array_equal(greedy_order(f, obj, noise=0.5, seed=3), greedy_order(f, obj, noise=0.5, seed=3))
    # rank correlation with the deterministic order: strong for small sigma, ~0 for huge sigma
    pos = np.empty(g.size)
    pos[g] = np.arange(g.size)
    small = np.corrcoef(pos[greedy_order(f, obj, noise=1e-3, seed=1)], np.arange(g.size))[0, 1]
    mid = np.corrcoef(pos[greedy_order(f, obj, noise=1.0, seed=1)], np.arange(g.size))[0, 1]
    huge = [np.corrcoef(pos[greedy_order(f, obj, noise=1e9, seed=s)], np.arange(g.size))[0, 1] for s in range(5)]
    assert small > 0.7 and small > mid > 0.1
    assert abs(np.mean(huge)) < 4 / np.sqrt(5 * g.size)  # |r| of independent orders ~ 1/sqrt(n)
    # the first pick under huge noise is uniform over the sequences (chi-square at p = 0.001)
    tiny = packed_instance(np.random.default_rng(12), 40, 64, 3, 60)
    k = tiny.n_sequences
    firsts = np.array([greedy_order(tiny, obj, noise=1e9, seed=s)[0] for s in range(40 * k)])
    counts = np.bincount(firsts, minlength=k)
    assert ((counts - 40.0) ** 2 / 40.0).sum() < scipy.stats.chi2.ppf(0.999, k - 1)
    assert counts[greedy_order(tiny, obj)[0]] < 80  # not stuck on the deterministic first pick


def test_constant_curriculum_equals_fixed_mixture_greedy():
    f = packed_instance(np.random.default_rng(21), 700, 64, 5, 120)
    tau = f.clusters.column_totals() / f.lengths.sum()
    cur = curriculum_from_dict({"knots": [{"tokens": 10, "logits": np.log(tau).tolist()}]}, 5)
    s = np.array([5.0, 900.0, 4e4])
    assert np.allclose(cur.cumulative(s), s[:, None] * tau)
    obj = Objective.named("f3", 1.0)
    assert np.array_equal(curriculum_greedy_order(f, cur, obj), greedy_order(f, obj))
    stationary = Objective.named("stationary", 1.0)  # the default's families are inherited
    assert np.array_equal(curriculum_greedy_order(f, cur, stationary), greedy_order(f, stationary))
    with pytest.raises(StrataInputError, match="source"):
        curriculum_greedy_order(f, cur, Objective.named("custom", 1.0, ["cluster", "source"]))


def test_curriculum_moves_clusters_in_time():
    f = packed_instance(np.random.default_rng(22), 900, 64, 2, 100)
    total = f.lengths.sum()
    # cluster 0 favoured early, cluster 1 late (knots at 25% and 75% of the tokens)
    cur = curriculum_from_dict({"knots": [{"tokens": total * 0.25, "logits": [3, -3]}, {"tokens": total * 0.75, "logits": [-3, 3]}]}, 2)
    e = cur.cumulative(np.array([total * 0.05, total * 0.9]))
    assert e[0, 0] > 0.9 * total * 0.05 and np.isclose(e.sum(1), [total * 0.05, total * 0.9]).all()
    order = curriculum_greedy_order(f, cur, Objective.named("f3", 1.0))
    c0 = dense(f.clusters, f.n_sequences)[:, 0] / f.lengths
    first, last = c0[order[: order.size // 5]].mean(), c0[order[-order.size // 5 :]].mean()
    assert first > 0.8 and last < 0.35


def test_curriculum_file_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"knots": [{"tokens": 10, "logits": {"7": 1}}]}))
    params = OrderParams(curriculum=str(bad))
    f = packed_instance(np.random.default_rng(1), 100, 64, 3, 50)
    with pytest.raises(StrataInputError, match="cluster 7"):
        sequence_order("greedy_curriculum", f, params, 0)
    with pytest.raises(StrataInputError, match="needs a curriculum"):
        sequence_order("greedy_curriculum", f, OrderParams(), 0)


def test_stratified_matches_reference_rule_by_hand_and_loop():
    # deficit_k = remaining_k/remaining_total - picked_k/picked_total, ties to the lowest cluster.
    # Clusters of docs 0..5: [2, 0, 1, 0, 2, 0] -> cluster 0 = docs 1, 3, 5; 1 = doc 2; 2 = docs 0, 4.
    # t0: P=0, remaining shares 3/6, 1/6, 2/6 -> cluster 0 (doc 1)
    # t1: 2/5-1/1, 1/5-0, 2/5-0 = -.6, .2, .4 -> cluster 2 (doc 0)
    # t2: 2/4-1/2, 1/4-0, 1/4-1/2 = 0, .25, -.25 -> cluster 1 (doc 2)
    # t3: 2/3-1/3, (1 empty), 1/3-1/3 = .33, 0 -> cluster 0 (doc 3)
    # t4: 1/2-2/4, 1/2-1/4 = 0, .25 -> cluster 2 (doc 4); t5: cluster 0 (doc 5)
    cluster = np.array([2, 0, 1, 0, 2, 0])
    assert stratified_order(cluster, np.ones(6, int)).tolist() == [1, 0, 2, 3, 4, 5]
    # (the global-share rule tau_k (t+1) - placed_k would pick cluster 0 at t2: 1.5-1 ties 0.5-0)
    assert stratified_order(np.array([1, 0]), np.ones(2, int)).tolist() == [1, 0]  # tie -> cluster 0 first
    rng = np.random.default_rng(4)
    cluster, length = rng.integers(0, 5, 400), rng.integers(1, 90, 400)
    queues = {j: [d for d in range(400) if cluster[d] == j] for j in range(5)}
    n = {j: len(q) for j, q in queues.items()}
    placed = dict.fromkeys(range(5), 0)
    ref = []
    from fractions import Fraction
    for t in range(400):
        def deficit(j, t=t):
            picked = Fraction(placed[j], t) if t else Fraction(0)
            return (Fraction(n[j] - placed[j], 400 - t) - picked, -j)
        j = max((j for j in range(5) if placed[j] < n[j]), key=deficit)
        ref.append(queues[j][placed[j]])
        placed[j] += 1
    assert np.array_equal(stratified_order(cluster, length), ref)
    q, ptr = cluster_queues(np.zeros(5, int), np.array([5, 1, 4, 2, 3]), "length-riffle")
    assert q.tolist() == [1, 0, 3, 2, 4]  # lengths 1, 5, 2, 4, 3
    q, _ = cluster_queues(np.zeros(5, int), np.array([5, 1, 4, 2, 3]), "length-desc")
    assert q.tolist() == [0, 2, 4, 3, 1]


def test_duplicate_subsets_are_duplicate_free_and_cluster_balanced():
    rng = np.random.default_rng(6)
    h = np.concatenate([np.arange(600), np.repeat([1000, 1001], [4, 3]), np.arange(50)])
    cluster = rng.integers(0, 3, h.size)
    sub = duplicate_subsets(h, cluster, seed=0)
    assert sub.max() == 3  # four copies at most -> four subsets
    for k in range(4):
        assert np.unique(h[sub == k]).size == (sub == k).sum()
    shares = np.array([[np.mean(cluster[sub == k] == j) for j in range(3)] for k in range(4)])
    assert np.abs(shares - shares.mean(0)).max() < 0.05


def test_bad_inputs_get_clear_errors():
    rng = np.random.default_rng(7)
    docs, seg = toy_tables(rng, n=60)
    with pytest.raises(StrataInputError, match="unknown ordering strategy"):
        run_strategy("shuffle", docs, seg, 128, OrderParams(), 0)
    with pytest.raises(StrataInputError, match="lambda"):
        run_strategy("greedy", docs, seg, 128, OrderParams(lam=-1), 0)
    with pytest.raises(StrataInputError, match="objective"):
        run_strategy("greedy", docs, seg, 128, OrderParams(objective="f4"), 0)
    with pytest.raises(StrataInputError, match="content_hash"):
        run_strategy("duplicate_separated", docs.drop("content_hash"), seg, 128, OrderParams(), 0)
    with pytest.raises(StrataInputError, match="missing from the documents"):
        run_strategy("greedy", docs.filter(pl.col("doc_id") < 30), seg, 128, OrderParams(), 0)


def test_document_arrays_on_every_thread_and_their_errors(monkeypatch):
    """The per-document arrays are built and checked in chunks of documents on every core: the
    same arrays as a plain scatter for ascending, shuffled and gapped doc ids of any integer dtype,
    on 1 and 2 threads with one document a chunk minimum; each bad input refused as before."""
    import numba
    from helpers import chunked_threads

    from pipeline.ordering.doc_arrays import document_arrays, names_absent

    rng = np.random.default_rng(5)
    ids = np.sort(rng.choice(400, 300, replace=False))
    cases = [(ids, np.int64), (rng.permutation(ids), np.int32), (np.arange(1), np.int64)]
    with chunked_threads(monkeypatch) as counts:
        for threads in counts:
            numba.set_num_threads(threads)
            for doc_id, dtype in cases:
                clus, ntok = rng.integers(0, 9, doc_id.size).astype(dtype), rng.integers(1, 50, doc_id.size).astype(dtype)
                want_c, want_l = np.full(doc_id.max() + 1, -1), np.zeros(doc_id.max() + 1, np.int64)
                want_c[doc_id], want_l[doc_id] = clus, ntok
                got_c, got_l = document_arrays(doc_id.astype(dtype), clus, ntok)
                np.testing.assert_array_equal(got_c, want_c)
                np.testing.assert_array_equal(got_l, want_l)
                assert got_c.dtype == got_l.dtype == np.int64
                assert not names_absent(doc_id, got_c) and names_absent(np.r_[doc_id, doc_id.max() + 1], got_c)
                if doc_id.size < want_c.size:
                    assert names_absent(np.flatnonzero(want_c < 0)[:1], got_c)
            one, ten = np.ones(10, np.int64), np.arange(10)
            for bad, message in (((ten[:0], ten[:0], ten[:0]), "no documents"), ((ten[::-1] - 1, one, one), "negative or repeated"),
                                 ((np.r_[ten[:9], 3], one, one), "negative or repeated"),
                                 ((ten[::-1] % 9, one, one), "negative or repeated"),
                                 ((ten, one - 2, one), "cluster id is negative"), ((ten, one, one - 1), "n_tokens <= 0")):
                with pytest.raises(StrataInputError, match=message):
                    document_arrays(*bad)


@pytest.fixture(scope="module")
def demo():
    if not CORPUS.exists():
        pytest.skip(f"demo corpus not found at {CORPUS} (set STRATA_SHARED)")
    rows = []
    with gzip.open(CORPUS, "rt", encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            if i % 10 == 0:  # a strided slice: the file is grouped by domain
                r = json.loads(line)
                rows.append((r["domain"], len(r["text"].split()) + 1))  # whitespace tokens + EOS
    domains = sorted({d for d, _ in rows})
    cluster = np.array([domains.index(d) for d, _ in rows])
    length = np.array([n for _, n in rows])
    docs = pl.DataFrame({"doc_id": np.arange(len(rows)), "cluster": cluster, "n_tokens": length})
    seg = pack_concat(np.arange(len(rows)), length, 256).segments  # original (file) order
    d = seg["doc_id"].to_numpy()
    f = sequence_features(seg["sequence_id"].to_numpy(), cluster[d], length[d], seg["n_tokens"].to_numpy(), 100, d)
    return docs, seg, f


def demo_schedule(demo, rows):
    """The diagnostics' view of an order of the demo's sequences, on the scheduler's own length bins."""
    docs, seg, f = demo
    sched = prepare(seg, rows, docs["cluster"].to_numpy(), docs["n_tokens"].to_numpy(), bin_edges=f.bin_edges)
    # the metrics see exactly the c_s and l_{s,b} the scheduler balanced
    for comp, x in ((sched.clusters, f.clusters), (sched.bins, f.bins)):
        assert comp.n_groups == x.n_cols and np.array_equal(comp.seq, np.repeat(np.arange(f.n_sequences), np.diff(x.indptr)))
        assert np.array_equal(comp.group, x.indices) and np.array_equal(comp.tokens, x.data)
    return sched


def test_demo_greedy_tracks_the_mixture_better_than_random(demo):
    """Don't Shuffle, Optimize's claims on the demo corpus (clusters = 8 domains, batch = 32 x 256 tokens).

    Prefix error: greedy is below random at every logged batch boundary after the first 4.
    Batch diversity: the strict claim "greedy's worst batch has more distinct clusters than
    random's best" does NOT hold here and cannot: random's best batch already holds all 8
    domains (the ceiling), while the rare domains (e.g. `science`, a handful of documents) lie in
    fewer sequences than there are batches, so no order can put them in every batch. We assert
    what can hold: greedy's worst batch misses at most those rare domains and is no worse than
    random's median batch. Length bins: greedy's worst batches (34 of 37 bins) are among its last,
    where few sequences remain to choose from; we assert its worst >= random's worst and its mean
    above random's mean.
    """
    _, _, f = demo
    g = demo_schedule(demo, sequence_order("greedy", f, OrderParams(), 0))
    r = demo_schedule(demo, sequence_order("random", f, OrderParams(), 0))
    points = np.arange(32, f.n_sequences, 32)
    eg, er = prefix_errors(g.clusters, g.position, points), prefix_errors(r.clusters, r.position, points)
    assert (eg[4:] < er[4:]).all()
    n_batches = f.n_sequences // 32  # full batches only
    dg, dr = window_unique(g.clusters, g.position, 32)[:n_batches], window_unique(r.clusters, r.position, 32)[:n_batches]
    k = g.clusters.n_groups
    seqs_per_cluster = np.bincount(g.clusters.group, minlength=k)
    rare = int((seqs_per_cluster < n_batches).sum())
    assert rare >= 1 and dr.max() == k
    assert dg.min() >= k - rare and dg.min() >= np.median(dr) and dg.mean() > dr.mean()
    bg, br = window_unique(g.bins, g.position, 32)[:n_batches], window_unique(r.bins, r.position, 32)[:n_batches]
    assert bg.min() >= br.min() and bg.mean() > br.mean()


def per_tenth(values: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Mean of a per-sequence value over each tenth of the order ``rows``."""
    return np.array([values[part].mean() for part in np.array_split(rows, 10)])


def test_demo_stationary_greedy_keeps_every_characteristic_in_random_band(demo):
    """Don't Shuffle, Optimize's goal: the data's characteristics constant throughout training.

    Computed here from the packing itself (not the library's diagnostics): distinct clusters,
    document spans, ||c_s||/l_s and token-weighted document length per sequence, by tenth of the
    stream. Random's band = min..max over 20 shuffles' tenths. f3 front-loads mixed sequences and
    leaves it; the default (stationary) stays inside, at a per-batch deviation within 1.1x of f3's.
    """
    docs, seg, f = demo
    m = f.n_sequences
    seq, d, tok = seg["sequence_id"].to_numpy(), seg["doc_id"].to_numpy(), seg["n_tokens"].to_numpy()
    C = dense(f.clusters, m)
    length = docs["n_tokens"].to_numpy()[d]
    values = {
        "clusters": (C > 0).sum(1).astype(float),
        "documents": np.bincount(seq, minlength=m).astype(float),
        "concentration": np.sqrt((C**2).sum(1)) / C.sum(1),
        "doc_length": np.bincount(seq, weights=tok * length, minlength=m) / np.bincount(seq, weights=tok, minlength=m),
    }
    shuffles = [np.random.default_rng(50 + i).permutation(m) for i in range(20)]
    band = {k: (min(per_tenth(v, r).min() for r in shuffles), max(per_tenth(v, r).max() for r in shuffles)) for k, v in values.items()}
    f3 = sequence_order("greedy", f, OrderParams(objective="f3", batch_size=32), 0)
    stationary = sequence_order("greedy", f, OrderParams(batch_size=32), 0)
    assert np.array_equal(np.sort(stationary), np.arange(m))
    first, last = per_tenth(values["clusters"], f3)[[0, -1]]
    assert first > band["clusters"][1] and last <= band["clusters"][0]  # f3 drifts from mixed to single-cluster
    for name, v in values.items():
        t = per_tenth(v, stationary)
        assert band[name][0] <= t.min() and t.max() <= band[name][1], (name, t, band[name])
    # per-batch deviation of the targeted shares: within 1.1x of f3's exact greedy (mean and worst batch)
    dev = lambda order: [batch_deviations(comp, np.argsort(order), 32) for comp in (  # noqa: E731
        composition(np.repeat(np.arange(m), np.diff(x.indptr)), x.indices, x.data, m, x.n_cols) for x in (f.clusters, f.bins))]
    for new, old in zip(dev(stationary), dev(greedy_order(f, Objective.named("f3")))):
        assert new.mean() <= 1.1 * old.mean() and new.max() <= 1.1 * old.max()


def test_families_parse_and_refuse_clearly():
    obj = Objective.named("custom", 1.0, ["cluster", "length_bin:0.5", "concentration:2:8", "source:0"])
    assert [str(fam) for fam in obj.families] == ["cluster:1", "length_bin:0.5", "concentration:2:8"]  # weight 0 dropped
    assert [fam.name for fam in Objective.named("stationary").families][:2] == ["cluster", "length_bin"]
    for bad, match in [("cluster:x", "cannot read"), ("length_bin:1:4", "takes no classes"), ("documents:1:1", "classes"),
                       ("cluster:-1", "weight")]:
        with pytest.raises(StrataInputError, match=match):
            Objective.named("custom", 1.0, [bad])
    with pytest.raises(StrataInputError, match="twice"):
        Objective.named("custom", 1.0, ["cluster", "cluster:2"])
    with pytest.raises(StrataInputError, match="both objective"):
        Objective.named("f3", 1.0, ["cluster"])
    with pytest.raises(StrataInputError, match="needs `families`"):
        Objective.named("custom", 1.0)
    f = packed_instance(np.random.default_rng(4), 100, 64, 3, 50)
    with pytest.raises(StrataInputError, match="no characteristic 'language'"):
        greedy_order(f, Objective.named("custom", 1.0, ["cluster", "language"]))
    docs, seg = toy_tables(np.random.default_rng(5), n=200)
    with pytest.raises(StrataInputError, match="names no column"):
        run_strategy("greedy", docs, seg, 128, OrderParams(objective="custom", families=("cluster", "language")), 0)


def test_a_documents_column_is_balanced_when_named():
    """A token family from a documents column (here `source`, unrelated to the clusters): with it,
    every prefix keeps the sources' token shares far closer than without it."""
    rng = np.random.default_rng(8)
    docs, seg = toy_tables(rng, n=1500, k=4)
    docs = docs.with_columns(source=pl.Series(rng.choice(["web", "code", "books"], docs.height, p=[0.6, 0.3, 0.1])))
    with_source = OrderParams(objective="custom", families=("cluster", "length_bin", "source"), length_bins=16)
    errors = []
    for params in (OrderParams(objective="f3", length_bins=16), with_source):
        order = run_strategy("greedy", docs, seg, 128, params, 0).order["sequence_id"].to_numpy()
        src = docs["source"].rank("dense").to_numpy().astype(np.int64)[seg["doc_id"].to_numpy()] - 1
        comp = composition(seg["sequence_id"].to_numpy(), src, seg["n_tokens"].to_numpy(), order.size, 3)
        position = np.empty(order.size, dtype=np.int64)
        position[order] = np.arange(order.size)
        errors.append(prefix_errors(comp, position, np.arange(16, order.size, 16)).mean())
    assert errors[1] < 0.2 * errors[0], errors


def test_demo_stratified_beats_original_on_clusters_per_sequence(demo):
    docs, seg, f = demo
    cluster = docs["cluster"].to_numpy()
    res = run_strategy("stratified", docs, seg, 256, OrderParams(), 0)

    def clusters_per_sequence(packing: pl.DataFrame) -> np.ndarray:
        seq = packing["sequence_id"].to_numpy()
        comp = composition(seq, cluster[packing["doc_id"].to_numpy()], packing["n_tokens"].to_numpy(), int(seq.max()) + 1,
                           int(cluster.max()) + 1)
        return comp.unique_per_sequence()

    orig, strat = clusters_per_sequence(seg), clusters_per_sequence(res.segments)
    assert orig.size == f.n_sequences and strat.min() >= 1
    assert strat.mean() > 1.5 * orig.mean()


def test_cli_schedule_and_schedule_docs(tmp_path, capsys):
    rng = np.random.default_rng(9)
    docs, seg = toy_tables(rng, n=500)
    cl, ln = docs["cluster"].to_numpy(), docs["n_tokens"].to_numpy()
    table = seg.select(
        "sequence_id",
        "doc_id",
        pl.Series("cluster", cl[seg["doc_id"].to_numpy()]),
        pl.Series("doc_length", ln[seg["doc_id"].to_numpy()]),
        "n_tokens",
    )
    table.write_parquet(tmp_path / "seg.parquet")
    out = tmp_path / "order.parquet"
    argv = ["schedule", str(tmp_path / "seg.parquet"), "--strategy", "greedy", "--out", str(out), "--length-bins", "16"]
    assert run_cli(argv + ["--lambda", "0.5", "--seed", "3"]) == 0
    order = pl.read_parquet(out)
    # the CLI's defaults are the config's
    expected = run_strategy("greedy", docs, seg, 128, replace(OrderParams.from_config(StrataConfig()), length_bins=16, lam=0.5), 3).order
    assert order.equals(expected)
    source = pl.Series("source", np.arange(500) % 3)[seg["doc_id"].to_numpy()]
    table.with_columns(source).write_parquet(tmp_path / "seg_src.parquet")
    families = "cluster,length_bin:0.5,source:2,documents:1:4"
    assert run_cli(["schedule", str(tmp_path / "seg_src.parquet"), "--out", str(out), "--bins", "16", "--objective", "custom",
                    "--families", families]) == 0
    params = replace(OrderParams.from_config(StrataConfig()), objective="custom", families=tuple(families.split(",")), length_bins=16)
    assert pl.read_parquet(out).equals(run_strategy("greedy", docs.with_columns(source=np.arange(500) % 3), seg, 128, params, 0).order)
    docs.select("doc_id", "cluster", "n_tokens").write_parquet(tmp_path / "docs.parquet")
    dout = tmp_path / "docs_order.parquet"
    run_cli(["schedule-docs", str(tmp_path / "docs.parquet"), "--out", str(dout), "--within", "length-riffle"])
    got = pl.read_parquet(dout)
    assert got.columns == ["position", "doc_id"] and np.array_equal(np.sort(got["doc_id"].to_numpy()), np.arange(500))
    assert np.array_equal(got["doc_id"].to_numpy(), stratified_order(cl, ln, "length-riffle"))
    table.drop("doc_length").write_parquet(tmp_path / "bad.parquet")
    with pytest.raises(StrataInputError, match="doc_length"):
        run_cli(["schedule", str(tmp_path / "bad.parquet"), "--out", str(out)])
    with pytest.raises(StrataInputError, match="does not exist"):
        run_cli(["schedule", str(tmp_path / "nope.parquet"), "--out", str(out)])


def test_cluster_sorted_dominant_cluster_is_token_weighted_with_ties_to_the_lowest_id():
    from pipeline.ordering.control import dominant_clusters

    # sequence 0: 3 tokens of cluster 0, 5 of cluster 1 -> 1; sequence 1: 8 of cluster 1 -> 1;
    # sequence 2: 4 of cluster 2, 4 of cluster 0 -> tie -> 0; sequence 3: 2 + 2 of cluster 2, 3 of cluster 1 -> 2
    seg = pl.DataFrame({"sequence_id": [0, 0, 1, 2, 2, 3, 3, 3], "doc_id": [0, 1, 2, 3, 4, 5, 6, 7],
                        "n_tokens": [3, 5, 8, 4, 4, 2, 2, 3]})
    ids, dom = dominant_clusters(seg, np.array([0, 1, 1, 2, 0, 2, 2, 1]))
    assert ids.tolist() == [0, 1, 2, 3] and dom.tolist() == [1, 1, 0, 2]


def test_cluster_sorted_groups_clusters_in_a_seeded_order():
    from pipeline.ordering.control import dominant_clusters
    from pipeline.ordering.engine import seed_dependent
    from pipeline.ordering.strategies import SEED_FREE

    rng = np.random.default_rng(3)
    docs, seg = toy_tables(rng, n=2000, k=6, seq_len=64)
    ids, dom = dominant_clusters(seg, docs["cluster"].to_numpy())
    dom_of = dict(zip(ids.tolist(), dom.tolist()))
    firsts = []
    for seed in (0, 1, 2, 3):
        res = run_strategy("cluster_sorted", docs, seg, 64, OrderParams(), seed)
        order = res.order["sequence_id"].to_numpy()
        assert res.segments is None and np.array_equal(np.sort(order), ids)  # the base packing, permuted
        runs = [dom_of[s] for s in order]
        changes = [c for i, c in enumerate(runs) if i == 0 or c != runs[i - 1]]
        assert sorted(changes) == sorted(set(dom.tolist()))  # every cluster is one contiguous block
        firsts.append(tuple(changes))
    assert len(set(firsts)) > 1  # the cluster order depends on the seed ...
    again = run_strategy("cluster_sorted", docs, seg, 64, OrderParams(), 1).order
    assert again.equals(run_strategy("cluster_sorted", docs, seg, 64, OrderParams(), 1).order)  # ... and only on it
    assert "cluster_sorted" not in SEED_FREE and seed_dependent("cluster_sorted", OrderParams())


def test_demo_cluster_sorted_trains_on_few_clusters_where_random_sees_all(demo):
    """The positive control's premise on the demo corpus (8 domains, 2,487 sequences): the first
    30 batches of 16 sequences (what `strata demo` trains on) come from at most 4 domains under
    cluster_sorted (a sequence's domain: its dominant one) for each of the demo's seeds, from all 8 under random."""
    from pipeline.ordering.control import dominant_clusters

    docs, seg, _ = demo
    ids, dom = dominant_clusters(seg, docs["cluster"].to_numpy())
    for seed in (0, 1, 2):
        seen = {}
        for name in ("cluster_sorted", "random"):
            order = run_strategy(name, docs, seg, 256, OrderParams(), seed).order["sequence_id"].to_numpy()[: 30 * 16]
            seen[name] = np.unique(dom[np.searchsorted(ids, order)]).size
        assert seen["random"] == 8 and seen["cluster_sorted"] <= 4, (seed, seen)


def _token_weighted_brute_force(cluster, length):
    """Idea 1 by its equation: every step scores every remaining document (ties: cluster, length, doc id)."""
    cluster, length = np.asarray(cluster), np.asarray(length)
    tau = np.bincount(cluster, weights=length) / length.sum()
    T, S, left, out = np.zeros(tau.size), 0.0, list(range(cluster.size)), []
    while left:
        score = [abs((T[cluster[d]] + length[d]) - tau[cluster[d]] * (S + length[d])) for d in left]
        d = min(zip(score, (cluster[d] for d in left), (length[d] for d in left), left))[3]
        out.append(d)
        left.remove(d)
        T[cluster[d]] += length[d]
        S += length[d]
    return out


def test_token_weighted_is_the_argmin_over_all_remaining_documents():
    from pipeline.ordering.documents import token_weighted_order

    # by hand: tau = (10/16, 6/16). Step 1 scores |l - tau_c l| = l (1 - tau_c): doc0 2.25, doc1 1.125, doc2 0.375,
    # doc3 3.75; the argmin over all documents picks doc2 (a rule that scores only each cluster's next document,
    # doc0 and doc3, picks doc0)
    cluster, length = np.array([0, 0, 0, 1]), np.array([6, 3, 1, 6])
    assert token_weighted_order(cluster, length).tolist() == _token_weighted_brute_force(cluster, length)
    assert token_weighted_order(cluster, length).tolist()[0] == 2
    rng = np.random.default_rng(7)
    for case in range(40):
        n, k = int(rng.integers(1, 60)), int(rng.integers(1, 6))
        cluster = rng.integers(0, k, n)
        cluster[: min(k, n)] = np.arange(min(k, n))  # dense cluster ids
        length = rng.integers(1, 30 if case % 2 else 400, n)
        assert token_weighted_order(cluster, length).tolist() == _token_weighted_brute_force(cluster, length), case


def test_document_count_length_bins_are_reachable_from_the_config():
    """``length_bin_weighting: documents`` reaches the greedy's features: 6 documents of 2 tokens and 2 of 10,
    B = 2. Token quantiles: half the 32 tokens is reached only at length 10, the longest, so one bin;
    document quantiles: the 4th of 8 documents has length 2, so bins (.., 2] and (2, ..]."""
    from pipeline.config import config_from_dict
    from pipeline.ordering.engine import Inputs, OrderParams

    length = np.array([2, 2, 2, 2, 2, 2, 10, 10])
    seg = pl.DataFrame({"sequence_id": np.arange(8), "doc_id": np.arange(8), "n_tokens": length})
    edges = {}
    for weighting in ("tokens", "documents"):
        params = OrderParams.from_config(config_from_dict({"length_bins": 2, "length_bin_weighting": weighting}))
        inp = Inputs(np.zeros(8, dtype=np.int64), length, np.arange(8), None, seg, 16, params, 0, {})
        edges[weighting] = inp.features().bin_edges.tolist()
    assert edges == {"tokens": [], "documents": [2]}


def _idea2_brute_force(ids, c):
    """Don't Shuffle, Optimize Idea 2 by its equation on sequences ``ids`` with cluster tokens ``c`` (rows):
    argmin_s sum_i [(T_i + l_si) - tau_i (S + l_s)]^2, ties (within the greedy's 1e-9 L^2 tolerance) to the lowest id."""
    tau = c.sum(0) / c.sum()
    T, S, left, out = np.zeros(c.shape[1]), 0.0, list(range(len(ids))), []
    while left:
        score = np.array([(((T + c[r]) - tau * (S + c[r].sum())) ** 2).sum() for r in left])
        tol = 1e-9 * max(c[r].sum() for r in left) ** 2
        r = min(r for r, v in zip(left, score) if v <= score.min() + tol)
        out.append(ids[r])
        left.remove(r)
        T += c[r]
        S += c[r].sum()
    return out


def test_duplicate_separated_packs_each_subset_alone_and_orders_it_by_idea2():
    rng = np.random.default_rng(11)
    n = 160
    lengths = rng.integers(3, 60, n)
    h = np.arange(n)
    h[120:] = h[:40]  # 40 documents appear twice: two subsets
    docs = pl.DataFrame({"doc_id": np.arange(n), "cluster": rng.integers(0, 4, n), "n_tokens": lengths, "content_hash": h})
    seg = pack_concat(np.arange(n), lengths + 1, 64).segments
    res = run_strategy("duplicate_separated", docs, seg, 64, OrderParams(duplicate_order="idea2"), seed=3)
    sub = duplicate_subsets(h, docs["cluster"].to_numpy(), 3)
    packed = res.segments.with_columns(pl.Series("subset", sub[res.segments["doc_id"].to_numpy()]))
    per_seq = packed.group_by("sequence_id").agg(pl.col("subset").n_unique().alias("n"), pl.col("subset").first())
    assert per_seq["n"].max() == 1  # no sequence mixes two subsets
    order = res.order["sequence_id"].to_numpy()
    subset_of = dict(zip(per_seq["sequence_id"].to_list(), per_seq["subset"].to_list()))
    assert [subset_of[s] for s in order] == sorted(subset_of[s] for s in order)  # subsets concatenated in order
    cl = docs["cluster"].to_numpy()
    for k in (0, 1):
        part = packed.filter(pl.col("subset") == k)
        ids = np.unique(part["sequence_id"].to_numpy())
        c = np.zeros((ids.size, 4))
        np.add.at(c, (np.searchsorted(ids, part["sequence_id"].to_numpy()), cl[part["doc_id"].to_numpy()]), part["n_tokens"].to_numpy())
        assert [s for s in order if subset_of[s] == k] == _idea2_brute_force(ids.tolist(), c), k
    default = run_strategy("duplicate_separated", docs, seg, 64, OrderParams(), seed=3)
    assert default.segments.equals(res.segments) and not default.order.equals(res.order)  # the stationary greedy orders otherwise


def test_schedule_cli_defaults_are_the_configs_and_old_flags_still_parse():
    """`strata schedule`'s options are named as the config keys and default to the config's values."""
    import argparse

    from pipeline.cli.schedule import _params, register
    from pipeline.config import StrataConfig

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    default = _params(parser.parse_args(["schedule", "s.parquet", "--out", "o.parquet"]))
    assert default == OrderParams.from_config(StrataConfig())
    assert (default.batch_size, default.length_bins) == (StrataConfig().batch_size, StrataConfig().length_bins)
    new = _params(parser.parse_args(["schedule", "s.parquet", "--out", "o", "--length-bins", "7", "--batch-size", "5"]))
    old = _params(parser.parse_args(["schedule", "s.parquet", "--out", "o", "--bins", "7", "--block-size", "5",
                                     "--bin-weighting", "documents"]))
    assert (new.length_bins, new.batch_size) == (old.length_bins, old.batch_size) == (7, 5)
    assert old.length_bin_weighting == "documents"
    docs = parser.parse_args(["schedule-docs", "d.parquet", "--out", "o"])
    assert docs.seq_len == StrataConfig().seq_len and _params(docs).within == StrataConfig().within
