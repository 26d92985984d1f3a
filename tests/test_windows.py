"""The worst window (Don't Shuffle, Optimize's max over windows [a:b]): a brute-force reference,
the batch case, a constructed bad stretch against random's band, the rows, the cache, the figure."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import polars as pl
import pytest
from PIL import Image

from pipeline.errors import StrataInputError
from pipeline.packing.pack import pack_concat
from pipeline.reports import diagnostics as D
from pipeline.reports import plots as P
from pipeline.reports import visual as V
from pipeline.reports import windows as W


def _uneven(seed: int, n_clusters_used: int, extra_clusters: int = 2) -> tuple[pl.DataFrame, np.ndarray, np.ndarray, np.ndarray, int]:
    """Sequences of whole documents, a random number each, so sequences differ in tokens (the
    window's token count changes as it slides); ``extra_clusters`` cluster ids hold no document."""
    rng = np.random.default_rng(seed)
    n_docs = int(rng.integers(30, 400))
    lengths = rng.integers(1, 90, n_docs) * (1 + 6 * (rng.random(n_docs) < 0.1))
    clusters = rng.choice(n_clusters_used, n_docs, p=rng.dirichlet(np.full(n_clusters_used, 0.7)))
    n_seq = int(rng.integers(8, n_docs // 2 + 9))
    cuts = np.sort(rng.choice(np.arange(1, n_docs), n_seq - 1, replace=False))
    seq_of_doc = np.searchsorted(cuts, np.arange(n_docs), side="right")
    seg = pl.DataFrame({"sequence_id": seq_of_doc, "doc_id": np.arange(n_docs), "n_tokens": lengths})
    return seg, clusters, lengths, seq_of_doc, n_clusters_used + extra_clusters


def _dense(position: np.ndarray, seq_of_doc: np.ndarray, group: np.ndarray, lengths: np.ndarray, n_groups: int) -> np.ndarray:
    """(positions, groups) tokens, straight from the documents (no Composition)."""
    out = np.zeros((position.size, n_groups))
    np.add.at(out, (position[seq_of_doc], group), lengths)
    return out


def _brute(dense: np.ndarray, tau: np.ndarray, batch: int) -> dict[int, np.ndarray]:
    """{w: deviation of every window of w sequences starting at a multiple of batch}, O(M^2 G)."""
    n_batches = dense.shape[0] // batch
    out = {}
    span = 1
    while span <= n_batches:
        w = span * batch
        devs = []
        for a in range(n_batches - span + 1):
            tok = dense[a * batch : a * batch + w].sum(axis=0)
            devs.append(np.abs(tok / tok.sum() - tau).max())
        out[w] = np.array(devs)
        span *= 2
    return out


@pytest.mark.parametrize("seed", range(10))
def test_worst_windows_match_brute_force(seed):
    seg, clusters, lengths, seq_of_doc, k = _uneven(seed, n_clusters_used=int(np.random.default_rng(seed).integers(1, 9)))
    m = int(seg["sequence_id"].max()) + 1
    order = np.random.default_rng(100 + seed).permutation(m)
    sched = D.prepare(seg, order, clusters, lengths, length_bins=3, n_clusters=k)
    doc_bin = D.length_bin_of(lengths, sched.bin_edges)
    target = np.random.default_rng(seed).dirichlet(np.ones(k))  # a mixture's shares, some groups never present
    cases = [(sched.clusters, clusters, k, None), (sched.bins, doc_bin, sched.bin_edges.size + 1, None),
             (replace(sched.clusters, target=target), clusters, k, target)]
    absent = False  # some batch misses a group whose share is > 0 (the "mex" path)
    for comp, group, n_groups, tau in cases:
        dense = _dense(sched.position, seq_of_doc, group, lengths, n_groups)
        tau = dense.sum(axis=0) / dense.sum() if tau is None else tau
        for batch in (1, 2, 3, 5):
            got = W.worst_windows(comp, sched.position, batch)
            want = _brute(dense, tau, batch)
            assert list(got.lengths) == list(want) == list(W.window_lengths(m, batch))
            for i, w in enumerate(got.lengths):
                devs = want[int(w)]
                assert got.worst[i] == pytest.approx(devs.max(), abs=1e-12), (batch, w)
                assert got.start[i] % batch == 0 and devs[got.start[i] // batch] == pytest.approx(devs.max(), abs=1e-12)
            absent |= any(((dense[p * batch:(p + 1) * batch].sum(axis=0) == 0) & (tau > 0)).any() for p in range(m // batch))
    assert absent


def test_w_equals_batch_is_exactly_the_worst_batch():
    rng = np.random.default_rng(4)
    n, k = 4000, 30
    lengths = np.maximum(2, rng.lognormal(3.5, 1.0, n)).astype(np.int64)
    clusters = rng.choice(k, n, p=rng.dirichlet(np.ones(k) * 0.4))
    packing = pack_concat(rng.permutation(n), lengths, 64)
    sched = D.prepare(packing.segments, rng.permutation(packing.n_sequences), clusters, lengths, length_bins=12)
    target = rng.dirichlet(np.ones(k))
    for comp in (sched.clusters, sched.bins, replace(sched.clusters, target=target)):
        for batch in (1, 3, 8, 16):
            got = W.worst_windows(comp, sched.position, batch)
            per_batch = D.batch_deviations(comp, sched.position, batch)
            assert got.lengths[0] == batch and got.worst[0] == per_batch.max()  # bit for bit
            assert got.start[0] == int(np.argmax(per_batch)) * batch


def _pure(order: np.ndarray, cluster_of_seq: np.ndarray, seq_len: int = 16) -> D.Schedule:
    """One document a sequence, all of seq_len tokens: sequence s holds only cluster_of_seq[s]."""
    m = cluster_of_seq.size
    seg = pl.DataFrame({"sequence_id": np.arange(m), "doc_id": np.arange(m), "n_tokens": np.full(m, seq_len)})
    return D.prepare(seg, order, cluster_of_seq, np.full(m, seq_len), length_bins=2)


def _by(rows: list, metric: str) -> dict[int, float]:
    return {int(s.removeprefix("w=")): v for _, name, s, v in rows if name == metric}


def test_a_sorted_stretch_is_above_random_band_at_mid_lengths():
    rng = np.random.default_rng(11)
    m, k = 4096, 4
    cluster_of_seq = rng.integers(0, k, m)
    order = rng.permutation(m)
    stretch = order[1024:1536]  # 512 sequences grouped by cluster: about 128 of one cluster in a row
    order[1024:1536] = stretch[np.argsort(cluster_of_seq[stretch], kind="stable")]
    bad = W.window_rows("bad", _pure(order, cluster_of_seq), 8, n_random=5, seed=0)
    worst, band_max = _by(bad, "window_dev_clusters_max"), _by(bad, "window_dev_clusters_random_max")
    assert sorted(worst) == [8 * 2**i for i in range(10)]  # 512 batches of 8: w = 8 .. 4096
    mid = [16, 32, 64, 128, 256]
    assert all(worst[w] > band_max[w] for w in mid), {w: (worst[w], band_max[w]) for w in mid}
    assert worst[64] > 0.7 > 2 * band_max[64]  # a window of one cluster: about |1 - 1/4|, far above the shuffles
    start = _by(bad, "window_dev_clusters_worst_at")[64]
    assert 1024 <= start and start + 64 <= 1536  # found inside the stretch
    # the same sequences shuffled: the band is the same (it depends on the sequences, not their order)
    plain = W.window_rows("random", _pure(rng.permutation(m), cluster_of_seq), 8, n_random=5, seed=0)
    assert _by(plain, "window_dev_clusters_random_max") == band_max
    assert all(_by(plain, "window_dev_clusters_max")[w] < worst[w] for w in mid)


def test_window_rows_in_ordering_diagnostics_and_the_band_cache(tmp_path):
    rng = np.random.default_rng(2)
    lengths = rng.integers(1, 300, 2000)
    clusters = rng.integers(0, 9, 2000)
    packing = pack_concat(np.arange(2000), lengths, 128)
    sched = D.prepare(packing.segments, rng.permutation(packing.n_sequences), clusters, lengths, length_bins=6)
    m = sched.n_sequences
    frames = [D.ordering_diagnostics("s", sched, window_batch=4, seed=3) for _ in range(2)]
    assert frames[0].equals(frames[1]) and frames[0].schema == pl.Schema(D.METRIC_SCHEMA)
    df = frames[0]
    for kind in W.KINDS:
        for stat in ("max", "worst_at", *W.BAND_STATS):
            settings = df.filter(pl.col("metric") == f"window_dev_{kind}_{stat}")["setting"].to_list()
            assert settings == [f"w={w}" for w in W.window_lengths(m, 4)]
    assert W.window_lengths(m, 4)[-1] <= m < 2 * W.window_lengths(m, 4)[-1]
    assert not D.ordering_diagnostics("s", sched).filter(pl.col("metric").str.starts_with("window_dev_")).height  # off by default
    frame = W.window_frame(df, "s")
    assert frame.height == 2 * W.window_lengths(m, 4).size
    assert (frame["random_min"] <= frame["random_median"]).all() and (frame["random_median"] <= frame["random_max"]).all()
    assert (frame["worst"].to_numpy() > 0).all() and frame["worst_at"].dtype == pl.Int64
    # the band cache: written, read back (equal), and recomputed when it is not this band
    cache = tmp_path / "band.npy"
    computed, read = W.cached_band(sched, 4, 5, 3, cache)
    assert not read and cache.is_file()
    again, read = W.cached_band(sched, 4, 5, 3, cache)
    assert read and np.array_equal(again, computed)
    np.save(cache, computed[:, :2])
    redone, read = W.cached_band(sched, 4, 5, 3, cache)
    assert not read and np.array_equal(redone, computed)
    assert D.ordering_diagnostics("s", sched, window_batch=4, seed=3, window_band_cache=cache).equals(df)
    # markdown: bold exactly where the worst window is above random's max
    doctored = frame.with_columns(worst=pl.when(pl.col("w") == 8).then(1.0).otherwise(pl.col("worst")))
    text = W.markdown(doctored)
    assert "| 8 | **1** |" in text and W.above_random(doctored)["clusters"][0] == 8
    # a stream without a full batch has no windows
    assert W.window_rows("s", sched, m + 1) == [] and W.window_frame(D.rows_frame([]), "s").is_empty()


def test_window_figure(tmp_path):
    rng = np.random.default_rng(5)
    m, k = 1024, 6
    cluster_of_seq = rng.integers(0, k, m)
    schedules = {"sorted": _pure(np.argsort(cluster_of_seq, kind="stable"), cluster_of_seq),
                 "random": _pure(rng.permutation(m), cluster_of_seq)}
    metrics = pl.concat([D.ordering_diagnostics(s, sched, window_batch=8) for s, sched in schedules.items()])
    path = P.plot_window_deviation(W.window_frame(metrics, "sorted"), "sorted", tmp_path / "w.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 20_000
    with Image.open(path) as im:
        assert im.size[0] > 800 and len(im.convert("RGB").getcolors(maxcolors=1 << 20) or []) > 20
    figs = V.write_figures(schedules, None, np.zeros(1), tmp_path / "report", batch_size=8, metrics=metrics)
    assert {"window_deviation_sorted", "window_deviation_random"} <= set(figs)
    summary = V.window_summary(metrics)
    assert summary["strategy"].to_list() == ["sorted", "random"] and summary.row(0)[1] != "none"
    with pytest.raises(StrataInputError):
        P.plot_window_deviation(W.window_frame(metrics, "absent"), "absent", tmp_path / "none.png")


def test_asset_window_band_cache_and_metadata(tmp_path):
    from types import SimpleNamespace

    from pipeline.reports.band_cache import window_band_cache
    from pipeline.reports.stage import window_metadata
    from pipeline.stage import Markdown
    from pipeline.storage.layout import Layout

    layout = Layout(tmp_path)
    for path, text in ((layout.segments, "s"), (layout.documents, "d"), (layout.clusters, "c")):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    cfg = SimpleNamespace(length_bins=4, batch_size=8, seed=0)
    first = window_band_cache(layout, "greedy", cfg)
    assert first.parent == layout.inside("diagnostics", "window_bands") and first.suffix == ".npy"
    assert window_band_cache(layout, "random", cfg) == first  # one packing: one band
    assert window_band_cache(layout, "random", SimpleNamespace(length_bins=4, batch_size=16, seed=0)) != first
    layout.ordering_mixture("mix").parent.mkdir(parents=True, exist_ok=True)
    layout.ordering_mixture("mix").write_text("m")
    assert window_band_cache(layout, "mix", cfg) is None  # an unrolled mixture's band depends on its order
    m = 512
    cluster_of_seq = np.random.default_rng(0).integers(0, 4, m)
    metrics = D.ordering_diagnostics("sorted", _pure(np.argsort(cluster_of_seq, kind="stable"), cluster_of_seq), window_batch=8)
    files, meta = window_metadata(layout, "sorted", metrics)
    assert files == [layout.inside("diagnostics", "sorted.windows.png")] and files[0].stat().st_size > 20_000
    assert isinstance(meta["worst_window"], Markdown) and "data:image/png;base64," in meta["worst_window"]
    assert meta["worst_window_above_random"].startswith("clusters: w = 8, 16")
    assert window_metadata(layout, "none", metrics) == ([], {})
