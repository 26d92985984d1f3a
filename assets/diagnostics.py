"""ordering_diagnostics (per strategy) and diagnostics_report: the papers' yardsticks and figures."""

import dagster as dg
import numpy as np
import polars as pl
from dagster_duckdb import DuckDBResource

from assets.params import PARAM_CLASSES, asset_config
from assets.common import STRATEGY_PARTITIONS, Recorder, StrataSettings
from pipeline.config import TRAINING_TIME_STRATEGIES
from pipeline.reports import diagnostics as D
from pipeline.represent.calibrate import DEFAULT_KS, calibrate_k
from pipeline.reports.plots import plot_k_calibration
from pipeline.reports import visual as V
from pipeline.storage.atomic import write_parquet, write_text
from pipeline.storage.warehouse import replace_rows


@dg.asset(group_name="orderings", deps=["orderings"], partitions_def=STRATEGY_PARTITIONS, code_version="1", kinds={"duckdb"})
def ordering_diagnostics(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """Unique clusters per sequence, per-batch share deviations (batches of 8/32/128), prefix error,
    drift per decile — DuckDB table ``ordering_metrics`` and ``diagnostics/<strategy>.parquet``.
    A training-time strategy (odm) has no schedule before training: it gets no rows here; its
    diagnostics come from the ids training consumed (``consumed_metrics``, see training_runs)."""
    rec = Recorder(context, duckdb, {"orderings": context.partition_key})
    cfg, layout = asset_config(context, settings), settings.layout()
    strategy = context.partition_key
    if strategy in TRAINING_TIME_STRATEGIES:
        metrics = D.rows_frame([])
    else:
        docs = V.document_features(layout)
        sched = V.load_schedule(layout, strategy, docs, cfg.length_bins)
        metrics = D.ordering_diagnostics(strategy, sched, batch_sizes=(8, 32, 128))
    out = write_parquet(metrics, layout.inside("diagnostics", f"{strategy}.parquet"))
    with duckdb.get_connection() as con:
        replace_rows(con, "ordering_metrics", metrics, {"strategy": strategy})
    summary = V.summary_table(metrics)
    return rec.finish([out], {"metrics": metrics.height}, {"strategy": strategy, "length_bins": cfg.length_bins},
                      {"summary": dg.MetadataValue.md(V.markdown_table(summary))})


@dg.asset(group_name="orderings", deps=["ordering_diagnostics", "embeddings", "clusters"], code_version="1", kinds={"matplotlib"})
def diagnostics_report(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """All strategies side by side: figures under ``report/`` and ``report/diagnostics.md``,
    corpus-side metrics (cluster sizes, silhouette, ARI/NMI vs source labels) in ``corpus_metrics``,
    and Diversity-ordered training's k calibration (silhouette vs k on a sample) in ``k_calibration``."""
    rec = Recorder(context, duckdb, {"ordering_diagnostics": "*", "embeddings": None, "clusters": None})
    cfg, layout = asset_config(context, settings), settings.layout()
    docs = V.document_features(layout)
    strategies = [s for s in cfg.strategies if layout.ordering(s).exists() and s not in TRAINING_TIME_STRATEGIES]
    schedules = {s: V.load_schedule(layout, s, docs, cfg.length_bins) for s in strategies}
    emb = np.load(layout.embeddings, mmap_mode="r")
    labels = docs["source"].to_numpy()
    corpus = D.corpus_diagnostics(docs["cluster"].to_numpy(), docs["stream_length"].to_numpy(), embeddings=emb,
                                  labels=labels if len(set(labels)) > 1 else None, seed=cfg.seed)
    with duckdb.get_connection() as con:
        replace_rows(con, "corpus_metrics", corpus, {})
        metrics = con.sql("SELECT * FROM ordering_metrics").pl().filter(pl.col("strategy").is_in(strategies))
    report_dir = layout.inside("report")
    figures = V.write_figures(schedules, emb, docs["cluster"].to_numpy(), report_dir)
    ks = [k for k in DEFAULT_KS if k <= emb.shape[0] // 40]  # faiss wants >= 39 points per centroid
    if len(ks) >= 2:
        cal = calibrate_k(emb, ks, sample_size=min(5000, emb.shape[0]), seed=cfg.seed)
        figures["k_calibration"] = plot_k_calibration(cal.ks, cal.silhouettes, cal.recommended_k, report_dir / "k_calibration.png")
        with duckdb.get_connection() as con:
            replace_rows(con, "k_calibration", pl.DataFrame({"k": cal.ks, "silhouette": cal.silhouettes,
                                                            "recommended": cal.ks == cal.recommended_k}), {})
    summary = V.summary_table(metrics)
    md_path = write_text(V.render_markdown(summary, figures, report_dir), report_dir / "diagnostics.md")
    ui = "\n\n".join([V.markdown_table(summary)] + [V.image_markdown(p, n) for n, p in figures.items()])
    return rec.finish([md_path, *figures.values()], {"strategies": len(strategies), "figures": len(figures)},
                      {"strategies": strategies}, {"report": dg.MetadataValue.md(ui)})
