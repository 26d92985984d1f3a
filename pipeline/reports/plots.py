"""Figures of the ordering diagnostics (PNG; optional GIF), one function per picture.

Built on ``matplotlib.figure.Figure`` (the Agg canvas), never pyplot: no global state, safe in
Dagster workers and headless machines. Every function writes its file atomically and returns
its path. Strategies are given as ``{name: Schedule}`` (see ``pipeline.reports.diagnostics.prepare``);
cluster colours are the same in every figure (:func:`cluster_colors`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

import numpy as np
import polars as pl

from pipeline.errors import StrataInputError
from pipeline.heavy import lazy
from pipeline.render.figures import cluster_colors, new_figure, save_png
from pipeline.reports import diagnostics as D
from pipeline.reports import stationarity as S
from pipeline.storage.atomic import atomic_path

ticker = lazy("matplotlib.ticker")  # imported when the first figure is drawn (pipeline/heavy.py)


def _check(schedules: Mapping[str, D.Schedule]) -> None:
    if not schedules:
        raise StrataInputError("no strategies to plot", fix="pass at least one {strategy: Schedule}")


def _token_stream_clusters(schedule: D.Schedule, width: int) -> np.ndarray:
    """Cluster of the token at ``width`` evenly spaced points of the schedule's token stream."""
    comp = schedule.clusters
    idx = np.argsort(schedule.position[comp.seq], kind="stable")
    ends = np.cumsum(comp.tokens[idx])
    points = (np.arange(width) + 0.5) * ends[-1] / width
    return comp.group[idx][np.searchsorted(ends, points, side="right")]


def plot_ordering_bars(schedules: Mapping[str, D.Schedule], path: str | os.PathLike, width: int = 1400) -> Path:
    """Diversity-ordered training's ordering bar: the cluster of each token along the schedule, one bar per strategy.

    Blocks of one colour are runs of one cluster; a fine-grained mix is an even spread.
    """
    _check(schedules)
    k = max(s.clusters.n_groups for s in schedules.values())
    colors = cluster_colors(k)
    fig = new_figure(figsize=(13, 0.55 * len(schedules) + 1.1))
    axes = fig.subplots(len(schedules), 1, squeeze=False)[:, 0]
    for ax, (name, sched) in zip(axes, schedules.items()):
        img = colors[_token_stream_clusters(sched, width)][None, :, :]
        ax.imshow(img, aspect="auto", interpolation="nearest", extent=(0, 1, 0, 1))
        ax.set_yticks([])
        ax.set_ylabel(name, rotation=0, ha="right", va="center", fontsize=10)
        ax.set_xticks([])
    axes[-1].set_xticks(np.linspace(0, 1, 11))
    axes[-1].set_xticklabels([f"{int(x * 100)}%" for x in np.linspace(0, 1, 11)])
    axes[-1].set_xlabel("position in the schedule (share of tokens)")
    fig.suptitle(f"Cluster of each token along the schedule (K={k})", fontsize=11)
    fig.subplots_adjust(left=0.13, right=0.98, top=1 - 0.45 / fig.get_figheight(),
                        bottom=0.65 / fig.get_figheight(), hspace=0.35)
    return save_png(fig, path, tight=False)


def _bin_means(y: np.ndarray, n_points: int) -> tuple[np.ndarray, np.ndarray]:
    """Means of ``y`` over ``n_points`` equal runs (x = run centre index)."""
    n = min(n_points, y.size)
    part = np.arange(y.size) * n // y.size
    mean = np.bincount(part, weights=y, minlength=n) / np.bincount(part, minlength=n)
    centre = np.bincount(part, weights=np.arange(y.size), minlength=n) / np.bincount(part, minlength=n)
    return centre, mean


def plot_window_diversity(
    schedules: Mapping[str, D.Schedule], path: str | os.PathLike, window: int = 1, n_points: int = 300
) -> Path:
    """Diversity-ordered training's line chart: distinct clusters per window of ``window`` sequences along the
    schedule (averaged over ``n_points`` stretches), strategies overlaid."""
    _check(schedules)
    fig = new_figure(figsize=(10, 4.2))
    ax = fig.subplots()
    for name, sched in schedules.items():
        u = D.window_unique(sched.clusters, sched.position, window).astype(np.float64)
        x, y = _bin_means(u, n_points)
        ax.plot(x * window, y, label=f"{name} (mean {u.mean():.2f})", lw=1.4)
    unit = "sequence" if window == 1 else f"window of {window} sequences"
    ax.set_xlabel("position in the schedule (sequences)")
    ax.set_ylabel(f"distinct clusters per {unit}")
    ax.set_title(f"Diversity along the schedule (distinct clusters per {unit})", fontsize=11)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9)
    fig.tight_layout()
    return save_png(fig, path, tight=False)


