"""Shared pieces of the asset layer: the settings resource, partitions, lineage recording."""

from __future__ import annotations

import time
from typing import Any, Callable

import dagster as dg
from dagster_duckdb import DuckDBResource

from assets.dagster_internals import BaseAssetGraph, asset_graph
from pipeline.config import StrataConfig, resolve_config
from pipeline.config_source import RECORDED_CONFIG
from pipeline.stage import CheckFact, Markdown, StageResult
from pipeline.storage.layout import Layout, table_columns
from pipeline.storage.warehouse import record_lineage
from pipeline.threads import process_cpu_s


class StrataSettings(dg.ConfigurableResource):
    """Run configuration for every asset: a config file and/or a data root (see README)."""

    config_file: str = ""
    data_root: str = ""
    # JSON {asset: code version} of the definitions the process that launched this run loaded
    # (a Dagster code server), when they came from an older config file: see assets/loaded.py
    loaded_versions: str = ""

    def config(self) -> StrataConfig:
        return resolve_config(self.config_file or None, self.data_root or None)

    def layout(self) -> Layout:
        root = self.config().root
        root.mkdir(parents=True, exist_ok=True)
        return Layout(root)


# Strategies and training seeds are dynamic partitions that follow the config: the runner, the
# `strata_config` sensor (Dagster UI) and `strata status` sync them (sync_partitions), so adding a
# strategy to the config file needs no restart.
STRATEGY_PARTITIONS = dg.DynamicPartitionsDefinition(name="strategy")
# Corpus shards (one partition per shard file, or per group of small files with corpus.group_bytes,
# keyed by pipeline.data.corpus.shard_key) are discovered from corpus.path the same way.
SHARD_PARTITIONS = dg.DynamicPartitionsDefinition(name="corpus_shard")
SEED_PARTITIONS = dg.DynamicPartitionsDefinition(name="seed")
RUN_PARTITIONS = dg.MultiPartitionsDefinition({"strategy": STRATEGY_PARTITIONS, "seed": SEED_PARTITIONS})
# Training and evaluation steps hold a slot of this Dagster pool: with the default limit of 1 a
# backfill of every strategy x seed runs them one at a time on the machine (config: train_concurrency).
TRAIN_POOL = "strata_train"


def config_partitions(cfg: StrataConfig) -> dict[str, list[str]]:
    """The keys of the dynamic partitions the config names, in its order: strategies and seeds."""
    return {"strategy": list(cfg.strategies), "seed": [str(s) for s in cfg.seeds]}


def sync_partitions(instance: dg.DagsterInstance, cfg: StrataConfig, graph: BaseAssetGraph | None = None) -> dict[str, list[str]]:
    """Make the instance's strategy/seed/corpus-shard partitions equal the config's (shards as
    discovered under ``corpus.path``) and set the training pool's limit; returns what was added and removed.
    With the definitions' asset ``graph``, also under ``"hidden"`` the materialized partitions a
    removal hid, each noted on its asset in the UI (:func:`note_hidden`)."""
    from pipeline.data.corpus import corpus_units, shard_key
    from pipeline.errors import StrataInputError

    changes: dict[str, list[str]] = {"added": [], "removed": []}
    wanted_by = config_partitions(cfg)
    try:
        wanted_by["corpus_shard"] = [shard_key(u) for u in corpus_units(cfg.corpus)]
    except StrataInputError:  # no corpus there (yet): shard partitions stay as they are; `corpus` names the problem
        pass
    for name, wanted in wanted_by.items():
        have = instance.get_dynamic_partitions(name)
        new = [k for k in wanted if k not in have]
        if new:
            instance.add_dynamic_partitions(name, new)
        gone = [k for k in have if k not in wanted]
        if gone and graph is not None:
            hidden = materialized_partitions(instance, graph, name, gone)
            if hidden:
                changes["hidden"] = changes.get("hidden", []) + note_hidden(instance, name, gone, hidden, cfg)
        for k in gone:
            instance.delete_dynamic_partition(name, k)
            changes["removed"].append(f"{name}={k}")
        changes["added"] += [f"{name}={k}" for k in new]
    storage = instance.event_log_storage
    if storage.supports_global_concurrency_limits:
        if storage.get_concurrency_info(TRAIN_POOL).slot_count != cfg.train_concurrency:
            storage.set_concurrency_slots(TRAIN_POOL, cfg.train_concurrency)
    return changes


