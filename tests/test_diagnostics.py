"""Ordering diagnostics: hand-computed values on tiny orderings and a brute-force reference."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from pipeline.errors import StrataInputError
from pipeline.ordering.composition import composition
from pipeline.packing.pack import pack_concat
from pipeline.reports import diagnostics as D

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
    return D.prepare(packing.segments, ordering, CLUSTERS, LENGTHS, length_bins=2)


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
    np.testing.assert_array_equal(D.length_bin_of(np.array([1, 2, 3, 4, 10]), edges), [0, 0, 0, 1, 2])
    # one long document holds most tokens: token quantiles give a single bin, document
    # quantiles (half of 5 documents = 2.5 -> third document, length 1) split short vs long
    lengths = np.array([1, 1, 1, 1, 10])
    assert D.length_bin_edges(lengths, 2).size == 0
    np.testing.assert_array_equal(D.length_bin_edges(lengths, 2, length_bin_weighting="documents"), [1])
    with pytest.raises(StrataInputError):
        D.length_bin_edges(np.array([3, 0]), 2)
    with pytest.raises(StrataInputError):
        D.length_bin_edges(lengths, 0)


def test_counted_length_bins_equal_sorted_quantiles_and_binary_search():
    """Lengths up to COUNTED_MAX are counted and binned through a table: the edges the document-by-
    document mass of the sorted lengths gives, and the bins a binary search of each length gives
    (ties, one length, heavy tails; lengths past the table's reach take the sorted path)."""
    from pipeline.ordering.features import COUNTED_MAX

    rng = np.random.default_rng(4)
    for trial in range(120):
        n = int(rng.integers(1, 3000))
        lengths = [rng.lognormal(4, 2, n).astype(np.int64) + 1, rng.integers(1, int(rng.integers(2, 40)), n), np.full(n, 7),
                   rng.integers(1, 2 * COUNTED_MAX, n)][trial % 4]
        for weighting in ("tokens", "documents"):
            for n_bins in (1, 3, 16, 100):
                srt = np.sort(lengths)
                mass = np.cumsum(srt if weighting == "tokens" else np.ones_like(srt))
                cut = np.unique(srt[np.searchsorted(mass, np.arange(1, n_bins) / n_bins * mass[-1], side="left")])
                edges = D.length_bin_edges(lengths, n_bins, weighting)
                np.testing.assert_array_equal(edges, cut[cut < srt[-1]])
                np.testing.assert_array_equal(D.length_bin_of(lengths, edges), np.searchsorted(edges, lengths, side="left"))


def test_bad_orderings_raise():
    packing = pack_concat(np.arange(4), LENGTHS, 4)
    for bad in (np.array([0, 0, 1]), np.array([0, 1, 3]), np.array([], dtype=np.int64)):
        with pytest.raises(StrataInputError):
            D.prepare(packing.segments, bad, CLUSTERS, LENGTHS, length_bins=2)
    with pytest.raises(StrataInputError):
        D.prepare(packing.segments, pl.DataFrame({"sequence_id": [0, 1, 2]}), CLUSTERS, LENGTHS)
    with pytest.raises(StrataInputError):
        D.prepare(packing.segments, ORDER, CLUSTERS[:3], LENGTHS, length_bins=2)


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
    sched = D.prepare(packing.segments, order, clusters, lengths, length_bins=n_bins, n_clusters=k)
    batch_sizes = (1, 2, 3, 5)
    doc_bin = D.length_bin_of(lengths, sched.bin_edges)
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
            "random", D.prepare(packing.segments, order, clusters, lengths, length_bins=10), curriculum=(at, target)
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

    from pipeline.storage.documents import int_values, label_codes

    labels = ["web", "code", None, "books", "web", "zeta", "", "code", "arxiv", None] * 30
    path = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"source": pa.array(labels, pa.string())}), path, row_group_size=7)
    want = (pl.Series(labels, dtype=pl.Utf8).fill_null("").rank("dense") - 1).to_numpy()
    assert np.array_equal(label_codes(path, "source"), want)
    assert np.array_equal(label_codes(path, "source", batch_rows=3), want)  # some batches without a missing label
    for kind in (pa.int8(), pa.int16(), pa.int32(), pa.int64()):  # the values of a slice, without pyarrow's to_numpy
        assert int_values(pa.array([5, -1, 7, 9, 2], kind).slice(2, 2)).tolist() == [7, 9]
    rows = {"sequence_id": [0, 0, 1], "doc_id": [0, 1, 2], "n_tokens": [3, 2, 5]}
    seg = pl.DataFrame(rows)
    cluster, length = np.array([0, 1, 1]), np.array([3, 2, 5])
    by_text = D.prepare(seg, np.array([1, 0]), cluster, length, length_bins=2, doc_source=np.array(["b", "a", "b"]))
    by_code = D.prepare(seg, np.array([1, 0]), cluster, length, length_bins=2, doc_source=np.array([7, 3, 7]))
    assert np.array_equal(by_text.doc_source, [1, 0, 1]) and np.array_equal(by_code.doc_source, [1, 0, 1])


