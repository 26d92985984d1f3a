"""Stationarity diagnostics: per-part values by hand, random's band, drifting orders named, the prefix."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import polars as pl
import pytest

from pipeline.errors import StrataInputError
from pipeline.packing.pack import pack_concat
from pipeline.reports import diagnostics as D
from pipeline.reports import stationarity as S

# A hand-built schedule: 14 documents in 10 sequences of 4 tokens (doc 3 spans sequences 2 and 3).
#            doc:   0  1  2  3  4  5  6  7  8  9 10 11 12 13
CLUSTER = np.array([0, 1, 0, 1, 0, 1, 2, 2, 0, 1, 2, 0, 1, 2])
LENGTH = np.array([4, 2, 2, 8, 1, 1, 2, 4, 4, 2, 2, 4, 2, 2])
SOURCE = np.array(["web", "code"] * 7)
SPANS = [[(0, 4)], [(1, 2), (2, 2)], [(3, 4)], [(3, 4)], [(4, 1), (5, 1), (6, 2)],
         [(7, 4)], [(8, 4)], [(9, 2), (10, 2)], [(11, 4)], [(12, 2), (13, 2)]]
EDGES = np.array([2, 4])  # length bins: <= 2, (2, 4], > 4


def _segments(spans) -> pl.DataFrame:
    rows = [(s, d, n) for s, seq in enumerate(spans) for d, n in seq]
    return pl.DataFrame(rows, schema={"sequence_id": pl.Int64, "doc_id": pl.Int64, "n_tokens": pl.Int64}, orient="row")


def _hand(order=None) -> D.Schedule:
    return D.prepare(_segments(SPANS), np.arange(10) if order is None else order, CLUSTER, LENGTH, bin_edges=EDGES,
                     doc_source=SOURCE)


def _value(frame: pl.DataFrame, characteristic: str, part: str, column: str = "value") -> float:
    row = frame.filter((pl.col("characteristic") == characteristic) & (pl.col("part") == part))
    assert row.height == 1, (characteristic, part)
    return row[column][0]


def test_hand_built_parts_prefix_and_band():
    frame = S.stationarity_table(_hand(), prefix=3, strategy="hand")
    assert frame.schema == pl.Schema(S.SCHEMA)
    assert S.characteristics(frame) == list(S.LEVEL) + list(S.SHARE)
    assert frame["part"].to_list()[:11] == [str(i) for i in range(10)] + ["prefix"]
    # identity order, M = 10: tenth i is sequence i
    assert _value(frame, "clusters_per_seq", "1") == 2 and _value(frame, "clusters_per_seq", "4") == 3
    assert _value(frame, "docs_per_seq", "2") == 1 and _value(frame, "docs_per_seq", "4") == 3
    assert _value(frame, "mean_doc_length", "2") == 8  # doc 3's tokens
    assert _value(frame, "mean_doc_length", "4") == pytest.approx((1 * 1 + 1 * 1 + 2 * 2) / 4)
    assert _value(frame, "concentration", "1") == pytest.approx(math.sqrt(2**2 + 2**2) / 4)
    assert _value(frame, "concentration", "4") == pytest.approx(math.sqrt(1 + 1 + 4) / 4)
    # global token shares: clusters 15/15/10 of 40, length bins 16/16/8, sources web 17 / code 23
    assert _value(frame, "cluster_share_dev", "0") == pytest.approx(1 - 15 / 40)
    assert _value(frame, "cluster_share_dev", "5") == pytest.approx(1 - 10 / 40)
    assert _value(frame, "length_bin_share_dev", "2") == pytest.approx(1 - 8 / 40)
    assert _value(frame, "length_bin_share_dev", "4") == pytest.approx(1 - 16 / 40)
    assert _value(frame, "source_share_dev", "1") == pytest.approx(abs(0.5 - 17 / 40))
    # prefix = sequences 0, 1, 2 (12 tokens: clusters 6/6/0)
    assert _value(frame, "clusters_per_seq", "prefix") == pytest.approx(4 / 3)
    assert _value(frame, "mean_doc_length", "prefix") == pytest.approx((16 + 8 + 32) / 12)
    assert _value(frame, "cluster_share_dev", "prefix") == pytest.approx(10 / 40)
    # one sequence per tenth: every shuffle's tenths are the 10 sequences, so the envelope is centred on
    # their mean (15 clusters / 10 sequences) and spans at least their range (1..3)
    lo, hi = _value(frame, "clusters_per_seq", "7", "band_lo"), _value(frame, "clusters_per_seq", "7", "band_hi")
    assert (lo + hi) / 2 == pytest.approx(1.5) and lo <= 1 and hi >= 3
    assert _value(frame, "concentration", "0", "band_lo") <= math.sqrt(6) / 4 and _value(frame, "concentration", "0", "band_hi") >= 1
    assert frame.filter(pl.col("part") != "prefix")["inside"].all()
    assert frame.filter(pl.col("targeted"))["characteristic"].unique().sort().to_list() == ["cluster_share_dev", "length_bin_share_dev"]


def test_order_maps_positions_to_tenths():
    frame = S.stationarity_table(_hand(np.arange(10)[::-1]), prefix=2)
    assert _value(frame, "clusters_per_seq", "0") == 2 and _value(frame, "clusters_per_seq", "9") == 1  # sequences 9 and 0
    assert _value(frame, "clusters_per_seq", "prefix") == pytest.approx((2 + 1) / 2)  # sequences 9, 8


def test_prefix_wraps_into_epochs_and_a_whole_epoch_is_inside():
    # 13 sequences consumed of 10: one epoch plus sequences 0, 1, 2
    frame = S.stationarity_table(_hand(), prefix=13)
    assert _value(frame, "clusters_per_seq", "prefix") == pytest.approx((15 + 4) / 13)
    assert _value(frame, "cluster_share_dev", "prefix") == pytest.approx(0.25 - 10 / 52)  # clusters 21/21/10 of 52
    # exactly one epoch: every shuffle consumes everything, the band is one point and holds the value
    whole = S.stationarity_table(_hand(np.arange(10)[::-1]), prefix=10).filter(pl.col("part") == "prefix")
    assert np.allclose(whole["value"], whole["band_lo"]) and np.allclose(whole["value"], whole["band_hi"])
    assert _value(whole, "clusters_per_seq", "prefix") == pytest.approx(1.5) and whole["inside"].all()


def test_bad_arguments_raise():
    with pytest.raises(StrataInputError):
        S.stationarity_table(_hand(), prefix=0)
    with pytest.raises(StrataInputError):
        S.stationarity_table(_hand(), prefix=5, n_random=0)
    with pytest.raises(StrataInputError):
        D.prepare(_segments(SPANS), np.arange(10), CLUSTER, LENGTH, bin_edges=EDGES, doc_source=SOURCE[:3])


@pytest.fixture(scope="module")
def corpus():
    """3,000 documents (log-normal lengths, 8 clusters, 2 sources) concat-packed in a random
    document order into 256-token sequences (about 1,200)."""
    rng = np.random.default_rng(7)
    n, k = 3000, 8
    lengths = np.maximum(2, rng.lognormal(4.0, 1.0, n)).astype(np.int64)
    clusters = rng.integers(0, k, n)
    sources = np.where(rng.random(n) < 0.3, "code", "web")
    packing = pack_concat(rng.permutation(n), lengths, 256)
    sched = D.prepare(packing.segments, np.arange(packing.n_sequences), clusters, lengths, length_bins=10, doc_source=sources)
    return sched


def _reordered(sched: D.Schedule, order: np.ndarray) -> D.Schedule:
    position = np.empty_like(order)
    position[order] = np.arange(order.size)
    return dataclasses.replace(sched, order=order, position=position)


def _dominant(comp: D.Composition) -> np.ndarray:
    """The group holding most tokens of each sequence."""
    dense = np.zeros((comp.n_sequences, comp.n_groups))
    dense[comp.seq, comp.group] = comp.tokens
    return dense.argmax(axis=1)


def test_cluster_sorted_order_leaves_the_band_and_is_named(corpus):
    order = np.argsort(_dominant(corpus.clusters), kind="stable")
    frame = S.stationarity_table(_reordered(corpus, order), prefix=128, strategy="sorted")
    share = frame.filter(pl.col("characteristic") == "cluster_share_dev")
    assert not share["inside"].any()  # every tenth and the prefix: a few clusters instead of all
    assert (share["value"] > share["band_hi"]).all()
    assert "cluster_share_dev (tenths 0, 1, 2, 3, 4, 5, 6, 7, 8, 9; prefix)" in S.out_of_band_summary(frame)
    lines = S.out_of_band(frame)
    assert any(line.startswith("cluster_share_dev in tenth 0: ") and "above random's band" in line for line in lines)
    assert any(line.startswith("cluster_share_dev in the prefix: ") for line in lines)


def test_the_positive_control_leaving_the_band_is_expected(corpus):
    """ordering_is_stationary: the positive control (cluster_sorted, harmful on purpose) passes with its band
    violation described as expected; the same table under any other strategy's name warns."""
    from pipeline.names import POSITIVE_CONTROL
    from pipeline.reports.stage import stationarity_check

    order = np.argsort(_dominant(corpus.clusters), kind="stable")
    frame = S.stationarity_table(_reordered(corpus, order), prefix=128, strategy=POSITIVE_CONTROL)
    control = stationarity_check(POSITIVE_CONTROL, frame, 19)
    assert control.passed and control.description.startswith("expected for the positive control: outside random's band: ")
    assert control.metadata["expected"].startswith("yes") and control.metadata["parts_outside"] > 0
    other = stationarity_check("greedy", frame, 19)
    assert not other.passed and other.warn and other.description.startswith("outside random's band")
    assert "expected" not in other.metadata


