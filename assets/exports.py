"""exports: one partition per strategy, the ordering written for other trainers in Strata's order."""

import dagster as dg
from dagster_duckdb import DuckDBResource

from assets.common import STRATEGY_PARTITIONS, Recorder, StrataSettings
from assets.params import PARAM_CLASSES, asset_config
from pipeline.export import stage

ExportsParams = PARAM_CLASSES["exports"]  # launchpad: this asset's parameters (assets/params.py)


@dg.asset(group_name="orderings", deps=["orderings"], partitions_def=STRATEGY_PARTITIONS, code_version="1", kinds={"numpy"})
def exports(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource,
            config: ExportsParams) -> dg.MaterializeResult:
    """Write the partition's ordering in every format of ``export_formats`` under
    ``exports/<strategy>/<format>/`` (global batch ``export.global_batch`` or ``batch_size``,
    ``export_world_size`` ranks, ``export_workers`` workers; see docs/export.md); a strategy with
    nothing to export is skipped (metadata ``skipped``). One call of ``pipeline.export.stage.export_strategy``."""
    rec = Recorder(context, duckdb)
    cfg, layout = asset_config(context, settings, config), settings.layout()
    return rec.finish_stage(stage.export_strategy(layout, stage.ExportParams.from_config(cfg), context.partition_key, log=context.log.info))
