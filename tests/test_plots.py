"""Figures and the k calibration: files are produced, valid, non-trivial; calibration is seeded."""

from __future__ import annotations

import argparse

import numpy as np
import polars as pl
import pytest
from PIL import Image

from pipeline.cli import tools
from pipeline.errors import StrataInputError
from pipeline.packing.pack import pack_concat
from pipeline.reports import diagnostics as D
from pipeline.reports import plots as P
from pipeline.represent import calibrate as C

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def schedules() -> dict[str, D.Schedule]:
    rng = np.random.default_rng(3)
    n, k = 3000, 12
    lengths = np.maximum(2, rng.lognormal(4.0, 1.0, n)).astype(np.int64)
    clusters = rng.integers(0, k, n)
    edges = D.length_bin_edges(lengths, 10)
    packing = pack_concat(np.argsort(clusters, kind="stable"), lengths, 256)
    m = packing.n_sequences
    return {
        "original": D.prepare(packing.segments, np.arange(m), clusters, lengths, bin_edges=edges),
        "random": D.prepare(packing.segments, rng.permutation(m), clusters, lengths, bin_edges=edges),
    }


def check_png(path, min_bytes=8000, min_size=(400, 150)):
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > min_bytes
    with Image.open(path) as im:
        im.verify()
    with Image.open(path) as im:
        assert im.size[0] >= min_size[0] and im.size[1] >= min_size[1]
        # not a blank canvas: many distinct colours
        assert len(im.convert("RGB").getcolors(maxcolors=1 << 20) or []) > 20


def test_ordering_figures(schedules, tmp_path):
    check_png(P.plot_ordering_bars(schedules, tmp_path / "bars.png"))
    check_png(P.plot_window_diversity(schedules, tmp_path / "diversity.png"))
    check_png(P.plot_window_diversity(schedules, tmp_path / "diversity8.png", window=8))
    check_png(P.plot_prefix_errors(schedules, tmp_path / "prefix.png"))
    check_png(P.plot_batch_histograms(schedules, tmp_path / "hist.png", batch_size=8))
    with pytest.raises(StrataInputError):
        P.plot_ordering_bars({}, tmp_path / "none.png")


def test_ordering_bar_shows_the_schedule(schedules):
    # the cluster-sorted packing in order: the token stream's clusters never decrease;
    # a random ordering of the same sequences does not keep them sorted
    original = P._token_stream_clusters(schedules["original"], 500)
    assert np.all(np.diff(original) >= 0) and np.unique(original).size == 12
    assert np.any(np.diff(P._token_stream_clusters(schedules["random"], 500)) < 0)


def test_stationarity_figures(schedules, tmp_path):
    from pipeline.reports import stationarity as S
    from pipeline.reports import visual as V

    table = pl.concat([S.stationarity_table(sched, prefix=64, strategy=name) for name, sched in schedules.items()])
    for name in S.characteristics(table):
        check_png(P.plot_stationarity(table, name, tmp_path / f"{name}.png", prefix_sequences=64))
    figs = V.write_figures(schedules, None, np.zeros(1), tmp_path / "report", batch_size=8, stationarity=table, prefix_sequences=64)
    assert {f"stationarity_{c}" for c in S.characteristics(table)} <= set(figs)
    with pytest.raises(StrataInputError):
        P.plot_stationarity(table, "no_such_characteristic", tmp_path / "none.png")


def test_cluster_cloud_and_colors(tmp_path):
    rng = np.random.default_rng(0)
    cl = rng.integers(0, 5, 600)
    x = rng.normal(size=(600, 16)) + 4 * np.eye(5, 16)[cl]
    check_png(P.plot_cluster_cloud(x, cl, tmp_path / "cloud.png", sample_size=400, method="pca"))
    pts, used = P.embed_2d(x, "pca")
    assert used == "PCA" and pts.shape == (600, 2)
    for k in (3, 15, 200):
        colors = P.cluster_colors(k)
        assert colors.shape == (k, 3) and np.unique(colors.round(3), axis=0).shape[0] == k


