"""Ordering diagnostics: hand-computed values on tiny orderings and a brute-force reference."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from pipeline.reports import diagnostics as D
from pipeline.errors import StrataInputError
from pipeline.packing.pack import pack_concat

# ---------------------------------------------------------------------------------------------
# The tiny instance, worked out by hand.
# seq_len 4; documents (stream length, cluster): d0 (3, c0), d1 (2, c1), d2 (3, c0), d3 (4, c2).
# Packed in doc order 0,1,2,3 the stream is  d0 d0 d0 d1 | d1 d2 d2 d2 | d3 d3 d3 d3
#   seq0: c0 3, c1 1      seq1: c1 1, c0 3      seq2: c2 4          (12 tokens)
# tau = (6/12, 2/12, 4/12) = (1/2, 1/6, 1/3).
# Ordering: seq2, seq0, seq1 (positions 0, 1, 2).
# ---------------------------------------------------------------------------------------------

LENGTHS = np.array([3, 2, 3, 4])
CLUSTERS = np.array([0, 1, 0, 2])
ORDER = np.array([2, 0, 1])


@pytest.fixture()
def tiny() -> D.Schedule:
    packing = pack_concat(np.arange(4), LENGTHS, 4)
    assert packing.n_sequences == 3
    ordering = pl.DataFrame({"position": [2, 0, 1], "sequence_id": [1, 2, 0]})  # = ORDER, rows shuffled
    return D.prepare(packing.segments, ordering, CLUSTERS, LENGTHS, n_bins=2)


def test_tiny_unique_clusters(tiny):
    # unique clusters per sequence: seq0 2, seq1 2, seq2 1 -> mean 5/3, min 1, max 2,
    # population std sqrt(((1/3)^2 * 2 + (2/3)^2) / 3) = sqrt(2)/3
    rows = {r[1]: r[3] for r in D.diversity_rows("x", tiny)}
    assert rows["unique_clusters_per_seq_mean"] == pytest.approx(5 / 3)
    assert rows["unique_clusters_per_seq_min"] == 1
    assert rows["unique_clusters_per_seq_max"] == 2
    assert rows["unique_clusters_per_seq_std"] == pytest.approx(math.sqrt(2) / 3)


def test_tiny_batch_deviation(tiny):
    # batch size 1: [seq2] shares (0,0,1): max(|0-1/2|, |0-1/6|, |1-1/3|) = 2/3
    #               [seq0] (3/4,1/4,0): max(1/4, 1/12, 1/3) = 1/3;  [seq1] same = 1/3
    np.testing.assert_allclose(D.batch_deviations(tiny.clusters, tiny.position, 1), [2 / 3, 1 / 3, 1 / 3])
    # batch size 2: one full batch [seq2, seq0]: (3/8, 1/8, 4/8) -> max(1/8, 1/24, 1/6) = 1/6;
    # seq1 is an incomplete last batch and is left out
    np.testing.assert_allclose(D.batch_deviations(tiny.clusters, tiny.position, 2), [1 / 6])
    assert D.batch_deviations(tiny.clusters, tiny.position, 4).size == 0
    rows = {(r[1], r[2]): r[3] for r in D.batch_rows("x", tiny, (1,))}
    assert rows[("batch_dev_clusters_max", "batch=1")] == pytest.approx(2 / 3)
    assert rows[("batch_dev_clusters_mean", "batch=1")] == pytest.approx(4 / 9)
    assert rows[("batch_dev_clusters_best", "batch=1")] == pytest.approx(1 / 3)
    assert rows[("batch_dev_clusters_worst_batch", "batch=1")] == 0
    assert rows[("batch_dev_clusters_best_batch", "batch=1")] == 1


def test_tiny_length_bins(tiny):
    # token-weighted B=2: sorted lengths 2,3,3,4, cumulative tokens 2,5,8,12; half = 6 is first
    # reached at length 3 -> edges [3]: d0,d1,d2 in bin 0, d3 in bin 1; kappa = (8/12, 4/12)
    np.testing.assert_array_equal(tiny.bin_edges, [3])
    np.testing.assert_allclose(tiny.bins.global_share(), [2 / 3, 1 / 3])
    # batch size 1: seq2 all bin 1 -> 2/3; seq0 and seq1 all bin 0 -> 1/3
    np.testing.assert_allclose(D.batch_deviations(tiny.bins, tiny.position, 1), [2 / 3, 1 / 3, 1 / 3])


def test_tiny_prefix_error(tiny):
    # t=1: T=(0,0,4), S=4, tau S=(2,2/3,4/3): ||(-2,-2/3,8/3)|| = sqrt(104)/3, / 4
    # t=2: T=(3,1,4), S=8, tau S=(4,4/3,8/3): ||(-1,-1/3,4/3)|| = sqrt(26)/3, / 8;  t=3: 0
    err = D.prefix_errors(tiny.clusters, tiny.position, np.array([1, 2, 3]))
    np.testing.assert_allclose(err, [math.sqrt(104) / 12, math.sqrt(26) / 24, 0.0], atol=1e-15)
    # length bins: t=1: U=(0,4), kappa S=(8/3,4/3): sqrt(2)*8/3 / 4;  t=2: U=(4,4) vs (16/3,8/3)
    err_b = D.prefix_errors(tiny.bins, tiny.position, np.array([1, 2]))
    np.testing.assert_allclose(err_b, [math.sqrt(2) * 2 / 3, math.sqrt(2) * 4 / 3 / 8])


def test_tiny_drift_window_curriculum(tiny):
    # thirds of the schedule: [seq2] tokens all from d3 (length 4), ||c||=4;
    # [seq0] 3 tokens of d0 (len 3) + 1 of d1 (len 2): 11/4, ||(3,1)||=sqrt(10); [seq1] the same
    length, norm = D.decile_drift(tiny, 3)
    np.testing.assert_allclose(length, [4, 11 / 4, 11 / 4])
    np.testing.assert_allclose(norm, [4, math.sqrt(10), math.sqrt(10)])
    # windows of 2 sequences: {seq2, seq0} -> clusters {2, 0, 1}; {seq1} -> {1, 0}
    np.testing.assert_array_equal(D.window_unique(tiny.clusters, tiny.position, 2), [3, 2])
    np.testing.assert_array_equal(D.window_unique(tiny.clusters, tiny.position, 1), [1, 2, 2])
    # curriculum: realized share after 1 sequence (0,0,1), after 3 (1/2,1/6,1/3); at t=1 the
    # error vector is (-1/3,-1/3,2/3): max 2/3, L2 sqrt(1/9+1/9+4/9)
    target = np.array([[1 / 3, 1 / 3, 1 / 3], [0.5, 1 / 6, 1 / 3]])
    rows = {(r[1], r[2]): r[3] for r in D.curriculum_rows("x", tiny, np.array([1, 3]), target)}
    assert rows[("curriculum_max_error", "t=1")] == pytest.approx(2 / 3)
    assert rows[("curriculum_l2_error", "t=1")] == pytest.approx(math.sqrt(6 / 9))
    assert rows[("curriculum_max_error", "t=3")] == pytest.approx(0, abs=1e-15)
    assert rows[("curriculum_realized_share", "t=1;cluster=2")] == 1.0
    with pytest.raises(StrataInputError):
        D.curriculum_rows("x", tiny, np.array([1, 3]), target[:, :2])


def test_length_bin_edges_by_hand():
    # tokens: lengths 1,2,3,4,10, cumulative 1,3,6,10,20; quarters 5,10,15 first reached at
    # 3, 4, 10; the cut at the maximum (10) would leave an empty last bin and is dropped
    edges = D.length_bin_edges(np.array([10, 1, 4, 2, 3]), 4)
    np.testing.assert_array_equal(edges, [3, 4])
    np.testing.assert_array_equal(D.length_bins(np.array([1, 2, 3, 4, 10]), edges), [0, 0, 0, 1, 2])
    # one long document holds most tokens: token quantiles give a single bin, document
    # quantiles (half of 5 documents = 2.5 -> third document, length 1) split short vs long
    lengths = np.array([1, 1, 1, 1, 10])
    assert D.length_bin_edges(lengths, 2).size == 0
    np.testing.assert_array_equal(D.length_bin_edges(lengths, 2, weighting="documents"), [1])
    with pytest.raises(StrataInputError):
        D.length_bin_edges(np.array([3, 0]), 2)
    with pytest.raises(StrataInputError):
        D.length_bin_edges(lengths, 0)


def test_bad_orderings_raise():
    packing = pack_concat(np.arange(4), LENGTHS, 4)
    for bad in (np.array([0, 0, 1]), np.array([0, 1, 3]), np.array([], dtype=np.int64)):
        with pytest.raises(StrataInputError):
            D.prepare(packing.segments, bad, CLUSTERS, LENGTHS, n_bins=2)
    with pytest.raises(StrataInputError):
        D.prepare(packing.segments, pl.DataFrame({"sequence_id": [0, 1, 2]}), CLUSTERS, LENGTHS)
    with pytest.raises(StrataInputError):
        D.prepare(packing.segments, ORDER, CLUSTERS[:3], LENGTHS, n_bins=2)


# ---------------------------------------------------------------------------------------------
# Brute force: plain Python loops over segments, sequences and positions.
# ---------------------------------------------------------------------------------------------


def brute(segments: pl.DataFrame, order, doc_group, doc_length, n_groups, batch_sizes, n_parts):
    comp = [dict() for _ in order]  # comp[s][group] = tokens
    lens = [[] for _ in order]  # (tokens, document length) per sequence
    for sid, did, n in zip(segments["sequence_id"], segments["doc_id"], segments["n_tokens"]):
        g = int(doc_group[did])
        comp[sid][g] = comp[sid].get(g, 0) + n
        lens[sid].append((n, int(doc_length[did])))
    total = sum(sum(c.values()) for c in comp)
    tau = [sum(c.get(j, 0) for c in comp) / total for j in range(n_groups)]
    unique = [len(comp[s]) for s in order]  # in schedule order
    batches = {}
    for bs in batch_sizes:
        devs = []
        for b in range(len(order) // bs):
            cnt = [0] * n_groups
            for s in order[b * bs : (b + 1) * bs]:
                for j, n in comp[s].items():
                    cnt[j] += n
            tot = sum(cnt)
            devs.append(max(abs(cnt[j] / tot - tau[j]) for j in range(n_groups)))
        batches[bs] = devs
    prefix, T, S = [], [0] * n_groups, 0
    for s in order:
        for j, n in comp[s].items():
            T[j] += n
            S += n
        prefix.append(math.sqrt(sum((T[j] - tau[j] * S) ** 2 for j in range(n_groups))) / S)
    m = len(order)
    n_parts = min(n_parts, m)
    num, den, norm_sum, count = [0.0] * n_parts, [0.0] * n_parts, [0.0] * n_parts, [0] * n_parts
    for p, s in enumerate(order):
        part = p * n_parts // m
        for n, length in lens[s]:
            num[part] += n * length
            den[part] += n
        norm_sum[part] += math.sqrt(sum(v * v for v in comp[s].values()))
        count[part] += 1
    drift_len = [a / b for a, b in zip(num, den)]
    drift_norm = [a / b for a, b in zip(norm_sum, count)]
    return unique, batches, prefix, drift_len, drift_norm


@pytest.mark.parametrize("seed", range(12))
def test_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    n_docs = int(rng.integers(5, 120))
    k = int(rng.integers(1, 25))
    lengths = rng.integers(1, 60, n_docs) * (1 + 9 * (rng.random(n_docs) < 0.1))
    clusters = rng.integers(0, k, n_docs)
    seq_len = int(rng.integers(4, 64))
    packing = pack_concat(rng.permutation(n_docs), lengths, seq_len)
    m = packing.n_sequences
    if m == 0:
        pytest.skip("instance too small to fill a sequence")
    order = rng.permutation(m)
    n_bins = int(rng.integers(1, 8))
    sched = D.prepare(packing.segments, order, clusters, lengths, n_bins=n_bins, n_clusters=k)
    batch_sizes = (1, 2, 3, 5)
    doc_bin = D.length_bins(lengths, sched.bin_edges)
    for comp, groups, n_groups in ((sched.clusters, clusters, k), (sched.bins, doc_bin, sched.bin_edges.size + 1)):
        unique, batches, prefix, drift_len, drift_norm = brute(
            packing.segments, list(order), groups, lengths, n_groups, batch_sizes, 10
        )
        np.testing.assert_array_equal(D.window_unique(comp, sched.position, 1), unique)
        for bs in batch_sizes:
            np.testing.assert_allclose(D.batch_deviations(comp, sched.position, bs), batches[bs], atol=1e-12)
        t = np.arange(1, m + 1)
        np.testing.assert_allclose(D.prefix_errors(comp, sched.position, t), prefix, atol=1e-12)
    length, norm = D.decile_drift(sched, 10)
    _, _, _, drift_len, drift_norm = brute(packing.segments, list(order), clusters, lengths, k, (), 10)
    np.testing.assert_allclose(length, drift_len, equal_nan=True)
    np.testing.assert_allclose(norm, drift_norm, equal_nan=True)


def test_ordering_diagnostics_frame_and_determinism():
    rng = np.random.default_rng(7)
    lengths = rng.integers(1, 300, 3000)
    clusters = rng.integers(0, 12, 3000)
    packing = pack_concat(np.arange(3000), lengths, 128)
    order = rng.permutation(packing.n_sequences)
    at = np.array([10, packing.n_sequences])
    target = np.full((2, 12), 1 / 12)
    frames = [
        D.ordering_diagnostics(
            "random", D.prepare(packing.segments, order, clusters, lengths, n_bins=10), curriculum=(at, target)
        )
        for _ in range(2)
    ]
    assert frames[0].equals(frames[1])
    df = frames[0]
    assert df.schema == pl.Schema(D.METRIC_SCHEMA)
    metrics = set(df["metric"])
    for name in ("unique_clusters_per_seq_mean", "batch_dev_clusters_p95", "batch_dev_length_bins_max",
                 "prefix_error_clusters", "prefix_error_length_bins", "drift_doc_length", "drift_cluster_l2",
                 "curriculum_max_error"):
        assert name in metrics
    assert set(df.filter(pl.col("metric") == "batch_dev_clusters_max")["setting"]) == {"batch=8", "batch=32", "batch=128"}
    assert df.filter(pl.col("metric") == "drift_doc_length").height == 10


def test_corpus_diagnostics():
    # clusters 0,0,1,1 over lengths 2,3,4,5: sizes 2 docs each, tokens 5 and 9
    x = np.array([[1.0, 0.0], [1.0, 0.1], [0.0, 1.0], [0.1, 1.0]])
    cl = np.array([0, 0, 1, 1])
    df = D.corpus_diagnostics(cl, np.array([2, 3, 4, 5]), embeddings=x, labels=np.array(["a", "a", "b", "b"]))
    rows = {(r[1], r[2]): r[3] for r in df.iter_rows()}
    assert rows[("cluster_docs", "cluster=0")] == 2 and rows[("cluster_tokens", "cluster=1")] == 9
    assert rows[("ari_vs_labels", "")] == pytest.approx(1.0) and rows[("nmi_vs_labels", "")] == pytest.approx(1.0)
    # brute-force cosine silhouette over all four points
    dist = 1 - (x @ x.T) / np.outer(np.linalg.norm(x, axis=1), np.linalg.norm(x, axis=1))
    sil = []
    for i in range(4):
        a = np.mean([dist[i, j] for j in range(4) if cl[j] == cl[i] and j != i])
        b = np.mean([dist[i, j] for j in range(4) if cl[j] != cl[i]])
        sil.append((b - a) / max(a, b))
    assert rows[("silhouette_cosine", "sample=4;seed=0")] == pytest.approx(np.mean(sil))


def test_label_codes_are_the_dense_ranks_of_the_labels(tmp_path):
    """Codes read through the Parquet dictionary (no string per row) equal the dense rank of the
    labels as strings, a missing label ranking as "", across row groups with different labels."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.reports.visual import label_codes

    labels = ["web", "code", None, "books", "web", "zeta", "", "code", "arxiv", None] * 30
    path = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"source": pa.array(labels, pa.string())}), path, row_group_size=7)
    want = (pl.Series(labels, dtype=pl.Utf8).fill_null("").rank("dense") - 1).to_numpy()
    assert np.array_equal(label_codes(path, "source"), want)
    rows = {"sequence_id": [0, 0, 1], "doc_id": [0, 1, 2], "n_tokens": [3, 2, 5]}
    seg = pl.DataFrame(rows)
    cluster, length = np.array([0, 1, 1]), np.array([3, 2, 5])
    by_text = D.prepare(seg, np.array([1, 0]), cluster, length, n_bins=2, doc_source=np.array(["b", "a", "b"]))
    by_code = D.prepare(seg, np.array([1, 0]), cluster, length, n_bins=2, doc_source=np.array([7, 3, 7]))
    assert np.array_equal(by_text.doc_source, [1, 0, 1]) and np.array_equal(by_code.doc_source, [1, 0, 1])