def plot_prefix_errors(schedules: Mapping[str, D.Schedule], path: str | os.PathLike, n_points: int = 64) -> Path:
    """Don't Shuffle, Optimize's side-by-side chart: ||T(t) - tau S(t)|| / S(t) for clusters and for length bins."""
    _check(schedules)
    fig = new_figure(figsize=(12, 4.4))
    axes = fig.subplots(1, 2)
    for ax, kind, label in ((axes[0], "clusters", "clusters"), (axes[1], "bins", "document-length bins")):
        for name, sched in schedules.items():
            comp = sched.clusters if kind == "clusters" else sched.bins
            t = D.log_spaced_points(sched.n_sequences, n_points)
            err = D.prefix_errors(comp, sched.position, t)
            ok = err > 1e-12  # the full schedule has error 0 by construction
            ax.loglog(t[ok], err[ok], label=name, lw=1.5)
        ax.set_xlabel("prefix length t (sequences)")
        ax.set_ylabel("||T(t) - share·S(t)|| / S(t)")
        ax.set_title(f"Prefix error: {label}", fontsize=11)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=9)
    fig.tight_layout()
    return save_png(fig, path, tight=False)


def plot_batch_histograms(schedules: Mapping[str, D.Schedule], path: str | os.PathLike, batch_size: int = 32) -> Path:
    """Histogram over batches of max_j |rho_j(batch) - rho_j(global)|, clusters and length bins,
    one outline per strategy on shared log-spaced bins (the best/worst batch are the ends)."""
    _check(schedules)
    fig = new_figure(figsize=(12, 4.4))
    axes = fig.subplots(1, 2)
    for ax, kind, label in ((axes[0], "clusters", "cluster shares"), (axes[1], "bins", "length-bin shares")):
        devs = {}
        for name, sched in schedules.items():
            comp = sched.clusters if kind == "clusters" else sched.bins
            devs[name] = D.batch_deviations(comp, sched.position, batch_size)
        allv = np.concatenate([d for d in devs.values() if d.size] or [np.ones(1)])
        lo, hi = max(allv.min(), 1e-6), max(allv.max(), 2e-6)
        edges = np.geomspace(lo * 0.95, hi * 1.05, 50)
        for name, d in devs.items():
            if d.size:
                ax.hist(np.clip(d, edges[0], edges[-1]), bins=edges, histtype="step", lw=1.6,
                        label=f"{name} (worst {d.max():.3f})")
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(ticker.FormatStrFormatter("%.3g"))
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        ax.set_xlabel(f"per-batch max deviation of {label}")
        ax.set_ylabel("batches")
        ax.set_title(f"Batches of {batch_size} sequences: {label}", fontsize=11)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=9)
    fig.tight_layout()
    return save_png(fig, path, tight=False)


def embed_2d(embeddings: np.ndarray, method: str = "auto", seed: int = 0) -> tuple[np.ndarray, str]:
    """2-D projection for the cluster cloud: UMAP (cosine, after PCA to 50) when ``umap-learn``
    is installed and ``method`` is ``auto`` or ``umap``, else PCA. Returns (points, method used)."""
    x = np.asarray(embeddings, dtype=np.float64)
    x = x - x.mean(axis=0)
    if method in ("auto", "umap"):
        try:
            import umap  # type: ignore[import-not-found]
        except ImportError:
            if method == "umap":
                raise StrataInputError("umap-learn is not installed", fix="pip install umap-learn, or use method='pca'") from None
        else:
            u, s, _ = np.linalg.svd(x, full_matrices=False)
            reduced = u[:, :50] * s[:50]
            return umap.UMAP(n_components=2, metric="cosine", random_state=seed).fit_transform(reduced), "UMAP"
    _, _, vt = np.linalg.svd(x, full_matrices=False)
    return x @ vt[:2].T, "PCA"


