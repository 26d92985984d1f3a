"""quality_shards and quality: every training document's quality score (a scorer of
pipeline/quality/scorers/), per corpus shard and gathered, with the quality filter (docs/quality.md).
Optional: ``strata run`` materializes them with ``quality.enabled``."""


import dagster as dg
from dagster_duckdb import DuckDBResource

from assets.common import SHARD_PARTITIONS, Recorder, StrataSettings
from assets.params import asset_config
from pipeline.quality import stage


@dg.asset(group_name="quality", deps=["corpus_shards"], partitions_def=SHARD_PARTITIONS, code_version="1", kinds={"numpy"})
def quality_shards(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """One corpus shard's training documents scored by ``quality.scorer``: ``quality/shards/``, named
    by the scorer's fingerprint (the model's bytes and parameters), so an unchanged shard is not
    scored again and an appended shard is the only partition to run. One call of
    ``pipeline.quality.stage.score_shard``."""
    rec = Recorder(context, duckdb)
    cfg, layout = asset_config(context, settings), settings.layout()
    return rec.finish_stage(stage.score_shard(layout, stage.QualityParams.from_config(cfg), context.partition_key))


@dg.asset(group_name="quality", deps=["corpus", "quality_shards", "tokens", "clusters"], code_version="1", kinds={"parquet", "duckdb"})
def quality(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """Every training document's score, ``quality/documents.parquet`` (the documents' ``quality``
    column for the orderings: a family, ``mixture.column``), the filter's removals (``quality.filter``,
    applied by ``sequences``), DuckDB ``quality_removed``, ``quality_by_source``, ``quality_by_cluster``
    and the distribution per source and per cluster (figure). One call of
    ``pipeline.quality.stage.gather_quality``."""
    rec = Recorder(context, duckdb)
    cfg, layout = asset_config(context, settings), settings.layout()
    return rec.finish_stage(stage.gather_quality(layout, stage.QualityParams.from_config(cfg), duckdb.get_connection))