def test_length_sorted_order_leaves_the_band_and_is_named(corpus):
    token_length = np.bincount(corpus.seg_seq, weights=corpus.seg_tokens * corpus.seg_doc_length, minlength=corpus.n_sequences)
    order = np.argsort(token_length, kind="stable")  # short-document sequences first
    frame = S.stationarity_table(_reordered(corpus, order), prefix=128, strategy="by_length")
    length = frame.filter(pl.col("characteristic") == "mean_doc_length")
    assert not length.filter(pl.col("part").is_in(["0", "1", "8", "9", "prefix"]))["inside"].any()  # the ends; the middle is near the mean
    assert length["value"][0] < length["band_lo"][0] and length["value"][9] > length["band_hi"][9]
    assert length["value"][10] < length["band_lo"][10]  # the prefix: the shortest documents
    assert any(line.startswith("mean_doc_length in tenth 0: ") and "below random's band" in line for line in S.out_of_band(frame))
    assert "length_bin_share_dev (tenths" in S.out_of_band_summary(frame)  # also a targeted share
    assert "docs_per_seq (tenths" in S.out_of_band_summary(frame)  # short documents: more of them per sequence


def test_a_balanced_order_is_inside_below_the_band():
    """Single-cluster sequences of 8 equal clusters: a round robin over the clusters puts exactly
    10 of each in every tenth (deviation 0, below the centre of random's band, which is one-sided: inside);
    the cluster-sorted packing order puts one or two clusters in each tenth (outside)."""
    clusters = np.repeat(np.arange(8), 100)
    lengths = np.full(800, 64)
    packing = pack_concat(np.arange(800), lengths, 64)  # one document per sequence
    base = D.prepare(packing.segments, np.arange(800), clusters, lengths, length_bins=1)
    round_robin = np.arange(800).reshape(8, 100).T.ravel()
    good = S.stationarity_table(_reordered(base, round_robin), prefix=80).filter(pl.col("characteristic") == "cluster_share_dev")
    assert np.allclose(good["value"], 0) and ((good["band_lo"] + good["band_hi"]) / 2 > 0).all() and good["inside"].all()
    bad = S.stationarity_table(base, prefix=80).filter(pl.col("characteristic") == "cluster_share_dev")
    assert not bad["inside"].any()


