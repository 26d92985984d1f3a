"""ordering_diagnostics (per strategy) and diagnostics_report: the papers' yardsticks and figures."""

from pathlib import Path

import dagster as dg
import polars as pl
from dagster_duckdb import DuckDBResource

from assets.params import PARAM_CLASSES, asset_config
from assets.common import STRATEGY_PARTITIONS, Recorder, StrataSettings, shown
from pipeline.names import POSITIVE_CONTROL
from pipeline.ordering.strategies import training_time
from pipeline.reports import diagnostics as D
from pipeline.reports.markdown import frame_table
from pipeline.reports.diagnostics_report import ordering_schedules, write_diagnostics_report
from pipeline.represent.calibrate import DEFAULT_KS, calibrate_k
from pipeline.reports.frozen_boundary import boundary_summary
from pipeline.represent.embedding_index import open_embeddings
from pipeline.reports.plots import plot_k_calibration, plot_window_deviation
from pipeline.reports import stationarity as S
from pipeline.reports import visual as V
from pipeline.reports import windows as W
from pipeline.storage.atomic import file_sha256, write_parquet
from pipeline.storage.warehouse import replace_rows
from pipeline.segments import warm_kernels
from pipeline.threads import concurrently


STATIONARITY_CHECK = dg.AssetCheckSpec(
    "ordering_is_stationary", asset="ordering_diagnostics", blocking=False, partitions_def=STRATEGY_PARTITIONS,
    description="Every characteristic of the ordering (distinct clusters and documents per sequence, mean document "
                "length, concentration, cluster / length-bin / source share deviations), in each tenth of the stream and "
                "over the prefix training consumes, lies inside the band of uniform shuffles of the same sequences "
                "(table ordering_stationarity). Warns (does not fail the run), naming what is outside; the positive "
                "control (cluster_sorted, harmful on purpose) passes with its band violation labelled as expected.")

REPORT_CHECK = dg.AssetCheckSpec(
    "report_covers_strategies", asset="diagnostics_report", blocking=False,
    description="Every strategy of the config that has a schedule before training is in the report (a strategy whose "
                "ordering is missing would otherwise be left out without a word), and every figure is a PNG or GIF image.")

OrderingDiagnosticsParams = PARAM_CLASSES["ordering_diagnostics"]  # launchpad: stationarity_shuffles


def report_check(wanted: list[str], reported: list[str], figures: dict[str, Path]) -> dg.AssetCheckResult:
    """``report_covers_strategies``: passes when ``reported`` holds every strategy of ``wanted`` and
    each figure file starts with a PNG or GIF signature; else a WARN naming what is missing."""
    missing = [s for s in wanted if s not in reported]
    broken = [n for n, p in figures.items() if not p.read_bytes()[:8].startswith((b"\x89PNG\r\n\x1a\n", b"GIF8"))]
    problems = ([f"no ordering for {missing}: materialize their orderings"] if missing else []) + (
        [f"not an image: {broken}"] if broken else [])
    return dg.AssetCheckResult(check_name=REPORT_CHECK.name, passed=not problems, severity=dg.AssetCheckSeverity.WARN,
                               description="; ".join(problems) or f"{len(reported)} strategies, {len(figures)} figures",
                               metadata={"strategies": ", ".join(reported), "figures": len(figures)})