def _hidden_by(pdef: dg.PartitionsDefinition, dimension: str, keys: set[str], partition: str,
               current: dict[str, list[str]]) -> bool:
    """Whether removing the ``dimension`` partitions ``keys`` hides ``partition`` (a stored key of an
    asset partitioned by ``pdef``): it is on one of them, and on current partitions of every other dimension."""
    if isinstance(pdef, dg.DynamicPartitionsDefinition):
        return pdef.name == dimension and partition in keys
    if not isinstance(pdef, dg.MultiPartitionsDefinition):
        return False
    by_dim = pdef.get_partition_key_from_str(partition).keys_by_dimension
    on = False
    for d in pdef.partitions_defs:
        if not isinstance(d.partitions_def, dg.DynamicPartitionsDefinition):
            continue
        if d.partitions_def.name == dimension:
            on = on or by_dim[d.name] in keys
        elif by_dim[d.name] not in current[d.partitions_def.name]:
            return False
    return on


def materialized_partitions(instance: dg.DagsterInstance, graph: BaseAssetGraph, dimension: str,
                            keys: list[str]) -> dict[dg.AssetKey, list[str]]:
    """Per asset of ``graph``, its materialized partitions that removing the ``dimension`` partitions ``keys`` would hide."""
    out: dict[dg.AssetKey, list[str]] = {}
    current = {n: instance.get_dynamic_partitions(n) for n in ("strategy", "seed", "corpus_shard")}
    for key in sorted(graph.materializable_asset_keys):
        pdef = graph.get(key).partitions_def
        if pdef is None:
            continue
        parts = sorted(p for p in instance.get_materialized_partitions(key) if _hidden_by(pdef, dimension, set(keys), p, current))
        if parts:
            out[key] = parts
    return out


def note_hidden(instance: dg.DagsterInstance, dimension: str, keys: list[str], hidden: dict[dg.AssetKey, list[str]],
                cfg: StrataConfig) -> list[str]:
    """Say in the UI that removing the ``dimension`` partitions ``keys`` hides materializations: an
    observation on each asset (its Events show it, with the partitions and why), and a log warning.
    The materializations stay in the event log and show again when the partition is added back."""
    import logging

    why = (f"{dimension} partitions {keys} are not in the configuration (data root {cfg.root}); their materializations "
           "stay in the event log and show again when the configuration lists them (STRATA_CONFIG, or the data root's "
           f"{RECORDED_CONFIG})")
    lines = []
    for key, parts in hidden.items():
        name = key.to_user_string()
        instance.report_runless_asset_event(dg.AssetObservation(
            asset_key=key, description=f"partitions removed by the config: {len(parts)} materialized partition(s) hidden",
            metadata={"strata/hidden_partitions": dg.MetadataValue.md("\n".join(f"- `{p}`" for p in parts)),
                      "strata/why": why}))
        lines += [f"{name}[{p}]" for p in parts]
    logging.getLogger("strata").warning("hid %d materialized partition(s): %s; %s", len(lines), ", ".join(lines), why)
    return lines


def run_key(context: dg.AssetExecutionContext) -> tuple[str, int]:
    """(strategy, seed) of a training/evaluation partition."""
    dims = context.partition_key.keys_by_dimension
    return dims["strategy"], int(dims["seed"])


def upstream_partition(upstream: dg.PartitionsDefinition | None, own: dg.PartitionsDefinition | None, key: str | None):
    """The partition of an upstream asset (partitioned by ``upstream``) that the materialization of
    partition ``key`` of an asset partitioned by ``own`` read: None for an unpartitioned upstream,
    the same key where both are partitioned alike, the key's dimension where ``upstream`` is one
    dimension of ``own`` (a training run reads its strategy's ordering), else ``"*"`` (every partition)."""
    if upstream is None:
        return None
    if upstream == own:
        return key
    if isinstance(own, dg.MultiPartitionsDefinition) and isinstance(key, dg.MultiPartitionKey):
        for dim in own.partitions_defs:
            if dim.partitions_def == upstream:
                return key.keys_by_dimension[dim.name]
    return "*"