def test_a_random_order_stays_inside(corpus):
    """A uniform shuffle (seed 1; the band's shuffles come from seed 0's separate stream).

    How likely a false alarm is: a uniform shuffle leaves the simultaneous envelope of R shuffles
    in some part of some characteristic with probability about 1 / (R + 1) (docs/diagnostics.md).
    This test uses R = 200 and fixed seeds, so its outcome is deterministic; the calibration test
    below checks the rate itself.
    """
    order = np.random.default_rng(1).permutation(corpus.n_sequences)
    frame = S.stationarity_table(_reordered(corpus, order), prefix=128, strategy="random", n_random=200, seed=0)
    assert frame["inside"].all(), S.out_of_band(frame)
    assert S.out_of_band(frame) == [] and S.out_of_band_summary(frame) == ""
    again = S.stationarity_table(_reordered(corpus, order), prefix=128, strategy="random", n_random=200, seed=0)
    assert frame.equals(again)  # seeded: the same band every time
    other = S.stationarity_table(_reordered(corpus, order), prefix=128, strategy="random", n_random=200, seed=1)
    assert not frame["band_hi"].equals(other["band_hi"])


def test_band_false_alarm_rate_matches_exchangeability(corpus):
    """Over 60 uniform shuffles (each against its own envelope of R = 20), the share of shuffles
    with any part of any characteristic outside is near 1 / (R + 1) = 4.8% (Binomial(60, 0.048):
    at least 9 happens with probability < 1%); per-part min..max ranges of the same 20 shuffles
    would flag about half of them. Seeded: deterministic."""
    small = _reordered(corpus, np.arange(corpus.n_sequences))
    flagged, n = 0, 60
    for s in range(n):
        order = np.random.default_rng(100 + s).permutation(small.n_sequences)
        frame = S.stationarity_table(_reordered(small, order), prefix=64, n_random=20, seed=1000 + s)
        flagged += bool((~frame["inside"]).any())
    assert flagged / n < 9 / 60, flagged


