"""The claims report: each claim's computation on a hand-built case whose answer is known."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from pipeline.claims import measure as C
from pipeline.claims.inputs import diversity_schedules
from pipeline.claims.papers import diversity_ordered as dot
from pipeline.claims.papers import dont_shuffle_optimize as dso
from pipeline.claims.papers import packing_shuffling, terrific
from pipeline.errors import StrataInputError
from pipeline.ordering import OrderParams
from pipeline.packing.pack import SequenceStore, pack_concat
from pipeline.reports import diagnostics as D
from pipeline.reports.claims_section import claims_report_section, claims_section
from pipeline.reports.stats import offdiagonal
from pipeline.training.experiments import (
    epoch_boundary_arms,
    packing_arms,
    padding_steps,
    paper_packing_arms,
    protocol_seq_len,
    sequence_loss_rows,
    topic_groups,
)
from pipeline.training.loop import TrainSettings, stream_ids, train

VOCAB, EOS, PAD = 48, 1, 0


@pytest.mark.parametrize(("low", "high", "threshold", "side", "expected"), [
    (1.2, 1.5, 1.0, ">", "reproduced"),
    (0.7, 0.9, 1.0, ">", "not reproduced"),
    (0.9, 1.1, 1.0, ">", "inconclusive"),
    (1.0, 1.0, 1.0, ">", "inconclusive"),  # a degenerate interval on the threshold decides nothing
    (1.0, 1.0, 1.0, ">=", "reproduced"),  # a fraction that had to be 1 and is 1 in every replicate
    (0.9, 1.0, 1.0, ">=", "inconclusive"),
    (0.8, 0.97, 1.0, ">=", "not reproduced"),
    (-0.3, -0.1, 0.0, "<", "reproduced"),
    (0.1, 0.3, 0.0, "<", "not reproduced"),
    (-0.1, 0.1, 0.0, "<", "inconclusive"),
    (math.nan, math.nan, 0.0, "<", "inconclusive"),
])
def test_verdict_is_decided_by_the_interval(low, high, threshold, side, expected):
    assert C.verdict(low, high, threshold, side) == expected


def _pure_schedule(order: np.ndarray, n_per_cluster: int, seq_len: int = 10) -> D.Schedule:
    """Sequences 0..n-1 all cluster 0, n..2n-1 all cluster 1 (one document each, equal length)."""
    m = 2 * n_per_cluster
    seg = pl.DataFrame({"sequence_id": np.arange(m), "doc_id": np.arange(m), "n_tokens": np.full(m, seq_len)})
    cluster = np.repeat([0, 1], n_per_cluster)
    return D.prepare(seg, np.asarray(order), cluster, np.full(m, seq_len), length_bins=2)


def _interleaved(n: int) -> np.ndarray:
    return np.ravel(np.column_stack([np.arange(n), np.arange(n, 2 * n)]))


def test_prefix_claim_on_sorted_and_interleaved_orders(tmp_path):
    n = 20
    sorted_order, inter = np.arange(2 * n), _interleaved(n)
    # greedy = interleaved, random = cluster-sorted: greedy is below everywhere but at t = 1 and t = M - 1,
    # where one pure sequence (first / missing) decides both errors, which then tie
    data = C.ClaimData(out_dir=tmp_path, batch_size=2, n_boot=500, schedule=_pure_schedule(inter, n),
                       random_positions=[_pure_schedule(sorted_order, n).position] * 3)
    rows = {c.key: c for c in dso.prefix_error_claims(data)}
    t = dso.prefix_grid(2 * n)
    c = rows["dso.prefix_error.clusters"]
    assert c.value == pytest.approx((t.size - 2) / t.size) and c.n == 3 * t.size
    assert c.verdict == "inconclusive" and "t = 1, 39" in c.detail and Path(c.figure).stat().st_size > 10_000
    # greedy = sorted, random = interleaved: never below
    data = C.ClaimData(out_dir=tmp_path, batch_size=2, n_boot=500, schedule=_pure_schedule(sorted_order, n),
                       random_positions=[_pure_schedule(inter, n).position] * 3)
    c = {c.key: c for c in dso.prefix_error_claims(data)}["dso.prefix_error.clusters"]
    assert c.value == 0.0 and c.verdict == "not reproduced"


def test_prefix_fraction_interval_on_known_curves():
    rng = np.random.default_rng(0)
    r = np.abs(rng.normal(1.0, 0.1, (20, 100)))
    ind = dso.prefix_indicators(0.5 * r.min(axis=0), r)  # below every shuffle at every prefix
    mean, lo, hi = C.interval_2way(ind, 1000, 0)
    assert (mean, lo, hi) == (1.0, 1.0, 1.0) and C.verdict(lo, hi, 1.0, ">=") == "reproduced"
    g = 0.5 * r.min(axis=0)
    g[::10] = 2.0  # above every shuffle at 10 of 100 prefixes
    mean, lo, hi = C.interval_2way(dso.prefix_indicators(g, r), 1000, 0)
    assert mean == pytest.approx(0.9) and hi < 1.0 and C.verdict(lo, hi, 1.0, ">=") == "not reproduced"


def test_worst_vs_best_batch_on_sorted_and_interleaved_orders(tmp_path):
    n = 20
    inter, sorted_order = _pure_schedule(_interleaved(n), n), _pure_schedule(np.arange(2 * n), n)
    # batches of 2: interleaved batches hold one sequence of each cluster (deviation 0), sorted ones
    # one cluster only (deviation |1 - 0.5| = 0.5)
    good = C.ClaimData(out_dir=tmp_path, batch_size=2, n_boot=200, schedule=inter, random_positions=[sorted_order.position] * 4)
    c = {c.key: c for c in dso.worst_best_claims(good)}["dso.worst_vs_best_batch.clusters"]
    assert (c.value, c.ci_low, c.ci_high) == (-0.5, -0.5, -0.5) and c.verdict == "reproduced"
    bad = C.ClaimData(out_dir=tmp_path, batch_size=2, n_boot=200, schedule=sorted_order, random_positions=[inter.position] * 4)
    c = {c.key: c for c in dso.worst_best_claims(bad)}["dso.worst_vs_best_batch.clusters"]
    assert c.value == 0.5 and c.verdict == "not reproduced" and "held in 0/4" in c.detail
    assert list(dso.worst_best_gaps(np.array([0.1, 0.3]), [np.array([0.2, 0.5]), np.array([0.4])])) == pytest.approx([0.1, -0.1])


def _srank_rows(factor: float, noise: float = 0.02, seeds=(0, 1), probes: int = 16) -> pl.DataFrame:
    rng = np.random.default_rng(3)
    rows = []
    for seed in seeds:
        for probe in range(probes):
            for block, mats in (("attention", "qkvo"), ("mlp", ("gate", "up", "down"))):
                for layer in range(2):
                    for m in mats:
                        base = float(rng.uniform(2, 20))
                        name = f"layers.{layer}.{block}.{m}"
                        for strategy, f in (("random", 1.0), ("greedy", factor)):
                            rows.append({"strategy": strategy, "seed": seed, "checkpoint": "20%", "probe": probe, "position": 6 + probe,
                                         "layer_name": name, "layer": layer, "block": block, "matrix": m,
                                         "stable_rank": base * f * float(np.exp(rng.normal(0, noise)))})
    return pl.DataFrame(rows)


def test_stable_rank_claim_pairs_probes_and_reads_the_ratio(tmp_path):
    up = {c.key: c for c in dso.stable_rank_claims(C.ClaimData(out_dir=tmp_path, batch_size=4, n_boot=500, stable_rank=_srank_rows(1.1)))}
    assert set(up) == {"dso.stable_rank.attention.20%", "dso.stable_rank.mlp.20%"}
    c = up["dso.stable_rank.mlp.20%"]
    assert c.value == pytest.approx(1.1, rel=0.01) and c.ci_low > 1.05 and c.verdict == "reproduced" and c.n == 32
    shuffled = _srank_rows(1.1).sample(fraction=1.0, shuffle=True, seed=5)  # row order must not move the interval
    again = {c.key: c for c in dso.stable_rank_claims(C.ClaimData(out_dir=tmp_path, batch_size=4, n_boot=500, stable_rank=shuffled))}
    assert all((again[k].value, again[k].ci_low, again[k].ci_high) == (up[k].value, up[k].ci_low, up[k].ci_high) for k in up)
    down = dso.stable_rank_claims(C.ClaimData(out_dir=tmp_path, batch_size=4, n_boot=500, stable_rank=_srank_rows(0.9)))
    assert all(c.verdict == "not reproduced" for c in down)
    d = dso.log_ratio_matrix(_srank_rows(1.0, noise=0.0), "20%", "attention")
    assert d.shape == (2, 16) and np.allclose(d, 0.0)
    same = dso.stable_rank_claims(C.ClaimData(out_dir=tmp_path, batch_size=4, n_boot=500, stable_rank=_srank_rows(1.0, noise=0.0)))
    assert all(c.value == pytest.approx(1.0) and c.verdict == "inconclusive" for c in same)
    with pytest.raises(C.MissingData):
        dso.stable_rank_claims(C.ClaimData(out_dir=tmp_path, batch_size=4))


def _alternating_srank_rows(greedy, random, probes: int = 8) -> pl.DataFrame:
    """2 seeds x ``probes`` x 2 layers x 3 MLP matrices; srank ``greedy(probe)`` and ``random(probe)``."""
    return pl.DataFrame([{"strategy": s, "seed": seed, "checkpoint": "100%", "probe": p, "position": p, "layer_name": f"layers.{i}.mlp.{m}",
                          "layer": i, "block": "mlp", "matrix": m, "stable_rank": float(f(p))}
                         for s, f in (("greedy", greedy), ("random", random)) for seed in (0, 1) for p in range(probes)
                         for i in range(2) for m in ("gate", "up", "down")])


def test_min_stable_rank_claim_reads_the_worst_batch(tmp_path):
    """Greedy's srank is 6 on every batch; random's alternates 3 and 12 (geometric mean 6): the mean
    claim sees a ratio of 1, the minimum claim 6 / 3 = 2 (reproduced, and the bootstrap's draws of
    probes are paired, so a draw without a bad batch is rare); swapped, it is 1/2 (not reproduced)."""
    rows = _alternating_srank_rows(lambda p: 6.0, lambda p: 3.0 if p % 2 else 12.0)
    data = C.ClaimData(out_dir=tmp_path, batch_size=4, n_boot=400, stable_rank=rows)
    (mean_row,) = dso.stable_rank_claims(data)
    assert mean_row.value == pytest.approx(1.0)
    (c,) = terrific.min_stable_rank_claims(data)
    assert c.key == "terrific.min_stable_rank.mlp.100%" and c.paper == terrific.TERRIFIC and c.n == 2 * 8
    assert c.value == pytest.approx(2.0) and c.ci_low == pytest.approx(2.0) and c.verdict == "reproduced"
    assert "12/12 (seed, matrix) cells" in c.detail
    shuffled = rows.sample(fraction=1.0, shuffle=True, seed=1)  # row order does not move the interval
    (again,) = terrific.min_stable_rank_claims(C.ClaimData(out_dir=tmp_path, batch_size=4, n_boot=400, stable_rank=shuffled))
    assert (again.value, again.ci_low, again.ci_high) == (c.value, c.ci_low, c.ci_high)
    swapped = _alternating_srank_rows(lambda p: 3.0 if p % 2 else 12.0, lambda p: 6.0)
    (c,) = terrific.min_stable_rank_claims(C.ClaimData(out_dir=tmp_path, batch_size=4, n_boot=400, stable_rank=swapped))
    assert c.value == pytest.approx(0.5) and c.verdict == "not reproduced"
    # paired probes: srank 5 + p vs 2 + p, the minimum of any draw is at the same probe of both runs
    la, lb = terrific.log_srank_cube(_alternating_srank_rows(lambda p: 5.0 + p, lambda p: 2.0 + p), "100%", "mlp")
    assert la.shape == (2, 8, 6)
    mean, lo, hi = terrific.min_ratio_bootstrap(la, lb, 400, 0)
    assert math.exp(mean) == pytest.approx(2.5) and math.exp(hi) == pytest.approx(2.5) and math.exp(lo) > 1.0
    with pytest.raises(C.MissingData):
        terrific.min_stable_rank_claims(C.ClaimData(out_dir=tmp_path, batch_size=4))


def test_diversity_table_on_a_sorted_corpus(tmp_path):
    """40 documents of 8 tokens (5 + 3 of... stream length 8), cluster 0 then cluster 1 in corpus
    order, 16-token sequences: the corpus order packs two same-cluster documents per sequence
    (1 cluster each); stratified alternates the clusters (2 per sequence)."""
    n, length, seq_len = 40, 8, 16
    docs = pl.DataFrame({"doc_id": np.arange(n), "stream_length": np.full(n, length)})
    cluster = np.repeat([0, 1], n // 2)
    base = pack_concat(np.random.default_rng(0).permutation(n), np.full(n, length), seq_len).segments
    edges = D.length_bin_edges(np.full(n, length), 4)
    schedules = diversity_schedules(docs, cluster, base, seq_len, OrderParams(length_bins=4), 0, edges)
    assert set(schedules) == {"original", "round_robin", "stratified", "bin_packing", "random", "greedy"}
    data = C.ClaimData(out_dir=tmp_path, batch_size=2, n_boot=300, diversity=schedules, diversity_k=2)
    rows = {c.key: c for c in dot.diversity_claims(data)}
    table = data.tables_out["claims_diversity"]
    by = {r["strategy"]: r for r in table.iter_rows(named=True)}
    assert by["original"]["clusters_per_seq_mean"] == 1.0 and by["stratified"]["clusters_per_seq_mean"] == 2.0
    assert by["stratified"]["clusters_per_seq_std"] == 0.0 and by["original"]["paper_mean"] == 17.5
    # batches of 2 sequences: the corpus order's are one cluster (deviation 0.5), stratified's balanced (0)
    assert by["original"]["batch_token_share_dev_mean"] == pytest.approx(0.5) and by["stratified"]["batch_token_share_dev_max"] == 0.0
    c = rows["dot.diversity.stratified_vs_original"]
    assert (c.value, c.ci_low, c.ci_high, c.verdict) == (2.0, 2.0, 2.0, "reproduced")
    assert rows["dot.diversity.stratified_vs_rivals"].verdict == "inconclusive"  # round-robin alternates too: 2 = 2


def test_stratified_balances_counts_not_tokens(tmp_path):
    """Many short documents and a few long ones in one cluster: stratified's count deficits put the
    long ones where their cluster's turn falls, so its batches miss the token shares by more than
    greedy's, which balances tokens."""
    rng = np.random.default_rng(0)
    cluster = rng.integers(0, 4, 400)
    length = np.where(rng.random(400) < 0.9, 6, 120)
    docs = pl.DataFrame({"doc_id": np.arange(400), "stream_length": length})
    base = pack_concat(rng.permutation(400), length, 32).segments
    schedules = diversity_schedules(docs, cluster, base, 32, OrderParams(length_bins=4), 0, D.length_bin_edges(length, 4))
    table = dot.diversity_table(schedules, 8, 4)
    dev = dict(table.select("strategy", "batch_token_share_dev_mean").iter_rows())
    assert dev["stratified"] > dev["greedy"]