def stationarity_check(strategy: str, table: pl.DataFrame, n_random: int) -> dg.AssetCheckResult:
    """``ordering_is_stationary``: passes when no part of ``table`` is outside random's band; else
    a WARN whose description names every characteristic and part outside it."""
    if table.is_empty():
        return dg.AssetCheckResult(check_name=STATIONARITY_CHECK.name, passed=True, severity=dg.AssetCheckSeverity.WARN,
                                   description=f"{strategy} has no schedule before training: nothing to test",
                                   metadata={"strategy": strategy})
    lines = S.out_of_band(table)
    summary = S.out_of_band_summary(table)
    control = strategy == POSITIVE_CONTROL  # harmful on purpose: leaving the band is what it is for
    if lines and control:
        description = f"expected for the positive control: outside random's band: {summary}"
    else:
        description = f"outside random's band: {summary}" if lines else "every characteristic inside random's band"
    return dg.AssetCheckResult(
        check_name=STATIONARITY_CHECK.name, passed=not lines or control, severity=dg.AssetCheckSeverity.WARN,
        description=description,
        metadata={
            "strategy": strategy,
            **({"expected": "yes: the positive control is built to leave random's band (README)"} if control else {}),
            "parts_outside": len(lines),
            "characteristics_outside": ", ".join(S.characteristics(table.filter(~pl.col("inside")))) or "none",
            "outside": dg.MetadataValue.md("\n".join(f"- {line}" for line in lines) or "none"),
            "shuffles": n_random,
            # a uniform shuffle leaves the simultaneous envelope somewhere about this often (module docstring)
            "false_alarm_rate": f"about {1 / (n_random + 1):.3f} (1 / (shuffles + 1), all characteristics and parts at once)",
        },
    )


BANDS_KEPT = 8  # cached bands kept in each of diagnostics/bands and diagnostics/window_bands (the newest; KBs each)
WINDOW_BAND_VERSION = 1  # raised whenever the worst-window band's values change for the same inputs


def _packing_fingerprints(layout, strategy: str) -> dict[str, str] | None:
    """Content fingerprints of what a strategy's sequences are built from (its segments, the
    documents, the clusters), or None for a schedule realizing a mixture, whose unrolled stream
    depends on its order."""
    if layout.ordering_mixture(strategy).exists():
        return None
    own = layout.ordering_segments(strategy)
    return {"segments": file_sha256(own if own.exists() else layout.segments), "documents": file_sha256(layout.documents),
            "clusters": file_sha256(layout.clusters)}


def _cache_file(layout, folder: str, key: str) -> Path:
    """``diagnostics/<folder>/<key>.npy``, the folder's bands beyond the newest :data:`BANDS_KEPT` removed."""
    where = layout.inside("diagnostics", folder)
    if where.is_dir():
        old = sorted(where.glob("*.npy"), key=lambda p: p.stat().st_mtime, reverse=True)[BANDS_KEPT:]
        for p in old:
            p.unlink(missing_ok=True)
    return where / f"{key}.npy"


def band_cache(layout, strategy: str, cfg, prefix: int) -> Path | None:
    """``diagnostics/bands/<key>.npy``: where the stationarity band of ``strategy``'s sequences is
    cached, named by the content fingerprints of its segments, the documents and the clusters and
    by the band's parameters (``stationarity.band_key``); orderings of one packing share it. None for
    a schedule realizing a mixture, whose unrolled stream depends on its order. Older bands beyond
    the newest :data:`BANDS_KEPT` are removed."""
    prints = _packing_fingerprints(layout, strategy)
    if prints is None:
        return None
    key = S.band_key(**prints, length_bins=cfg.length_bins, prefix=prefix, shuffles=cfg.stationarity_shuffles, seed=cfg.seed)
    return _cache_file(layout, "bands", key)


def window_band_cache(layout, strategy: str, cfg) -> Path | None:
    """``diagnostics/window_bands/<key>.npy``: where random's worst-window band of ``strategy``'s
    sequences (``pipeline.reports.windows.random_band``) is cached, named like :func:`band_cache`'s
    by the packing's fingerprints and by the length bins, the batch, the shuffles and the seed;
    orderings of one packing share it. None for a schedule realizing a mixture."""
    prints = _packing_fingerprints(layout, strategy)
    if prints is None:
        return None
    key = S.band_key(**prints, band="worst_windows", window_band_version=WINDOW_BAND_VERSION, length_bins=cfg.length_bins,
                     batch=cfg.batch_size, shuffles=W.SHUFFLES, seed=cfg.seed)
    return _cache_file(layout, "window_bands", key)