def test_markdown_and_sort():
    frame = S.stationarity_table(_hand(), prefix=3, strategy="b")
    both = pl.concat([frame, frame.with_columns(strategy=pl.lit("a"))]).reverse()
    ordered = S.sort_table(both, ["b", "a"])
    assert ordered["strategy"].to_list() == ["b"] * frame.height + ["a"] * frame.height
    assert ordered.filter(pl.col("strategy") == "b").equals(frame)
    md = S.markdown(frame)
    assert md.splitlines()[0].startswith("| characteristic | targeted | 0 | 1 |") and md.count("\n") == 1 + len(S.characteristics(frame))
    assert "**" not in md  # nothing outside here
    bold = S.markdown(frame.with_columns(inside=pl.col("part") != "0"))
    assert bold.count("**") == 2 * len(S.characteristics(frame))  # tenth 0 of every characteristic


def test_band_cache_is_read_by_another_ordering_of_the_same_sequences(tmp_path):
    cache = tmp_path / "bands" / "band.npy"
    kw = {"prefix": 3, "n_random": 7, "seed": 2}
    first = S.stationarity_table(_hand(), band_cache=cache, **kw)
    assert cache.is_file() and first.equals(S.stationarity_table(_hand(), **kw))
    saved = np.load(cache)
    other = _hand(np.arange(10)[::-1])
    assert S.stationarity_table(other, band_cache=cache, **kw).equals(S.stationarity_table(other, **kw))
    np.save(cache, saved * 2)  # the file is read, not recomputed: a doctored band changes the table
    doctored = S.stationarity_table(other, band_cache=cache, **kw)
    assert not doctored["band_hi"].equals(first["band_hi"])
    np.save(cache, saved[:3])  # another stream's shape (3 shuffles): computed again and rewritten
    assert S.stationarity_table(other, band_cache=cache, **kw).equals(S.stationarity_table(other, **kw))
    np.testing.assert_array_equal(np.load(cache), saved)
    cache.write_bytes(cache.read_bytes()[:40])  # cut short: computed again
    assert S.stationarity_table(other, band_cache=cache, **kw).equals(S.stationarity_table(other, **kw))
    assert S.band_key(segments="a", seed=0) != S.band_key(segments="a", seed=1) == S.band_key(seed=1, segments="a")