def declared_inputs(graph: BaseAssetGraph, key: dg.AssetKey, partition: str | None,
                    ran: Callable[[dg.AssetKey], bool] = lambda _: True) -> dict[str, str | None]:
    """The lineage inputs of ``key[partition]``, from its definition's one dependency list (``deps``):
    each upstream asset that writes lineage rows (materializable: not the corpus sources, whose
    versions the shards' fingerprints carry) with the partition :func:`upstream_partition` names;
    an optional stage's asset (the quality group) only once it ``ran``: switched off, it is no input."""
    node = graph.get(key)
    return {p.to_user_string(): upstream_partition(graph.get(p).partitions_def, node.partitions_def, partition)
            for p in sorted(node.parent_keys) if graph.get(p).is_materializable and (graph.get(p).group_name != "quality" or ran(p))}


class Recorder:
    """Times a materialization and writes its lineage row (see pipeline/storage/warehouse.py).

    The metadata shows the materialization's wall seconds (``wall_s``, from the asset function's
    start to its result) and the CPU seconds this process used meanwhile on every thread
    (``cpu_s``; work in child processes or on Ray workers is not in it), so ``cpu_s / wall_s`` is
    how many cores the asset's own work kept busy, Dagster's run around it left out.

    ``deps`` maps each upstream asset to the partition whose data version is recorded: ``None``
    for an unpartitioned asset, a partition key, a list of them, or ``"*"`` for every partition.
    They are the asset definition's own ``deps`` (:func:`declared_inputs`); a stage result's
    ``deps`` replace them (the shards a gather read, the ordering an order was derived from).
    """

    def __init__(self, context: dg.AssetExecutionContext, duckdb: DuckDBResource):
        self.context, self.duckdb = context, duckdb
        self.t0, self.c0 = time.perf_counter(), process_cpu_s()
        self.partition = context.partition_key if context.has_partition_key else None
        self.deps = declared_inputs(asset_graph(context, whole=True), context.asset_key, self.partition,
                                    lambda k: context.instance.get_latest_materialization_event(k) is not None)

    def finish_stage(self, result: StageResult, metadata: dict[str, Any] | None = None) -> dg.MaterializeResult:
        """The materialization of a stage function's result (``pipeline/stage.py``): its lineage row
        (outputs, rows, parameters; its ``deps`` replace the declared ones) and its Dagster result
        (facts plus ``metadata``, checks, data version). A skipped result records nothing: its metadata says why."""
        if result.skipped is not None:
            return dg.MaterializeResult(metadata={"skipped": result.skipped})
        self.deps.update(result.deps)
        outputs, rows, key = result.outputs, result.rows, self.context.asset_key
        with self.duckdb.get_connection() as con:
            version = record_lineage(con, asset=key.to_user_string(), partition=self.partition, run_id=self.context.run.run_id,
                                     code_version=self.context.assets_def.code_versions_by_key.get(key) or "", deps=self.deps,
                                     outputs=outputs, digests=result.digests or None, row_counts=rows, parameters=result.parameters,
                                     started=self.t0)
        meta = {f"rows/{k}": v for k, v in rows.items()}
        if outputs:  # none: a shard partition with no training documents
            meta["path"] = dg.MetadataValue.path(str(outputs[0]))
        if (columns := table_columns(outputs)) is not None:  # the asset's table, shown in its *Columns*
            meta["dagster/column_schema"] = dg.TableSchema(columns=[dg.TableColumn(name=n, type=t) for n, t in columns])
        meta["wall_s"] = round(time.perf_counter() - self.t0, 2)
        meta["cpu_s"] = round(process_cpu_s() - self.c0, 2)
        meta.update({**shown(result.facts), **(metadata or {})})
        return dg.MaterializeResult(metadata=meta, data_version=dg.DataVersion(version),
                                    check_results=[check_result(c) for c in result.checks] or None)


def check_result(c: CheckFact) -> dg.AssetCheckResult:
    """A stage's check result as Dagster's: a ``warn`` check never blocks."""
    return dg.AssetCheckResult(check_name=c.name, passed=c.passed, metadata=shown(c.metadata), description=c.description,
                               severity=dg.AssetCheckSeverity.WARN if c.warn else dg.AssetCheckSeverity.ERROR)


def shown(facts: dict[str, Any]) -> dict[str, Any]:
    """Facts as Dagster metadata: markdown as markdown, dicts and lists as JSON, the rest as they are."""
    return {k: dg.MetadataValue.md(v) if isinstance(v, Markdown) else dg.MetadataValue.json(v) if isinstance(v, (dict, list)) else v
            for k, v in facts.items()}
