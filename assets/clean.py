"""clean_shards and clean: exact, near and semantic duplicates and benchmark contamination of the
training documents, scanned per corpus shard and gathered across shards."""


import dagster as dg
from dagster_duckdb import DuckDBResource

from assets.common import SHARD_PARTITIONS, Recorder, StrataSettings
from assets.params import asset_config
from pipeline.clean import stage


@dg.asset(group_name="data", deps=["corpus_shards"], partitions_def=SHARD_PARTITIONS, code_version="1", kinds={"numpy"})
def clean_shards(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """One corpus shard's training documents scanned for the clean stage: normalized-text hashes,
    MinHash signatures (datasketch) and n-gram hits against WikiText, Paloma and DCLM-core, under
    ``clean/shards/`` (docs/cleaning.md). An unchanged shard is not read again; an appended shard is
    the only partition to run. One call of ``pipeline.clean.stage.scan_shard``."""
    rec = Recorder(context, duckdb)
    cfg, layout = asset_config(context, settings), settings.layout()
    return rec.finish_stage(stage.scan_shard(layout, stage.CleanParams.from_config(cfg), context.partition_key))


@dg.asset(group_name="data", deps=["corpus", "clean_shards", "tokens", "embeddings", "clusters"], code_version="2",
          kinds={"parquet", "duckdb"})
def clean(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """Each training document's duplicate group and kind (exact: normalized-text hash; near: MinHash +
    LSH, datasketch; semantic: SemDeDup within each k-means cluster, faiss), each against every
    earlier document whichever shard holds it, and its n-gram overlap (``decontam.ngram``, 13) with
    WikiText, Paloma, DCLM-core and the held-out split: ``clean/documents.parquet`` and DuckDB
    ``duplicates``, ``contamination``, ``clean_removed``. ``dedup.action`` and ``decontam.action``
    decide which documents ``sequences`` and the document-level orderings leave out
    (docs/cleaning.md). One call of ``pipeline.clean.stage.clean_documents``."""
    rec = Recorder(context, duckdb)
    cfg, layout = asset_config(context, settings), settings.layout()
    return rec.finish_stage(stage.clean_documents(layout, stage.CleanParams.from_config(cfg), duckdb.get_connection))