def test_fidelity_spread_on_known_matrices(tmp_path):
    rng = np.random.default_rng(0)
    n = 10
    flat = 0.9 + rng.normal(0, 0.002, (n, n))
    flat = (flat + flat.T) / 2
    np.fill_diagonal(flat, 1.0)
    half = np.arange(n) < 5
    block = np.where(half[:, None] == half[None, :], 0.9, 0.3)  # two regimes: the schedule drifts at chunk 5
    np.fill_diagonal(block, 1.0)
    mean, lo, hi = terrific.spread_bootstrap(flat, block, 500, 0)
    assert mean == pytest.approx(offdiagonal(flat).std() - offdiagonal(block).std()) and hi < 0
    c = terrific.fidelity_claims(C.ClaimData(out_dir=tmp_path, batch_size=4, n_boot=500, fidelity={"greedy": flat, "random": block}))[0]
    assert c.verdict == "reproduced" and c.n == 10
    c = terrific.fidelity_claims(C.ClaimData(out_dir=tmp_path, batch_size=4, n_boot=500, fidelity={"greedy": block, "random": flat}))[0]
    assert c.verdict == "not reproduced"


def test_fidelity_range_is_the_papers_absolute_statement(tmp_path):
    """The paper's own statement beside the recast one: greedy's off-diagonal cosines within a range
    of width 0.002 (0.945-0.947). Cosines drawn in [0.9455, 0.9465] meet it (range < 0.001); the
    cosines spread over [0.93, 0.96] do not, whichever chunks a replicate draws."""
    rng = np.random.default_rng(0)
    n = 10
    tight = rng.uniform(0.9455, 0.9465, (n, n))
    tight = (tight + tight.T) / 2
    np.fill_diagonal(tight, 1.0)
    rows = {c.key: c for c in terrific.fidelity_claims(C.ClaimData(out_dir=tmp_path, batch_size=4, n_boot=500,
                                                             fidelity={"greedy": tight, "random": tight}))}
    c = rows["terrific.fidelity.greedy_range"]
    off = offdiagonal(tight)
    assert c.value == pytest.approx(off.max() - off.min()) and c.value < 0.001 and c.ci_high == pytest.approx(c.value)
    assert c.threshold == pytest.approx(0.002) and c.verdict == "reproduced" and "inside the paper's interval: yes" in c.detail
    loose = rng.uniform(0.93, 0.96, (n, n))
    loose = (loose + loose.T) / 2
    np.fill_diagonal(loose, 1.0)
    c = {c.key: c for c in terrific.fidelity_claims(C.ClaimData(out_dir=tmp_path, batch_size=4, n_boot=500,
                                                          fidelity={"greedy": loose, "random": tight}))}["terrific.fidelity.greedy_range"]
    assert c.value > 0.01 and c.ci_low > 0.002 and c.verdict == "not reproduced" and "interval: no" in c.detail
    assert terrific.range_bootstrap(loose, 500, 0)[2] == pytest.approx(c.value)