def window_metadata(layout, strategy: str, metrics: pl.DataFrame) -> tuple[list[Path], dict]:
    """The worst-window figure ``diagnostics/<strategy>.windows.png`` and the metadata that shows
    it in the UI: the table of worst windows against random's band, the figure inline, and the
    window lengths where the ordering is above every shuffle."""
    frame = W.window_frame(metrics, strategy)
    if frame.is_empty():
        return [], {}
    png = plot_window_deviation(frame, strategy, layout.inside("diagnostics", f"{strategy}.windows.png"))
    above = "; ".join(f"{kind}: w = {', '.join(map(str, ws))}" for kind, ws in W.above_random(frame).items() if ws)
    return [png], {"worst_window": dg.MetadataValue.md(W.markdown(frame) + "\n\n" + V.image_markdown(png, "worst window vs window length")),
                   "worst_window_above_random": above or "none"}


@dg.asset(group_name="orderings", deps=["orderings"], partitions_def=STRATEGY_PARTITIONS, code_version="3", kinds={"duckdb"},
          check_specs=[STATIONARITY_CHECK])
def ordering_diagnostics(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource,
                         config: OrderingDiagnosticsParams) -> dg.MaterializeResult:
    """Unique clusters per sequence, per-batch share deviations (batches of 8/32/128), prefix error,
    drift per decile, and the worst window of every length ``batch_size x 2**i`` against random's
    band (Don't Shuffle, Optimize's max over windows [a:b]; ``window_dev_*`` rows, the figure
    ``diagnostics/<strategy>.windows.png``) — DuckDB table ``ordering_metrics`` and ``diagnostics/<strategy>.parquet``;
    stationarity (every characteristic per tenth and over the first ``max_steps x batch_size``
    sequences, against the band of ``stationarity_shuffles`` uniform shuffles) — DuckDB table
    ``ordering_stationarity`` and ``diagnostics/<strategy>.stationarity.parquet``, with the
    non-blocking check ``ordering_is_stationary``. The shuffles' values are computed once per
    packing and read by the other orderings of the same sequences (``diagnostics/bands/``,
    :func:`band_cache`), and so are the worst windows of random's shuffles (``diagnostics/window_bands/``,
    :func:`window_band_cache`).
    A training-time strategy (odm) has no schedule before training: it gets no rows here; its
    diagnostics come from the ids training consumed (``consumed_metrics``, see training_runs)."""
    rec = Recorder(context, duckdb, {"orderings": context.partition_key})
    warm_kernels()  # numba's first load, beside this run's reading
    cfg, layout = asset_config(context, settings, config), settings.layout()
    strategy = context.partition_key
    prefix = cfg.max_steps * cfg.batch_size
    reused = window_reused = False
    if strategy in training_time():
        metrics, stationarity = D.rows_frame([]), S.empty_table()
    else:
        sched = V.strategy_schedule(layout, strategy, cfg.length_bins)
        cache, window_cache = band_cache(layout, strategy, cfg, prefix), window_band_cache(layout, strategy, cfg)
        reused = cache is not None and cache.is_file()
        window_reused = window_cache is not None and window_cache.is_file()
        # independent: each one's one-core passes run while the other computes
        stationarity, metrics = concurrently(
            lambda: S.stationarity_table(sched, prefix=prefix, strategy=strategy, n_random=cfg.stationarity_shuffles,
                                         seed=cfg.seed, band_cache=cache),
            lambda: D.ordering_diagnostics(strategy, sched, batch_sizes=(8, 32, 128), window_batch=cfg.batch_size,
                                           seed=cfg.seed, window_band_cache=window_cache))
    out = write_parquet(metrics, layout.inside("diagnostics", f"{strategy}.parquet"))
    out_stat = write_parquet(stationarity, layout.inside("diagnostics", f"{strategy}.stationarity.parquet"))
    window_files, window_meta = window_metadata(layout, strategy, metrics)
    with duckdb.get_connection() as con:
        replace_rows(con, "ordering_metrics", metrics, {"strategy": strategy})
        replace_rows(con, "ordering_stationarity", stationarity, {"strategy": strategy})
    summary = V.summary_table(metrics)
    boundary = shown(boundary_summary(layout, strategy) or {})  # the frozen prefix's boundary, when the stream has one
    check = stationarity_check(strategy, stationarity, cfg.stationarity_shuffles)
    return rec.finish([out, out_stat, *window_files], {"metrics": metrics.height, "stationarity": stationarity.height},
                      {"strategy": strategy, "length_bins": cfg.length_bins, "prefix_sequences": prefix,
                       "stationarity_shuffles": cfg.stationarity_shuffles, "seed": cfg.seed, "window_batch": cfg.batch_size,
                       "window_shuffles": W.SHUFFLES},
                      {"summary": dg.MetadataValue.md(frame_table(summary)),
                       "stationarity": dg.MetadataValue.md(S.markdown(stationarity) if stationarity.height else "no schedule"),
                       "stationarity_outside": S.out_of_band_summary(stationarity) or "none",
                       "band": "shuffles of these sequences reused (diagnostics/bands)" if reused else "shuffles computed",
                       **window_meta,
                       **({"window_band": "shuffles' worst windows reused (diagnostics/window_bands)" if window_reused
                           else "shuffles' worst windows computed"} if window_meta else {}),
                       **boundary},
                      check_results=[check])


