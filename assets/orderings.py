"""orderings: one partition per strategy, each a permutation of the packed sequences."""


import dagster as dg
import numpy as np
import polars as pl
from dagster_duckdb import DuckDBResource

from assets.params import PARAM_CLASSES, asset_config
from assets.common import STRATEGY_PARTITIONS, Recorder, StrataSettings  # noqa: F401 (STRATEGY_PARTITIONS re-exported)
from pipeline.storage.atomic import write_parquet
from pipeline.config import TRAINING_TIME_STRATEGIES
from pipeline.ordering import OrderParams, run_strategy
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


def order_params(cfg) -> OrderParams:
    """The ordering knobs of a configuration."""
    return OrderParams(
        objective=cfg.objective, families=tuple(cfg.families), bins=cfg.length_bins, lam=cfg.lam, noise=cfg.noise, block_size=cfg.batch_size,
        curriculum=cfg.curriculum or None, within=cfg.within, window=cfg.window,
        greedy_exact_max=cfg.greedy_exact_max, greedy_block=cfg.greedy_block,
    )


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
    params = order_params(cfg)
    docs, segments = ordering_inputs(layout, params)
    # odm picks sequences online during training (ODM) from per-cluster pools: it gets the
    # cluster_packed packing, whose sequences each hold one cluster. Its order here is not trained
    # on; its diagnostics come from the ids training consumed (training_runs, consumed_metrics).
    result = run_strategy("cluster_packed" if strategy == "odm" else strategy, docs, segments, cfg.seq_len, params, cfg.seed)
    outputs = [write_parquet(result.order, layout.ordering(strategy))]
    seg_path = layout.ordering_segments(strategy)
    if result.segments is not None:
        outputs.append(write_parquet(result.segments, seg_path))
    elif seg_path.exists():
        seg_path.unlink()
    order, segs = load_ordering(layout, strategy)
    m = int(segs["sequence_id"].max()) + 1
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
    """The order (sequence ids) and the segments table it refers to."""
    order = pl.read_parquet(layout.ordering(strategy)).sort("position")["sequence_id"].to_numpy()
    seg_path = layout.ordering_segments(strategy)
    segments = pl.read_parquet(seg_path if seg_path.exists() else layout.segments)
    return order, segments


def seeded_ordering(layout, cfg, strategy: str, seed: int) -> tuple[np.ndarray, pl.DataFrame]:
    """The order training seed ``seed`` trains on: the materialized ordering (``cfg.seed``) for
    a seed-free strategy or seed == cfg.seed, else the strategy re-run with ``seed`` (same
    parameters), so seeds vary the shuffle / noise, not only the model init."""
    from pipeline.ordering.strategies import reseed_block_shuffle, seed_dependent

    params = order_params(cfg)
    if strategy in TRAINING_TIME_STRATEGIES or seed == cfg.seed or not seed_dependent(strategy, params):
        return load_ordering(layout, strategy)
    if strategy == "greedy_block_shuffle":  # the greedy beneath is seed-free: re-shuffle its blocks only
        order, segments = load_ordering(layout, strategy)
        if (reseeded := reseed_block_shuffle(order, params, cfg.seed, seed)) is not None:
            return reseeded, segments
    docs, segments = ordering_inputs(layout, params)
    result = run_strategy(strategy, docs, segments, cfg.seq_len, params, seed)
    return ordering_ids(result.order), (result.segments if result.segments is not None else segments)
