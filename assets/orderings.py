"""orderings: one partition per strategy, each a permutation of the packed sequences."""


import dagster as dg
import numpy as np
import polars as pl
from dagster_duckdb import DuckDBResource

from assets.params import PARAM_CLASSES, asset_config
from assets.common import STRATEGY_PARTITIONS, Recorder, StrataSettings
from pipeline.storage.atomic import write_parquet
from pipeline.storage.layout import Store
from pipeline.ordering import strategies
from pipeline.ordering.engine import OrderParams, run_strategy
from pipeline.reports.diagnostics import ordering_ids

PERMUTATION_CHECK = dg.AssetCheckSpec("ordering_is_permutation", asset="orderings", blocking=True,
                                      description="The partition's ordering is a permutation of its sequences.")


def ordering_inputs(layout, params: OrderParams | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Per-document (doc_id, cluster, n_tokens as stream length incl. EOS, content_hash, and the
    documents columns ``params``' families name, e.g. source) and base segments."""
    extra = params.column_families() if params is not None else []
    have = pl.read_parquet_schema(layout.documents)
    cols = ["doc_id", "n_tokens", "content_hash"] + [c for c in extra if c in have]
    docs = pl.read_parquet(layout.documents, columns=cols).join(
        pl.read_parquet(layout.clusters), on="doc_id"
    ).with_columns(pl.col("n_tokens") + 1).sort("doc_id")
    return docs, pl.read_parquet(layout.segments)


OrderingsParams = PARAM_CLASSES["orderings"]  # launchpad: this asset's parameters (assets/params.py)


@dg.asset(group_name="orderings", deps=["sequences"], partitions_def=STRATEGY_PARTITIONS, code_version="2", kinds={"parquet"},
          check_specs=[PERMUTATION_CHECK])
def orderings(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource,
              config: OrderingsParams) -> dg.MaterializeResult:
    """Order the sequences with the partition's strategy: ``orderings/<strategy>.parquet`` (position, sequence_id).

    Its check ``ordering_is_permutation`` reads this partition's files only (other strategies'
    files may still hold an ordering of an older corpus until they are re-run)."""
    rec = Recorder(context, duckdb, {"sequences": None})
    cfg, layout = asset_config(context, settings, config), settings.layout()
    strategy = context.partition_key
    params = OrderParams.from_config(cfg)
    docs, segments = ordering_inputs(layout, params)
    # A training-time strategy (odm) picks sequences online from the packing of its spec's
    # packing_from (cluster_packed: each sequence holds one cluster). Its order here is not trained
    # on; its diagnostics come from the ids training consumed (training_runs, consumed_metrics).
    spec = strategies.spec(strategy)
    seq_len = Store(layout).sequences.seq_len  # the base packing's: a repacking fills sequences as long
    result = run_strategy(spec.packing_from or strategy, docs, segments, seq_len, params, cfg.seed)
    outputs = [write_parquet(result.order, layout.ordering(strategy))]
    seg_path = layout.ordering_segments(strategy)
    if result.segments is not None:
        outputs.append(write_parquet(result.segments, seg_path))
    elif seg_path.exists():
        seg_path.unlink()
    written = Store(layout).ordering(strategy)
    order, m = written.order, int(written.segments["sequence_id"].max()) + 1
    ok = bool(order.size == m and np.array_equal(np.sort(order), np.arange(m)))
    check = dg.AssetCheckResult(check_name=PERMUTATION_CHECK.name, passed=ok,
                                metadata={"strategy": strategy, "positions": int(order.size), "sequences": m})
    return rec.finish(
        outputs,
        {"sequences": result.order.height},
        {"strategy": strategy, **params.__dict__, "seed": cfg.seed, "greedy_mode": result.greedy_mode},
        {"repacked": result.segments is not None, "greedy_mode": result.greedy_mode or "none"},
        check_results=[check],
    )


def load_ordering(layout, strategy: str) -> tuple[np.ndarray, pl.DataFrame]:
    """The order (sequence ids) and the segments table it refers to (``Store.ordering``)."""
    ordering = Store(layout).ordering(strategy)
    return ordering.order, ordering.segments


def seeded_ordering(layout, cfg, strategy: str, seed: int) -> tuple[np.ndarray, pl.DataFrame]:
    """The order training seed ``seed`` trains on: the materialized ordering (``cfg.seed``) for
    a seed-free strategy or seed == cfg.seed, else the strategy re-run with ``seed`` (same
    parameters), so seeds vary the shuffle / noise, not only the model init."""
    from pipeline.ordering.engine import seed_dependent

    params, spec = OrderParams.from_config(cfg), strategies.spec(strategy)
    if not spec.scheduled or seed == cfg.seed or not seed_dependent(strategy, params):
        return load_ordering(layout, strategy)
    if spec.reseed is not None:  # e.g. greedy_block_shuffle: the greedy beneath is seed-free, re-shuffle its blocks only
        order, segments = load_ordering(layout, strategy)
        if (reseeded := spec.reseed(order, params, cfg.seed, seed)) is not None:
            return reseeded, segments
    docs, segments = ordering_inputs(layout, params)
    result = run_strategy(strategy, docs, segments, Store(layout).sequences.seq_len, params, seed)
    return ordering_ids(result.order), (result.segments if result.segments is not None else segments)
