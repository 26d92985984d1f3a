"""ordering_diagnostics (per strategy) and diagnostics_report: the papers' yardsticks and figures."""

import dagster as dg
from dagster_duckdb import DuckDBResource

from assets.common import STRATEGY_PARTITIONS, Recorder, StrataSettings
from assets.params import PARAM_CLASSES, asset_config
from pipeline.reports import stage

STATIONARITY_CHECK = dg.AssetCheckSpec(
    stage.STATIONARITY_CHECK, asset="ordering_diagnostics", blocking=False, partitions_def=STRATEGY_PARTITIONS,
    description="Every characteristic of the ordering (distinct clusters and documents per sequence, mean document "
                "length, concentration, cluster / length-bin / source share deviations), in each tenth of the stream and "
                "over the prefix training consumes, lies inside the band of uniform shuffles of the same sequences "
                "(table ordering_stationarity). Warns (does not fail the run), naming what is outside; the positive "
                "control (cluster_sorted, harmful on purpose) passes with its band violation labelled as expected.")

REPORT_CHECK = dg.AssetCheckSpec(
    stage.REPORT_CHECK, asset="diagnostics_report", blocking=False,
    description="Every strategy of the config that has a schedule before training is in the report (a strategy whose "
                "ordering is missing would otherwise be left out without a word), and every figure is a PNG or GIF image.")

OrderingDiagnosticsParams = PARAM_CLASSES["ordering_diagnostics"]  # launchpad: stationarity_shuffles


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
    :func:`pipeline.reports.band_cache.band_cache`), and so are the worst windows of random's shuffles
    (``diagnostics/window_bands/``, :func:`pipeline.reports.band_cache.window_band_cache`).
    A training-time strategy (odm) has no schedule before training: it gets no rows here; its
    diagnostics come from the ids training consumed (``consumed_metrics``, see training_runs).
    One call of ``pipeline.reports.stage.diagnose_ordering``."""
    rec = Recorder(context, duckdb)
    cfg, layout = asset_config(context, settings, config), settings.layout()
    params = stage.DiagnoseParams.from_config(cfg)
    return rec.finish_stage(stage.diagnose_ordering(layout, params, context.partition_key, duckdb.get_connection))


@dg.asset(group_name="orderings", deps=["ordering_diagnostics", "embeddings", "clusters"], code_version="2", kinds={"matplotlib"},
          check_specs=[REPORT_CHECK])
def diagnostics_report(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """All strategies side by side: figures under ``report/`` and ``report/diagnostics.md`` (one
    stationarity figure per characteristic, from ``ordering_stationarity``),
    corpus-side metrics (cluster sizes, silhouette, ARI/NMI vs source labels) in ``corpus_metrics``,
    and Diversity-ordered training's k calibration (silhouette vs k on a sample) in ``k_calibration``;
    with ``quality.enabled``, each ordering's mean quality score in 50 windows of equal tokens
    (``quality_along_stream``, ``report/quality_along_stream.png``).
    One call of ``pipeline.reports.stage.diagnostics_report``."""
    rec = Recorder(context, duckdb)
    cfg, layout = asset_config(context, settings), settings.layout()
    return rec.finish_stage(stage.diagnostics_report(layout, stage.DiagnosticsReportParams.from_config(cfg), duckdb.get_connection))
