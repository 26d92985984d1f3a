"""orderings: one partition per strategy, each a permutation of the packed sequences, or a schedule
(sequences repeated or left out) for a strategy that realizes a mixture (``greedy_mixture``)."""


import dagster as dg
from dagster_duckdb import DuckDBResource

from assets.common import STRATEGY_PARTITIONS, Recorder, StrataSettings
from assets.params import PARAM_CLASSES, asset_config
from pipeline.ordering import stage

PERMUTATION_CHECK = dg.AssetCheckSpec("ordering_is_permutation", asset="orderings", blocking=True,
                                      description="The partition's ordering is a permutation of its sequences.")
CAPS_CHECK = dg.AssetCheckSpec(
    "schedule_within_caps", asset="orderings", blocking=True,
    description="A schedule (a strategy that realizes a mixture) names only packed sequences, none more than max_sequence_copies "
                "times, and its accounting (orderings/<strategy>.mixture.parquet) matches the order and loses no token: per "
                "cluster, corpus = distinct + omitted and scheduled = distinct + repeated tokens.")
MIXTURE_CHECK = dg.AssetCheckSpec(
    "schedule_realizes_mixture", asset="orderings", blocking=False,
    description="A schedule's realized cluster token shares lie within mixture_tolerance (L1) of the target mixture. "
                "Warns where the corpus cannot give the mixture under max_sequence_copies; `strata run` prints the warning at its end.")

BUDGET_CHECK = dg.AssetCheckSpec(
    "schedule_meets_budget", asset="orderings", blocking=False,
    description="A blend's schedule holds the tokens asked (mixture_budget_tokens, 0 = the packing's) within one sequence. "
                "Warns, naming the group whose caps bind and the share of the corpus used, where the caps cut it "
                "(mixture.on_infeasible: error stops instead).")


OrderingsParams = PARAM_CLASSES["orderings"]  # launchpad: this asset's parameters (assets/params.py)


@dg.asset(group_name="orderings", deps=["sequences"], partitions_def=STRATEGY_PARTITIONS, code_version="2", kinds={"parquet"},
          check_specs=[PERMUTATION_CHECK, CAPS_CHECK, MIXTURE_CHECK, BUDGET_CHECK])
def orderings(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource,
              config: OrderingsParams) -> dg.MaterializeResult:
    """Order the sequences with the partition's strategy: ``orderings/<strategy>.parquet`` (position, sequence_id).

    Its check ``ordering_is_permutation`` reads this partition's files only (other strategies'
    files may still hold an ordering of an older corpus until they are re-run). A strategy that
    realizes a mixture writes a schedule instead, with ``orderings/<strategy>.mixture.parquet``
    (per cluster: target and realized share, corpus / scheduled / distinct / repeated / omitted
    tokens, most copies; DuckDB ``mixture_schedule``) and the checks ``schedule_within_caps``
    (blocking) and ``schedule_realizes_mixture`` (warns).

    With ``freeze_prefix`` P, positions ``[0, P)`` keep the recorded frozen prefix and the strategy
    orders the rest after it; the prefix (``frozen/<strategy>.*``), its version chain and the
    DuckDB table ``ordering_frozen_prefix`` are written, and the metadata shows the boundary.
    P is the one ``sequences`` packed with (its ``meta.json``). One call of
    ``pipeline.ordering.stage.order_strategy``."""
    rec = Recorder(context, duckdb)
    cfg, layout = asset_config(context, settings, config), settings.layout()
    code_version = context.assets_def.code_versions_by_key.get(context.assets_def.key) or ""
    params = stage.OrderStageParams.from_config(cfg)
    return rec.finish_stage(stage.order_strategy(layout, params, context.partition_key, duckdb.get_connection, code_version))