def plot_cluster_cloud(
    embeddings: np.ndarray,
    doc_cluster: np.ndarray,
    path: str | os.PathLike,
    *,
    sample_size: int = 8000,
    seed: int = 0,
    method: str = "auto",
) -> Path:
    """Documents as dots in 2-D (PCA, or UMAP when installed) coloured by cluster, on a seeded sample."""
    cl = np.asarray(doc_cluster, dtype=np.int64)
    if len(embeddings) != cl.size:
        raise StrataInputError("embeddings and doc_cluster differ in rows", fix="pass one embedding per doc_id")
    rng = np.random.default_rng(seed)
    idx = np.sort(rng.choice(cl.size, size=min(sample_size, cl.size), replace=False))
    x = embeddings if hasattr(embeddings, "shape") else np.asarray(embeddings)  # the sharded matrix: only the sample is read
    pts, used = embed_2d(np.asarray(x[idx]), method, seed)
    k = int(cl.max()) + 1
    fig = new_figure(figsize=(7.5, 7))
    ax = fig.subplots()
    ax.scatter(pts[:, 0], pts[:, 1], c=cluster_colors(k)[cl[idx]], s=5 if idx.size > 2000 else 14, alpha=0.7, lw=0)
    ax.set_title(f"Cluster cloud ({used}, {idx.size:,} of {cl.size:,} documents, K={k})", fontsize=11)
    ax.set_xticks([])
    ax.set_yticks([])
    fig.tight_layout()
    return save_png(fig, path, tight=False)


def plot_k_calibration(ks: np.ndarray, silhouettes: np.ndarray, recommended: int, path: str | os.PathLike) -> Path:
    """Silhouette vs k with the peak, the 5%-of-peak threshold and the recommended k (Diversity-ordered training)."""
    ks = np.asarray(ks)
    sil = np.asarray(silhouettes, dtype=np.float64)
    peak = float(sil.max())
    fig = new_figure(figsize=(8, 4.4))
    ax = fig.subplots()
    ax.plot(ks, sil, "o-", lw=1.5, color="tab:blue")
    ax.axhline(peak - 0.05 * abs(peak), color="gray", ls="--", lw=1, label="5% below the peak")
    ax.axvline(recommended, color="tab:red", lw=1.2, label=f"recommended k = {recommended}")
    ax.plot(ks[np.argmax(sil)], peak, "*", ms=14, color="tab:orange", label=f"peak {peak:.3f}")
    ax.set_xscale("log")
    ax.set_xticks(ks)
    ax.xaxis.set_minor_formatter(ticker.NullFormatter())
    ax.set_xticklabels([str(k) for k in ks])
    ax.set_xlabel("number of clusters k")
    ax.set_ylabel("silhouette (cosine)")
    ax.set_title("k calibration: the largest k within 5% of the peak silhouette", fontsize=11)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9)
    fig.tight_layout()
    return save_png(fig, path, tight=False)


def _dominant_cluster(comp: D.Composition) -> np.ndarray:
    """The cluster holding most tokens of each sequence (ties: the larger cluster id)."""
    idx = np.lexsort((comp.group, comp.tokens, comp.seq))
    last = np.r_[comp.seq[idx][1:] != comp.seq[idx][:-1], True]
    out = np.empty(comp.n_sequences, dtype=np.int64)
    out[comp.seq[idx][last]] = comp.group[idx][last]
    return out