@dg.asset(group_name="orderings", deps=["ordering_diagnostics", "embeddings", "clusters"], code_version="2", kinds={"matplotlib"},
          check_specs=[REPORT_CHECK])
def diagnostics_report(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """All strategies side by side: figures under ``report/`` and ``report/diagnostics.md`` (one
    stationarity figure per characteristic, from ``ordering_stationarity``),
    corpus-side metrics (cluster sizes, silhouette, ARI/NMI vs source labels) in ``corpus_metrics``,
    and Diversity-ordered training's k calibration (silhouette vs k on a sample) in ``k_calibration``."""
    rec = Recorder(context, duckdb, {"ordering_diagnostics": "*", "embeddings": None, "clusters": None})
    cfg, layout = asset_config(context, settings), settings.layout()
    strategies = [s for s in cfg.strategies if layout.ordering(s).exists() and s not in training_time()]
    docs, schedules = ordering_schedules(layout, strategies, cfg.length_bins)
    emb = open_embeddings(layout)
    labels = docs["source"].to_numpy()
    corpus = D.corpus_diagnostics(docs["cluster"].to_numpy(), docs["stream_length"].to_numpy(), embeddings=emb,
                                  labels=labels if len(set(labels)) > 1 else None, seed=cfg.seed)
    with duckdb.get_connection() as con:
        replace_rows(con, "corpus_metrics", corpus, {})
        metrics = con.sql("SELECT * FROM ordering_metrics").pl().filter(pl.col("strategy").is_in(strategies))
        stationarity = S.sort_table(con.sql("SELECT * FROM ordering_stationarity").pl(), strategies)
    extra = {}
    ks = [k for k in DEFAULT_KS if k <= emb.shape[0] // 40]  # faiss wants >= 39 points per centroid
    if len(ks) >= 2:
        cal = calibrate_k(emb, ks, sample_size=min(5000, emb.shape[0]), seed=cfg.seed)
        extra["k_calibration"] = plot_k_calibration(cal.ks, cal.silhouettes, cal.recommended_k, layout.inside("report", "k_calibration.png"))
        with duckdb.get_connection() as con:
            replace_rows(con, "k_calibration", pl.DataFrame({"k": cal.ks, "silhouette": cal.silhouettes,
                                                            "recommended": cal.ks == cal.recommended_k}), {})
    summary, figures, md_path = write_diagnostics_report(layout, docs, schedules, emb, metrics, stationarity,
                                                         cfg.max_steps * cfg.batch_size, extra)
    windows = V.window_summary(metrics)
    ui = "\n\n".join([frame_table(summary), "**stationarity: outside random's band**",
                       frame_table(V.stationarity_summary(stationarity))]
                      + (["**worst window (max over windows [a:b]) above random's**", frame_table(windows)] if windows.height else [])
                      + [V.image_markdown(p, n) for n, p in figures.items()])
    check = report_check([s for s in cfg.strategies if s not in training_time()], strategies, figures)
    return rec.finish([md_path, *figures.values()], {"strategies": len(strategies), "figures": len(figures)},
                      {"strategies": strategies}, {"report": dg.MetadataValue.md(ui)}, check_results=[check])