# ---------------------------------------------------------------------------------------------
# The parallel kernels: any chunking and any thread count give the sequential pass's output, bit
# for bit (checked against plain NumPy: the same integer sums, floating-point sums in row order).
# ---------------------------------------------------------------------------------------------

CHUNKS = (1, 2, 3, 8, 64)  # 64: more chunks than the small cases have rows, sequences or batches
SHAPES = {  # (sequences, most rows a sequence): many sequences, one, fewer rows than chunks, none
    "many": (400, 12), "one": (1, 30), "few": (5, 1), "empty": (3, 0)}


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    import numba

    n = min(request.param, numba.config.NUMBA_NUM_THREADS)
    before = numba.get_num_threads()
    numba.set_num_threads(n)
    yield n
    numba.set_num_threads(before)


def grouped_rows(shape: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, int]:
    """Segment rows grouped by ascending sequence id (sequences without rows, zero-token rows and
    a document repeated in a sequence among them): (seq, doc, tokens, doc_group, M, G)."""
    n_seq, most = SHAPES[shape]
    rng = np.random.default_rng(seed)
    seq = np.repeat(np.arange(n_seq), rng.integers(0, most + 1, n_seq) if most > 1 else np.full(n_seq, most))
    doc = rng.integers(0, 40, seq.size)
    tokens = (rng.integers(0, 50, seq.size) * (rng.random(seq.size) < 0.9)).astype(np.int32)
    return seq, doc, tokens, rng.integers(0, 9, 40), n_seq, 9


def dense(comp: D.Composition) -> np.ndarray:
    """(M, G) tokens of each sequence and group."""
    out = np.zeros((comp.n_sequences, comp.n_groups), np.int64)
    np.add.at(out, (comp.seq, comp.group), comp.tokens)
    return out


