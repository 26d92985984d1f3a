"""clean: exact, near and semantic duplicates and benchmark contamination of the training documents."""


import dagster as dg
from dagster_duckdb import DuckDBResource

from assets.common import Recorder, StrataSettings
from assets.params import asset_config
from pipeline.clean import stage


@dg.asset(group_name="data", deps=["corpus", "tokens", "embeddings", "clusters"], code_version="1", kinds={"parquet", "duckdb"})
def clean(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """Each training document's duplicate group and kind (exact: normalized-text hash; near: MinHash +
    LSH over word n-grams, datasketch; semantic: SemDeDup within each k-means cluster, faiss) and
    its n-gram overlap (``decontam.ngram``, 13) with WikiText, Paloma, DCLM-core and the held-out
    split: ``clean/documents.parquet`` and DuckDB ``duplicates``, ``contamination``, ``clean_removed``.
    ``dedup.action`` and ``decontam.action`` decide which documents ``sequences`` and the
    document-level orderings leave out (docs/cleaning.md). One stage over the whole corpus (a
    duplicate crosses shards). One call of ``pipeline.clean.stage.clean_documents``."""
    rec = Recorder(context, duckdb, {"corpus": None, "tokens": None, "embeddings": None, "clusters": None})
    cfg, layout = asset_config(context, settings), settings.layout()
    return rec.finish_stage(stage.clean_documents(layout, cfg, duckdb.get_connection))