def animate_ordering(
    schedule: D.Schedule, path: str | os.PathLike, *, frames: int = 40, width: int = 600, fps: int = 8
) -> Path:
    """GIF of Diversity-ordered training's ordering animation: the scheduled prefix (bright, in schedule order)
    grows from the left while the sequences not yet scheduled (dimmed, in packing order) shrink
    on the right. Each column shows a sequence's dominant cluster."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from PIL import Image

    dom = _dominant_cluster(schedule.clusters)
    colors = cluster_colors(schedule.clusters.n_groups)
    m = schedule.n_sequences
    cols = (np.arange(width) + 0.5) * m / width
    cols = cols.astype(np.int64)

    def image(k: int) -> np.ndarray:
        stream = np.concatenate([schedule.order[:k], np.flatnonzero(schedule.position >= k)])
        rgb = colors[dom[stream[cols]]].copy()
        rgb[cols >= k] = 0.35 * rgb[cols >= k] + 0.65
        return rgb[None]

    fig = new_figure(figsize=(9, 1.8), dpi=80)
    canvas = FigureCanvasAgg(fig)
    ax = fig.subplots()
    im = ax.imshow(image(0), aspect="auto", interpolation="nearest")
    ax.set_yticks([])
    ax.set_xticks([])
    title = ax.set_title("scheduled", fontsize=10)
    fig.tight_layout()
    pictures = []
    for f in range(frames):
        k = round(f * m / max(frames - 1, 1))
        im.set_data(image(k))
        title.set_text(f"scheduled {k:,} / {m:,} sequences (bright) · rest in packing order (dim)")
        canvas.draw()
        pictures.append(Image.fromarray(np.asarray(canvas.buffer_rgba())[:, :, :3]).quantize(colors=255))
    with atomic_path(path) as tmp:
        pictures[0].save(tmp, format="GIF", save_all=True, append_images=pictures[1:], duration=1000 // fps, loop=0)
    return Path(path)


def plot_stationarity(frame: pl.DataFrame, characteristic: str, path: str | os.PathLike, *,
                      prefix_sequences: int | None = None) -> Path:
    """One characteristic of the stationarity table (``pipeline.reports.stationarity``): its value
    in each tenth of the stream, one line per strategy, with random's band shaded, and the value
    over the consumed prefix marked right of the tenths (diamond) with the prefix's band.

    The band most strategies share (same sequences: sequence-level strategies) is shaded grey; a
    strategy with its own packing (document-level strategies) has its own band, drawn as dotted
    lines in its colour. Points outside their band are ringed in red.
    """
    sub = frame.filter(pl.col("characteristic") == characteristic)
    if sub.is_empty():
        raise StrataInputError(f"no rows for characteristic {characteristic!r}", fix="pass a stationarity_table with it")
    strategies = list(sub["strategy"].unique(maintain_order=True))
    colors = cluster_colors(len(strategies))  # tab10 up to 10 strategies
    per = _stationarity_series(sub, strategies)
    n = max(v["value"].size for v in per.values())
    x, xp = np.arange(n), n + 0.6
    bands: dict[tuple, list[str]] = {}
    for name, v in per.items():
        key = tuple(np.round([v["band_lo"][0], v["band_hi"][0], *v["p_band_lo"], *v["p_band_hi"]], 12))
        bands.setdefault(key, []).append(name)
    shared = max(bands, key=lambda k: (len(bands[k]), "random" in bands[k]))
    fig = new_figure(figsize=(9.5, 4.6))
    ax = fig.subplots()
    one_sided = characteristic in S.SHARE
    ax.fill_between([-0.4, n - 0.6], shared[0], shared[1], color="0.82", lw=0, label=f"random's band ({', '.join(bands[shared])})")
    ax.fill_between([xp - 0.35, xp + 0.35], shared[2], shared[3], color="0.82", lw=0)
    if one_sided:  # the band's top is the threshold
        ax.hlines(shared[1], -0.4, n - 0.6, colors="0.35", lw=1.2)
        ax.hlines(shared[3], xp - 0.35, xp + 0.35, colors="0.35", lw=1.2)
    _draw_strategies(ax, per, bands, shared, colors, x, xp)
    ax.axvline((n - 1 + xp) / 2, color="0.4", lw=0.8)
    ax.set_xticks([*x, xp])
    ax.set_xticklabels([str(i) for i in x] + ["prefix" + (f"\n{prefix_sequences:,} seq." if prefix_sequences else "")])
    ax.set_xlim(-0.6, xp + 0.6)
    ax.set_xlabel("tenth of the stream  |  the prefix training consumes")
    ax.set_ylabel(S.LABELS.get(characteristic, characteristic))
    kind = "targeted by f3" if characteristic in S.TARGETED else "not targeted"
    side = "; lower is better: only the band's top matters" if one_sided else ""
    ax.set_title(f"Stationarity: {characteristic} ({kind}{side})", fontsize=11)
    if one_sided:
        ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    fig.tight_layout()
    return save_png(fig, path, tight=False)


def _stationarity_series(sub: pl.DataFrame, strategies: list[str]) -> dict[str, dict[str, np.ndarray]]:
    """Per strategy, one characteristic's value, band and inside flag in each tenth (in order), and
    over the consumed prefix (keys with ``p_``)."""
    per: dict[str, dict[str, np.ndarray]] = {}
    for name in strategies:
        rows = sub.filter(pl.col("strategy") == name)
        tenth = rows.filter(pl.col("part") != S.PREFIX).with_columns(i=pl.col("part").cast(pl.Int64)).sort("i")
        pre = rows.filter(pl.col("part") == S.PREFIX)
        per[name] = {k: tenth[k].to_numpy() for k in ("value", "band_lo", "band_hi", "inside")} | {
            "p_" + k: pre[k].to_numpy() for k in ("value", "band_lo", "band_hi", "inside")}
    return per


def _draw_strategies(ax, per: dict[str, dict[str, np.ndarray]], bands: dict[tuple, list[str]], shared: tuple, colors,
                     x: np.ndarray, xp: float) -> None:
    """Each strategy's tenths (a line) and prefix (a diamond, spread sideways), its own band dotted
    where it is not the ``shared`` one, and every point outside its band ringed in red."""
    n = x.size
    ring_x: list[float] = []
    ring_y: list[float] = []
    for i, (name, v) in enumerate(per.items()):
        color = colors[i]
        own = next(k for k, names in bands.items() if name in names)
        if own != shared:
            ax.hlines([own[0], own[1]], -0.4, n - 0.6, colors=[color], linestyles=":", lw=1.2,
                      label=f"{', '.join(bands[own])}'s band (own packing)" if bands[own][0] == name else None)
            ax.hlines([own[2], own[3]], xp - 0.35, xp + 0.35, colors=[color], linestyles=":", lw=1.2)
        m = v["value"].size
        ax.plot(x[:m], v["value"], "-o", color=color, ms=4, lw=1.6, label=name)
        off = (i - (len(per) - 1) / 2) * 0.12
        ax.plot([xp + off] * v["p_value"].size, v["p_value"], "D", color=color, ms=7, mec="black", mew=0.5)
        ring_x += [*x[:m][~v["inside"]], *[xp + off] * int((~v["p_inside"]).sum())]
        ring_y += [*v["value"][~v["inside"]], *v["p_value"][~v["p_inside"]]]
    if ring_x:
        ax.scatter(ring_x, ring_y, s=130, facecolors="none", edgecolors="red", lw=1.4, zorder=5, label="outside its band")


def plot_window_deviation(frame: pl.DataFrame, strategy: str, path: str | os.PathLike) -> Path:
    """Don't Shuffle, Optimize's objective over every window ``[a:b]``: the worst window's share
    deviation against the window length (sequences), log-log, clusters and length bins side by
    side; the strategy's curve over random's band (the shuffles' min..max shaded, their median
    dashed), lengths where the strategy is above every shuffle ringed in red.

    ``frame``: one strategy's :func:`pipeline.reports.windows.window_frame`."""
    if frame.is_empty():
        raise StrataInputError(f"no window rows for {strategy!r}", fix="compute ordering_diagnostics with window_batch")
    kinds = [k for k in ("clusters", "length_bins") if (frame["kind"] == k).any()]
    fig = new_figure(figsize=(12, 4.4))
    axes = np.atleast_1d(fig.subplots(1, len(kinds)))
    floor = 1e-6  # a deviation of 0 (a window of exactly the global mixture) sits at the axis floor
    for ax, kind in zip(axes, kinds):
        rows = frame.filter(pl.col("kind") == kind).sort("w")
        w = rows["w"].to_numpy()
        worst, lo, med, hi = (np.maximum(rows[c].to_numpy(), floor) for c in ("worst", "random_min", "random_median", "random_max"))
        ax.fill_between(w, lo, hi, color="0.8", lw=0, label="random: min..max of the shuffles")
        ax.plot(w, med, color="0.35", ls="--", lw=1.2, label="random: median")
        ax.plot(w, worst, "-o", color="#1f77b4", ms=4, lw=1.8, label=strategy)
        above = rows["worst"].to_numpy() > rows["random_max"].to_numpy()
        if above.any():
            ax.scatter(w[above], worst[above], s=110, facecolors="none", edgecolors="red", lw=1.4, zorder=5,
                       label="above every shuffle")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_locator(ticker.LogLocator(base=2))
        ax.xaxis.set_major_formatter(ticker.FormatStrFormatter("%d"))
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        ax.set_xlabel("window length w (sequences; windows start every batch)")
        ax.set_ylabel(r"worst window: $\max_{[a:b]}\,\max_j\,|\mathrm{share}_j - \tau_j|$")
        label = "clusters" if kind == "clusters" else "document-length bins"
        ax.set_title(f"{label}: above every shuffle at {int(above.sum())} of {w.size} lengths", fontsize=10)
        ax.grid(alpha=0.3, which="major")
        ax.grid(alpha=0.1, which="minor")
        ax.legend(fontsize=8)
    fig.suptitle(f"Don't Shuffle, Optimize's objective over every window [a:b]: {strategy} vs random", fontsize=11)
    fig.tight_layout()
    return save_png(fig, path, tight=False)