def _two_topics(n_docs: int, seq_len: int):
    """Documents of two topics with disjoint vocabularies; doc i < n/2 is topic 0."""
    rng = np.random.default_rng(1)
    half = n_docs // 2
    docs = [rng.integers(2, 20, int(rng.integers(12, 40))) for _ in range(half)]
    docs += [rng.integers(25, 45, int(rng.integers(12, 40))) for _ in range(half)]
    flat = np.concatenate([np.append(d, EOS) for d in docs]).astype(np.int64)
    lengths = np.array([d.size + 1 for d in docs])
    return flat, lengths, np.concatenate([[0], np.cumsum(lengths)]), np.repeat([0, 1], half)


def test_fidelity_claim_with_real_gradients(tmp_path):
    """Mixture fidelity of a shuffled stream (as "greedy") against a topic-sorted one (as "random")
    at a tiny model: the sorted stream's chunks drift from topic 0 to topic 1."""
    from pipeline.training.gradients import mixture_fidelity
    from pipeline.training.model import build_model

    flat, lengths, offsets, _ = _two_topics(120, 32)
    pk = pack_concat(np.arange(120), lengths, 32)
    store = SequenceStore(flat, offsets, pk.segments, 32)
    model = build_model("tiny", VOCAB, 32, 0, EOS, PAD)
    shuffled = mixture_fidelity(model, store, np.random.default_rng(0).permutation(store.n_sequences), sequences_per_chunk=6, batch_size=6)
    drifting = mixture_fidelity(model, store, np.arange(store.n_sequences), sequences_per_chunk=6, batch_size=6)
    data = C.ClaimData(out_dir=tmp_path, batch_size=6, n_boot=500, fidelity={"greedy": shuffled, "random": drifting})
    c = terrific.fidelity_claims(data)[0]
    assert c.value < 0 and c.verdict == "reproduced"