def test_animation(schedules, tmp_path):
    path = P.animate_ordering(schedules["random"], tmp_path / "order.gif", frames=5, width=200)
    assert path.read_bytes()[:6] in (b"GIF87a", b"GIF89a")
    with Image.open(path) as im:
        assert im.n_frames == 5


def test_recommend_k_by_hand():
    # peak 0.31 at k=10; within 5%: >= 0.2945 -> k = 10, 15, 20 qualify; the largest is 20
    assert C.recommend_k([5, 10, 15, 20, 30], [0.2, 0.31, 0.30, 0.298, 0.25]) == 20
    # Diversity-ordered training's published sweep: peak 0.307 at k=10, nothing else within 5% -> 10
    ks = [10, 20, 30, 40, 50, 100, 200]
    assert C.recommend_k(ks, [0.307, 0.235, 0.234, 0.215, 0.214, 0.152, 0.145]) == 10
    with pytest.raises(StrataInputError):
        C.recommend_k([], [])


def test_calibrate_k_finds_the_blobs(tmp_path):
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(6, 24))
    x = np.repeat(centres, 250, axis=0) + 0.3 * rng.normal(size=(1500, 24))
    ks = (2, 3, 6, 12, 20)
    cal = C.calibrate_k(x, ks, sample_size=1000, seed=1)
    assert list(cal.ks) == list(ks) and cal.sample_size == 1000
    assert cal.ks[np.argmax(cal.silhouettes)] == 6 and cal.recommended_k == 6
    again = C.calibrate_k(x, ks, sample_size=1000, seed=1)
    np.testing.assert_array_equal(cal.silhouettes, again.silhouettes)
    assert cal.rows()[-1][1:] == ("recommended_k", "sample=1000;seed=1", 6.0)
    check_png(P.plot_k_calibration(cal.ks, cal.silhouettes, cal.recommended_k, tmp_path / "k.png"))


def test_calibrate_k_command(tmp_path, capsys):
    rng = np.random.default_rng(1)
    x = (np.repeat(rng.normal(size=(4, 8)), 50, axis=0) + 0.2 * rng.normal(size=(200, 8))).astype(np.float32)
    np.save(tmp_path / "emb.npy", x)
    parser = argparse.ArgumentParser()
    tools.register(parser.add_subparsers())
    args = parser.parse_args(["calibrate-k", str(tmp_path / "emb.npy"), "--ks", "2,4,8", "--plot", str(tmp_path / "k.png")])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "recommended k = 4" in out
    check_png(tmp_path / "k.png")
    bad = parser.parse_args(["calibrate-k", str(tmp_path / "missing.npy")])
    with pytest.raises(StrataInputError):
        bad.func(bad)


def test_figures_fit_the_dagster_pop_up(schedules, tmp_path):
    """The widest figures (ordering bars and prefix errors at 12-13 in; a 20 in figure) are saved at most
    MAX_WIDTH_PX wide, at a lower dpi rather than cropped; a narrow one keeps the full DPI."""
    from matplotlib.figure import Figure

    from pipeline.render.figures import DPI, MAX_WIDTH_PX, save_png

    widths = {}
    for name, path in (("bars", P.plot_ordering_bars(schedules, tmp_path / "bars.png")),
                       ("prefix", P.plot_prefix_errors(schedules, tmp_path / "prefix.png"))):
        with Image.open(path) as im:
            widths[name] = im.size[0]
    wide = Figure(figsize=(20, 3))
    wide.add_subplot().plot([0, 1], [0, 1])
    narrow = Figure(figsize=(4, 3))
    narrow.add_subplot().plot([0, 1], [0, 1])
    for name, fig in (("wide", wide), ("narrow", narrow)):
        with Image.open(save_png(fig, tmp_path / f"{name}.png", tight=name == "wide")) as im:
            widths[name] = im.size[0]
    assert max(widths.values()) <= MAX_WIDTH_PX and widths["wide"] >= MAX_WIDTH_PX - 3, widths
    assert widths["narrow"] == 4 * DPI, widths
