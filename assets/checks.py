"""Asset checks that prove nothing was lost: token conservation, cluster coverage, unit-norm embeddings
(each one call of its check function beside the stage, returning a ``pipeline.stage.CheckFact``)."""


import dagster as dg
from dagster_duckdb import DuckDBResource

from assets.common import StrataSettings, check_result
from pipeline.packing import stage as packing
from pipeline.represent import stage as represent


@dg.asset_check(asset="sequences", blocking=True,
                description="Every token of every document appears exactly once in the sequences, except the reported dropped tail "
                            "and the documents the clean stage removed (their tokens by reason).")
def token_conservation(settings: StrataSettings, duckdb: DuckDBResource) -> dg.AssetCheckResult:
    params = packing.PackParams.from_config(settings.config())
    return check_result(packing.token_conservation(settings.layout(), params, duckdb.get_connection))


@dg.asset_check(asset="clusters", blocking=True, description="Every training document has exactly one cluster in [0, k).")
def clusters_cover_documents(settings: StrataSettings) -> dg.AssetCheckResult:
    return check_result(represent.clusters_cover_documents(settings.layout()))


@dg.asset_check(asset="embeddings", blocking=True, description="Embeddings are finite and unit-norm.")
def embeddings_normalized(settings: StrataSettings) -> dg.AssetCheckResult:
    return check_result(represent.embeddings_normalized(settings.layout()))