def test_epochs_repeat_the_same_batches():
    flat, lengths, offsets, _ = _two_topics(40, 16)
    pk = pack_concat(np.arange(40), lengths, 16)
    store = SequenceStore(flat, offsets, pk.segments, 16)
    m = store.n_sequences
    order = np.random.default_rng(0).permutation(m)
    s = TrainSettings(preset="tiny", batch_size=8, warmup_steps=1, epochs=2, max_steps=999)
    assert s.steps(m) == 2 * (m // 8)
    _, log = train(store, order, VOCAB, EOS, PAD, s, progress=False)
    assert len(log) == 2 * (m // 8) and [r["epoch"] for r in log] == [0] * (m // 8) + [1] * (m // 8)
    ids = stream_ids(order, len(log), 8, epochs=2).reshape(2, -1)
    assert (ids[0] == ids[1]).all() and (ids[0] == order[: (m // 8) * 8]).all()  # drop-last, same order each epoch
    assert (stream_ids(order, 3, 8) == order[np.arange(24) % m]).all()  # without epochs: wrapping as before
    _, short = train(store, order, VOCAB, EOS, PAD, s, progress=False, stop_after=3)
    assert [r["step"] for r in short] == [0, 1, 2] and short[2]["lr"] == log[2]["lr"]


def test_epoch_boundary_claim_on_a_cluster_sorted_corpus(tmp_path):
    """A topic-sorted order trained for 3 epochs: at each restart the stream jumps from the last
    topic back to the first and the gradient norm spikes; an interleaved order does not."""
    flat, lengths, offsets, topic = _two_topics(80, 32)
    rows = []
    for arm, docs in (("topical", np.arange(80)), ("stratified", np.ravel(np.column_stack([np.arange(40), np.arange(40, 80)])))):
        pk = pack_concat(docs, lengths, 32)
        store = SequenceStore(flat, offsets, pk.segments, 32)
        for seed in (0, 1):
            s = TrainSettings(preset="tiny", batch_size=4, lr=5e-3, warmup_steps=2, seed=seed, epochs=3)
            _, log = train(store, np.arange(store.n_sequences), VOCAB, EOS, PAD, s, progress=False)
            rows += [{**r, "arm": arm, "seed": seed, "experiment": "epoch_boundary"} for r in log]
    data = C.ClaimData(out_dir=tmp_path, batch_size=4, n_boot=1000, claim_log=pl.DataFrame(rows))
    out = {c.key: c for c in dot.epoch_boundary_claims(data)}
    c = out["dot.epoch_boundary.topical.grad_norm"]
    assert c.value > 1.5 and c.verdict == "reproduced" and c.n == 4
    assert out["dot.epoch_boundary.topical_minus_stratified.grad_norm"].verdict == "reproduced"
    jumps = data.tables_out["claims_epoch_jumps"]
    assert set(jumps["arm"]) == {"topical", "stratified"} and (jumps["boundaries"] == 2).all()
    assert Path(c.figure).stat().st_size > 10_000
    with pytest.raises(C.MissingData):
        dot.epoch_boundary_claims(C.ClaimData(out_dir=tmp_path, batch_size=4))


def test_epoch_arms_group_one_sample_by_topic():
    rng = np.random.default_rng(0)
    cluster = rng.integers(0, 4, 200)
    source = np.array(["web", "code"])[rng.integers(0, 2, 200)]  # sources interleaved in the corpus's order
    topic, kind = topic_groups(source, cluster)
    assert kind == "source" and topic[0] == 0 and set(topic) == {0, 1} and (topic == (source != source[0])).all()
    assert topic_groups(np.array(["one"] * 200), cluster) == (pytest.approx(cluster), "cluster")
    lengths = rng.integers(10, 60, 200)
    base = TrainSettings(preset="tiny", batch_size=4)
    arms = epoch_boundary_arms(lengths, cluster, topic, 32, 24, 3, [0, 1], base, kind)
    assert [(a.arm, a.seed) for a in arms] == [("topical", 0), ("stratified", 0), ("topical", 1), ("stratified", 1)]
    for a, b in zip(arms[::2], arms[1::2]):
        assert a.order.size == b.order.size == 24 and a.steps == 3 * 6 and a.settings.epochs == 3 and a.settings.seed == a.seed
        da, db = set(a.segments["doc_id"]), set(b.segments["doc_id"])
        assert len(da | db) <= a.info["documents"] and len(da & db) >= 0.8 * min(len(da), len(db))  # one sample, two orders
        in_order = a.segments.sort("sequence_id", "seq_token_start")["doc_id"].to_numpy()
        assert (np.diff(topic[in_order]) >= 0).all() and a.info["topic_groups"] == 2  # topic 0's documents, then topic 1's
        stream = b.segments.sort("sequence_id", "seq_token_start")["doc_id"].unique(maintain_order=True).to_numpy()
        assert (cluster[stream][1:] == cluster[stream][:-1]).mean() < 0.2  # stratified: neighbours differ in cluster


def test_packing_arms_train_at_equal_tokens():
    lengths = np.random.default_rng(0).integers(20, 200, 300)
    base = TrainSettings(preset="tiny", batch_size=4, max_steps=10)
    arms = packing_arms(lengths, 32, [0.5, 1.0, 2.0], [0], base)
    names = [a.arm for a in arms]
    assert names == ["concat-x0.5", "concat-x1", "concat-x2", "padding-x1"]
    pad = arms[-1]
    assert all(a.settings.cross_document and a.settings.max_steps == 10 for a in arms[:3])
    filled = float(pad.segments["n_tokens"].sum() + pad.segments["eos_added"].sum()) / pad.order.size
    assert pad.steps == padding_steps(10, 32, pad.segments, pad.order.size) > 10
    assert abs(pad.steps * 4 * filled - 10 * 4 * 32) <= 0.5 * 4 * filled  # the concat runs' tokens, to half a step


def test_packing_claims_on_known_losses(tmp_path):
    rng = np.random.default_rng(0)
    rows = []
    offsets = {"concat-x1": 0.0, "padding-x1": -0.1, "concat-x0.5": 0.3, "concat-x2": 0.05}
    for seed in (0, 1, 2):
        base = rng.normal(4.0, 0.3, 32)
        for arm, off in offsets.items():
            rows += [{"experiment": "packing", "arm": arm, "seed": seed, "unit": f"d{u}", "loss": base[u] + off + rng.normal(0, 0.01)}
                     for u in range(32)]
    arms = pl.DataFrame([{"experiment": "packing", "arm": a, "seed": 0, "steps": 10, "mean_doc_tokens": 500.0, "seq_len": 256}
                         for a in offsets])
    data = C.ClaimData(out_dir=tmp_path, batch_size=4, n_boot=500, claim_heldout=pl.DataFrame(rows), claim_arms=arms)
    out = {c.key: c for c in packing_shuffling.packing_claims(data)}
    assert set(out) == {"packing.padding-x1_vs_concat-x1", "packing.concat-x1_vs_concat-x0.5", "packing.concat-x1_vs_concat-x2"}
    assert out["packing.padding-x1_vs_concat-x1"].value == pytest.approx(-0.1, abs=0.01)
    assert all(c.verdict == "reproduced" for c in out.values())
    assert "mean document 500 tokens vs seq_len 256" in out["packing.concat-x1_vs_concat-x2"].detail
    assert packing_shuffling.paired_units(pl.DataFrame(rows), "concat-x2", "concat-x1").shape == (3, 32)


def test_paper_packing_arms_two_epochs_below_the_mean_document():
    from pipeline.errors import StrataInputError

    lengths = np.random.default_rng(0).integers(20, 200, 400)  # mean ~110 tokens
    base = TrainSettings(preset="tiny", batch_size=4, max_steps=10)
    arms = paper_packing_arms(lengths, 256, [0.5, 1.0, 2.0], [0, 1], base, n_sequences=128, epochs=2)
    assert [a.arm for a in arms[:4]] == ["concat-x0.5", "concat-x1", "concat-x2", "padding-x1"]
    assert protocol_seq_len(float(lengths.mean()), 256) == 32  # 2^floor(log2(mean / 2)), like the paper's 64 for 143 tokens
    for a in arms:
        assert a.seq_len == a.info["seq_len"] == 32 and a.settings.epochs == 2 and a.settings.cross_document
        assert a.steps == 2 * (a.order.size // 4) and a.info["mean_doc_tokens"] > 32
        assert int(a.segments["n_tokens"].sum() + a.segments["eos_added"].sum()) <= a.order.size * 32
    for seed in (0, 1):  # the arms of a seed pack the same documents; padding needs more sequences per epoch
        mine = [a for a in arms if a.seed == seed]
        assert len({frozenset(a.segments["doc_id"].to_list()) for a in mine}) == 1
        assert mine[3].order.size > mine[1].order.size >= 128
    with pytest.raises(StrataInputError, match="claims.packing_seq_len"):
        protocol_seq_len(100.0, 256, requested=128)
    with pytest.raises(StrataInputError, match="claims.packing_sequences"):
        paper_packing_arms(lengths, 256, [1.0], [0], base, n_sequences=40)  # fewer trained sequences than 100 slices
    rows = sequence_loss_rows(5, 4, 3, np.array([8.0, 6, 4, 2]), np.array([4, 3, 2, 1]))
    assert rows["epoch"].tolist() == [1] * 4 and rows["index"].tolist() == [8, 9, 10, 11] and rows["epoch_size"][0] == 12


def _protocol_rows(per_token: dict[str, float], last_slice: dict[str, float] | None = None, epoch_size: int = 200) -> pl.DataFrame:
    """2 epochs of ``epoch_size`` sequences per arm and seed; every token of arm a costs per_token[a] nats
    in the last epoch (``last_slice`` in its last 1%), and the reverse order in the first epoch."""
    rng = np.random.default_rng(0)
    rows = []
    for arm, loss in per_token.items():
        for seed in (0, 1, 2):
            for epoch in (0, 1):
                tokens = rng.integers(10, 64, epoch_size)
                per = np.full(epoch_size, loss if epoch else 10.0 - loss)
                if epoch and last_slice:
                    per[epoch_size * 99 // 100:] = last_slice[arm]
                rows.append(pl.DataFrame({"experiment": "packing_epochs", "arm": arm, "seed": seed, "epoch": epoch,
                                          "index": np.arange(epoch_size), "epoch_size": epoch_size, "loss_sum": per * tokens,
                                          "tokens": tokens}))
    return pl.concat(rows)


def test_packing_protocol_claims_slice_the_last_epoch(tmp_path):
    per_token = {"concat-x0.5": 4.3, "concat-x1": 4.0, "concat-x2": 4.05, "padding-x1": 3.9}
    arms = pl.DataFrame([{"experiment": "packing_epochs", "arm": a, "seed": 0, "steps": 100, "mean_doc_tokens": 150.0, "seq_len": 64}
                         for a in per_token])
    last = {**per_token, "concat-x2": 3.95}  # x2 below x1 in the last 1% only
    data = C.ClaimData(out_dir=tmp_path, batch_size=4, n_boot=300, claim_sequences=_protocol_rows(per_token, last), claim_arms=arms)
    lp = packing_shuffling.slice_log_perplexity(data.claim_sequences)
    assert lp.height == 4 * 3 * 100 and lp.filter(pl.col("arm") == "concat-x1")["log_ppl"].to_numpy() == pytest.approx(4.0)
    out = {c.key: c for c in packing_shuffling.packing_protocol_claims(data)}
    assert set(out) == {f"packing.paper.{k}.{a}_vs_{b}" for k in ("final", "rank") for a, b in
                        (("padding-x1", "concat-x1"), ("concat-x1", "concat-x0.5"), ("concat-x1", "concat-x2"))}
    c = out["packing.paper.final.padding-x1_vs_concat-x1"]
    assert c.value == pytest.approx(-0.1) and c.verdict == "reproduced" and "2 epochs at MSL 64, mean document 150" in c.detail
    assert out["packing.paper.rank.padding-x1_vs_concat-x1"].value == 1.0
    assert out["packing.paper.final.concat-x1_vs_concat-x2"].value == pytest.approx(0.05)
    assert out["packing.paper.final.concat-x1_vs_concat-x2"].verdict == "not reproduced"  # the last slice alone decides it
    r = out["packing.paper.rank.concat-x1_vs_concat-x2"]
    assert r.value == pytest.approx(0.99) and r.verdict == "reproduced" and "1x 1.01 [paper 1.05]" in r.detail
    assert packing_shuffling.mean_ranks(lp, ["concat-x0.5", "concat-x1"]) == {"concat-x0.5": 2.0, "concat-x1": 1.0}
    assert Path(c.figure).stat().st_size > 10_000 and packing_shuffling.packing_claims(data) == []  # no equal-token runs: nothing missing
    with pytest.raises(StrataInputError, match="claims.packing_sequences"):
        packing_shuffling.slice_log_perplexity(_protocol_rows(per_token, epoch_size=50))
    with pytest.raises(C.MissingData):
        packing_shuffling.packing_protocol_claims(C.ClaimData(out_dir=tmp_path, batch_size=4))


def test_train_reports_each_sequences_loss():
    flat, lengths, offsets, _ = _two_topics(40, 16)
    store = SequenceStore(flat, offsets, pack_concat(np.arange(40), lengths, 16).segments, 16)
    seen = []
    _, log = train(store, np.arange(store.n_sequences), VOCAB, EOS, PAD, TrainSettings(preset="tiny", batch_size=4, max_steps=3),
                   progress=False, on_losses=lambda step, ids, sums, n: seen.append((step, ids, sums, n)))
    assert [s for s, *_ in seen] == [0, 1, 2] and all(len(ids) == 4 for _, ids, _, _ in seen)
    for (step, ids, sums, n), row in zip(seen, log):
        assert (ids == np.arange(4 * step, 4 * step + 4)).all() and sums.sum() / n.sum() == pytest.approx(row["loss"], rel=1e-4)


TOY_CLAIM = '''
"""toy_paper: a claim that is always measured, as a plugin module declares it."""
from pipeline.claims.measure import Claim
from pipeline.claims.papers import ClaimSpec

CALLS = []


def measure(data):
    CALLS.append(data.batch_size)
    return [Claim("x.y", "Paper", "a claim", "1.0", "somewhere", 0.5, 0.4, 0.6, 0.0, ">", "bootstrap", 10, figure="")]


SPECS = (ClaimSpec("test_only_claim", "Paper", "a claim that is always measured", measure, order=25),)
'''

BUILT_IN = ["dso_prefix_error", "dso_stationarity", "dso_worst_vs_best_batch", "dso_stable_rank", "terrific_min_stable_rank",
            "dot_diversity_table", "terrific_fidelity", "dot_epoch_boundary", "packing", "packing_paper_protocol"]


def test_registry_section_and_table(tmp_path, monkeypatch):
    """The claims come from the registry in their order (the rows of DuckDB ``claims`` and
    ``claims_not_measured``); a new claim is one spec, here a plugin's, measured at its ``order``."""
    import sys

    from pipeline.claims.papers import REGISTRY, ordered

    assert [c.name for c in ordered()] == BUILT_IN
    (tmp_path / "toy_claim.py").write_text(TOY_CLAIM)
    monkeypatch.setenv("STRATA_PLUGINS", str(tmp_path / "toy_claim.py"))
    REGISTRY.reload()
    try:
        assert [c.name for c in ordered()] == [*BUILT_IN[:2], "test_only_claim", *BUILT_IN[2:]]
        found, missing = C.evaluate(C.ClaimData(out_dir=tmp_path, batch_size=7))
        calls = sys.modules["strata_plugin_toy_claim"].CALLS
    finally:
        monkeypatch.delenv("STRATA_PLUGINS")
        REGISTRY.reload()
    assert "test_only_claim" not in REGISTRY.names()
    assert calls == [7] and [c.key for c in found] == ["x.y"] and found[0].verdict == "reproduced"
    assert list(missing) == BUILT_IN  # every built-in claim lacks its data here, listed in the claims' order
    chosen = ["packing", "dso_stable_rank"]
    assert list(C.evaluate(C.ClaimData(out_dir=tmp_path, batch_size=7), chosen)[1]) == chosen
    with pytest.raises(StrataInputError, match="unknown claim 'dso_nothing'"):
        C.evaluate(C.ClaimData(out_dir=tmp_path, batch_size=7), ["dso_nothing"])
    frame = C.claims_frame(found)
    assert frame.schema == pl.Schema(C.CLAIM_SCHEMA) and frame["verdict"][0] == "reproduced"
    md, figs = claims_section(frame, missing=missing)
    assert "| Paper | a claim | 1.0 | 0.5 [0.4, 0.6] | > 0 | **reproduced** |" in md and "`packing` (" in md and figs == {}
    tables = {"claims": frame, "claims_not_measured": pl.DataFrame({"claim": ["packing"], "reason": ["needs runs"]})}
    md2, _ = claims_report_section(tables.get)
    assert "`packing` (needs runs)" in md2


def test_stationarity_claim_by_hand(tmp_path):
    """An order whose characteristics are flat (sequences interleaved by kind) is inside random's
    envelope, reproduced; an order sorted by kind (all single-cluster sequences last) leaves it,
    not reproduced; the figure is written. The value is the diagnostics' own test: at most 1
    exactly when every part of ``stationarity_table``'s band holds the ordering."""
    from pipeline.reports import stationarity as S

    rng = np.random.default_rng(3)
    m = 400
    # half the sequences hold 2 documents of 2 clusters, half one document of one cluster
    mixed = np.arange(m) % 2 == 0
    seq = np.concatenate([np.repeat(np.arange(m)[mixed], 2), np.arange(m)[~mixed]])
    docs = np.arange(seq.size)
    cluster = rng.integers(0, 4, seq.size)
    cluster[mixed[seq] & (np.arange(seq.size) % 2 == 1)] = (cluster[mixed[seq] & (np.arange(seq.size) % 2 == 1)] + 1) % 4
    lengths = np.where(mixed[seq], 8, 16)
    segments = pl.DataFrame({"sequence_id": seq, "doc_id": docs, "n_tokens": lengths - 0})
    flat = np.arange(m)  # mixed, single, mixed, ...: flat in every tenth
    by_kind = np.r_[np.arange(m)[mixed], np.arange(m)[~mixed]]
    randoms = [D.prepare(segments, rng.permutation(m), cluster, lengths, length_bins=2).position for _ in range(20)]
    rows = {}
    for name, order in (("flat", flat), ("by_kind", by_kind)):
        sched = D.prepare(segments, order, cluster, lengths, length_bins=2)
        data = C.ClaimData(out_dir=tmp_path, batch_size=4, n_boot=300, schedule=sched, random_positions=randoms, prefix=40)
        (row,) = dso.stationarity_claims(data)
        rows[name] = row
        names, n, values = S.profiles(sched, 40, [sched.order] + [np.argsort(p) for p in randoms])
        inside_by_hand = S.envelope_ratio(values[0], values[1:], n, np.isin(names, S.SHARE)[:, None])[0] <= 1
        assert (row.value <= 1) == inside_by_hand
    assert rows["flat"].value < 1 and rows["flat"].verdict == "reproduced"
    assert rows["by_kind"].value > 1 and rows["by_kind"].verdict == "not reproduced"
    assert "clusters_per_seq" in rows["by_kind"].detail and Path(rows["by_kind"].figure).exists()
    with pytest.raises(C.MissingData):
        dso.stationarity_claims(C.ClaimData(out_dir=tmp_path, batch_size=4, schedule=sched, random_positions=randoms))


def test_prefix_claim_covers_the_whole_ordering_at_240_log_spaced_prefixes(tmp_path, monkeypatch):
    from pipeline.claims import plots as claim_plots
    from pipeline.errors import StrataInputError

    n = 2500  # M = 5,000 sequences
    m = 2 * n
    rng = np.random.default_rng(0)
    randoms = [_pure_schedule(rng.permutation(m), n).position for _ in range(3)]
    t = dso.prefix_grid(m)
    log = D.log_spaced_points(m, 240)
    assert set(log[log < m].tolist()) <= set(t.tolist()) and t.size > log.size > 150 and t.max() > 0.98 * m
    figures = []
    save = claim_plots.save_png
    monkeypatch.setattr(claim_plots, "save_png", lambda fig, path: (figures.append(fig), save(fig, path))[1])
    data = C.ClaimData(out_dir=tmp_path, batch_size=2, n_boot=200, schedule=_pure_schedule(_interleaved(n), n), random_positions=randoms)
    c = {c.key: c for c in dso.prefix_error_claims(data)}["dso.prefix_error.clusters"]
    assert c.n == 3 * t.size and f"x {t.size} prefixes" in c.interval and "(5,000 sequences" in c.detail
    for ax in figures[0].axes:  # log-log: greedy's curve, each shuffle's own curve and their median
        assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
        assert sum(np.array_equal(line.get_xdata(), t) for line in ax.get_lines()) == 3 + 2
    cut = C.ClaimData(out_dir=tmp_path, batch_size=2, schedule=data.schedule, random_positions=[p[: m // 2] for p in randoms])
    with pytest.raises(StrataInputError):  # a shuffle of part of the stream is not compared with the whole ordering
        dso.prefix_error_claims(cut)


def test_claim_data_reads_the_whole_greedy_ordering(tmp_path):
    from types import SimpleNamespace

    from pipeline.claims.inputs import claim_data, permutation_positions
    from pipeline.errors import StrataInputError
    from pipeline.storage.layout import Layout

    rng = np.random.default_rng(1)
    n_docs, seq_len = 900, 32
    lengths = rng.integers(2, 60, n_docs)
    layout = Layout(tmp_path / "root")
    (layout.root / "sequences").mkdir(parents=True)
    (layout.root / "orderings").mkdir()
    packing = pack_concat(np.arange(n_docs), lengths, seq_len)
    m = packing.n_sequences
    pl.DataFrame({"doc_id": np.arange(n_docs), "n_tokens": lengths - 1,
                  "source": rng.choice(["a", "b"], n_docs)}).write_parquet(layout.documents)
    pl.DataFrame({"doc_id": np.arange(n_docs), "cluster": rng.integers(0, 5, n_docs)}).write_parquet(layout.clusters)
    packing.segments.write_parquet(layout.segments)
    greedy = rng.permutation(m)
    pl.DataFrame({"position": np.arange(m), "sequence_id": greedy}).sample(fraction=1.0, seed=0).write_parquet(layout.ordering("greedy"))
    cfg = SimpleNamespace(claims_k=7, k=5, batch_size=4, bootstrap_samples=200, seed=0, max_steps=2, length_bins=4, seq_len=seq_len,
                          claims_shuffles=3, seeds=[0])
    data = claim_data(layout, cfg, OrderParams(), lambda name: None, tmp_path / "out", log=lambda _: None)
    assert data.schedule.n_sequences == m and np.array_equal(data.schedule.order, greedy)
    assert len(data.random_positions) == 3
    for p in data.random_positions:
        assert np.array_equal(np.sort(p), np.arange(m))  # each a shuffle of every sequence
    assert not np.array_equal(data.random_positions[0], data.random_positions[1])
    assert np.array_equal(permutation_positions(pl.DataFrame({"position": [1, 0, 2], "sequence_id": [2, 0, 1]}), 3), [0, 2, 1])
    with pytest.raises(StrataInputError):
        permutation_positions(np.array([0, 2]), 3)
    with pytest.raises(StrataInputError):
        permutation_positions(np.array([0, 1, 1]), 3)