@pytest.mark.parametrize("shape", SHAPES)
def test_composition_of_docs_any_chunking(shape, threads):
    from pipeline.ordering import kernels as K

    seq, doc, tokens, doc_group, m, g = grouped_rows(shape)
    want = composition(seq, doc_group[doc], tokens, m, g)  # the vectorized form (sort and bincount)
    for chunks in CHUNKS:
        got = K._composition(seq, doc, tokens, doc_group, g, K.sequence_cuts(seq, chunks))
        assert [a.dtype for a in got] == [np.dtype(np.int32)] * 3
        for a, b in zip(got, (want.seq, want.group, want.tokens)):
            np.testing.assert_array_equal(a, b)
    for a, b in zip(K.composition_of_docs(seq, doc, tokens, doc_group, g), (want.seq, want.group, want.tokens)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("shape", SHAPES)
def test_sequence_cuts_keep_sequences_whole(shape):
    from pipeline.ordering import kernels as K

    seq = grouped_rows(shape)[0]
    for chunks in CHUNKS:
        cuts = K.sequence_cuts(seq, chunks)
        assert cuts[0] == 0 and cuts[-1] == seq.size and (np.diff(cuts) >= 0).all() and cuts.size == chunks + 1
        inner = cuts[(cuts > 0) & (cuts < seq.size)]
        assert (seq[inner] != seq[inner - 1]).all()


@pytest.mark.parametrize("shape", SHAPES)
def test_row_sums_any_chunking(shape, threads):
    """row_pointers = searchsorted; square sums (l2_norm) = bincount of t*t in row order; group and
    (part, group) token sums = bincount's (exact) float sums."""
    from pipeline.ordering import kernels as K

    seq, doc, tokens, doc_group, m, g = grouped_rows(shape)
    comp = composition(seq, doc_group[doc], tokens, m, g)
    np.testing.assert_array_equal(K.row_pointers(comp.seq, m), np.searchsorted(comp.seq, np.arange(m + 1)))
    t = comp.tokens.astype(np.float64)
    squares = np.bincount(comp.seq, weights=t * t, minlength=m)
    tot = np.bincount(comp.group, weights=comp.tokens, minlength=g)
    part_of_seq = np.random.default_rng(1).integers(0, 4, m)
    by_part = np.bincount(part_of_seq[comp.seq] * g + comp.group, weights=comp.tokens, minlength=4 * g).reshape(4, g)
    for chunks in CHUNKS:
        rows, whole = K.even_cuts(comp.seq.size, chunks), K.sequence_cuts(comp.seq, chunks)
        assert K._square_sums(comp.seq, comp.tokens, m, whole).tobytes() == squares.tobytes()
        np.testing.assert_array_equal(K._group_tokens(comp.group, comp.tokens, g, rows), tot)
        np.testing.assert_array_equal(K._part_group_tokens(part_of_seq, comp.seq, comp.group, comp.tokens, 4, g, rows), by_part)
    assert comp.l2_norm().tobytes() == np.sqrt(squares).tobytes()
    if tot.sum():
        assert comp.global_share().tobytes() == (tot / tot.sum()).tobytes()


def test_part_feature_sums_keep_bincounts_order(threads):
    """Non-integer features: equal bits only if each part's sum runs in sequence order."""
    from pipeline.ordering import kernels as K

    rng = np.random.default_rng(3)
    features = rng.random((6, 5000)) * 10.0 ** rng.integers(-3, 9, (6, 1))
    part_of_seq = rng.integers(0, 10, 5000)
    want = np.stack([np.bincount(part_of_seq, weights=f, minlength=10) for f in features], axis=1)
    assert K.part_feature_sums(part_of_seq, features, 10).tobytes() == np.ascontiguousarray(want).tobytes()


@pytest.mark.parametrize("shape", SHAPES)
def test_token_sums_are_bincounts_sums_any_chunking(shape, threads):
    """Per-sequence token sums and token x length sums (the stationarity features, the empty-sequence
    check) equal np.bincount's float sums, in any chunks of sequences and for rows out of order."""
    from pipeline.ordering import kernels as K

    seq, doc, tokens, doc_group, m, g = grouped_rows(shape, seed=7)
    per = np.random.default_rng(3).integers(1, 1 << 20, seq.size).astype(np.int32)  # products past 2**31
    tok = tokens.astype(np.float64)
    want = (np.bincount(seq, weights=tok, minlength=m), np.bincount(seq, weights=tok * per, minlength=m))
    for chunks in CHUNKS:
        got = K._token_sums(seq, tokens, per, True, m, K.sequence_cuts(seq, chunks))
        assert [g.astype(np.float64).tobytes() for g in got] == [w.tobytes() for w in want]
    length, product = K.token_sums(seq, tokens, m, per)
    assert length.dtype == np.int64 and np.array_equal(length, want[0]) and np.array_equal(product, want[1])
    length, none = K.token_sums(seq, tokens, m)
    assert none is None and np.array_equal(length, want[0])
    shuffled = np.random.default_rng(4).permutation(seq.size)  # rows out of order (with several sequences): np.bincount
    got = K.token_sums(seq[shuffled], tokens[shuffled], m, per[shuffled])
    assert all(np.array_equal(g, w) for g, w in zip(got, want))


@pytest.mark.parametrize("shape", [s for s in SHAPES if s != "empty"])  # shares need tokens
def test_batch_deviations_and_prefix_totals_any_chunking(shape, threads):
    from pipeline.ordering import kernels as K

    seq, doc, tokens, doc_group, m, g = grouped_rows(shape)
    comp = composition(seq, doc_group[doc], tokens, m, g)
    assert comp.tokens.size
    position = np.random.default_rng(2).permutation(m)
    order = np.argsort(position)
    per_seq = dense(comp)
    tau = comp.global_share()
    ptr = K.row_pointers(comp.seq, m)
    by_share = np.argsort(-tau, kind="stable")
    rank = np.empty_like(by_share)
    rank[by_share] = np.arange(g)
    for bs in (1, 2, 7):
        n_batches = m // bs
        acc = per_seq[order[: n_batches * bs]].reshape(n_batches, bs, g).sum(axis=1)
        want = np.abs(acc / np.maximum(acc.sum(axis=1, keepdims=True), 1) - tau).max(axis=1)  # an empty batch: max tau
        for chunks in CHUNKS:
            cuts = K.even_cuts(n_batches, chunks)
            got = K._batch_deviations(order, ptr, comp.group, comp.tokens, rank, tau[by_share], bs, cuts)
            assert got.tobytes() == want.tobytes()
        assert D.batch_deviations(comp, position, bs).tobytes() == want.tobytes()
    running = np.vstack([np.zeros(g, np.int64), np.cumsum(per_seq[order], axis=0)])
    cuts = np.r_[0, 0, np.sort(np.random.default_rng(4).integers(1, m + 1, 5)), m, m]  # ascending, with repeats
    for chunks in CHUNKS:
        bounds = K.even_cuts(int(cuts[-1]), chunks)
        got = K._prefix_totals(order, ptr, comp.group, comp.tokens, g, cuts, bounds, np.searchsorted(cuts, bounds, side="right"))
        np.testing.assert_array_equal(got, running[cuts])
    np.testing.assert_array_equal(K.prefix_totals(order, ptr, comp.group, comp.tokens, g, cuts), running[cuts])


def test_wrappers_split_large_inputs(monkeypatch, threads):
    """With every input large (MIN_CHUNK_ROWS = 1), the public kernels run in several chunks and
    still give the one-chunk output."""
    from pipeline import segments
    from pipeline.ordering import kernels as K

    seq, doc, tokens, doc_group, m, g = grouped_rows("many", seed=5)
    one = K.composition_of_docs(seq, doc, tokens, doc_group, g)
    comp = D.Composition(*one, m, g)
    position = np.random.default_rng(6).permutation(m)
    before = [D.batch_deviations(comp, position, 3), D.prefix_totals(comp, position, np.array([1, 50, m]))[0], comp.l2_norm(),
              comp.global_share()]
    monkeypatch.setattr(segments, "MIN_CHUNK_ROWS", 1)
    assert K.n_chunks(seq.size) == 4 * threads
    for a, b in zip(K.composition_of_docs(seq, doc, tokens, doc_group, g), one):
        np.testing.assert_array_equal(a, b)
    after = [D.batch_deviations(comp, position, 3), D.prefix_totals(comp, position, np.array([1, 50, m]))[0], comp.l2_norm(),
             comp.global_share()]
    for a, b in zip(after, before):
        assert a.tobytes() == b.tobytes()
