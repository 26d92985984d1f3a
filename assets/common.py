"""Shared pieces of the asset layer: the settings resource, partitions, lineage recording."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any

import dagster as dg
from dagster_duckdb import DuckDBResource

from pipeline.config import StrataConfig, resolve_config
from pipeline.storage.atomic import file_sha256
from pipeline.storage.layout import Layout
from pipeline.storage.warehouse import data_versions, latest_data_version, write_lineage


def env_config() -> StrataConfig:
    """The configuration named by ``STRATA_CONFIG`` (a YAML/JSON file), else the defaults; the data
    root by precedence (see :func:`pipeline.config.resolve_config`)."""
    return resolve_config(os.environ.get("STRATA_CONFIG") or None)


class StrataSettings(dg.ConfigurableResource):
    """Run configuration for every asset: a config file and/or a data root (see README)."""

    config_file: str = ""
    data_root: str = ""

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
# Corpus shards (one partition per shard file, keyed by pipeline.data.corpus.shard_key) are
# discovered from corpus.path the same way.
SHARD_PARTITIONS = dg.DynamicPartitionsDefinition(name="corpus_shard")
SEED_PARTITIONS = dg.DynamicPartitionsDefinition(name="seed")
RUN_PARTITIONS = dg.MultiPartitionsDefinition({"strategy": STRATEGY_PARTITIONS, "seed": SEED_PARTITIONS})
# Training and evaluation steps hold a slot of this Dagster pool: with the default limit of 1 a
# backfill of every strategy x seed runs them one at a time on the machine (config: train_concurrency).
TRAIN_POOL = "strata_train"


def config_partitions(cfg: StrataConfig) -> dict[str, list[str]]:
    """The keys of the dynamic partitions the config names, in its order: strategies and seeds."""
    return {"strategy": list(cfg.strategies), "seed": [str(s) for s in cfg.seeds]}


def sync_partitions(instance: dg.DagsterInstance, cfg: StrataConfig) -> dict[str, list[str]]:
    """Make the instance's strategy/seed/corpus-shard partitions equal the config's (shards as
    discovered under ``corpus.path``) and set the training pool's limit; returns what was added and removed."""
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
        for k in have:
            if k not in wanted:
                instance.delete_dynamic_partition(name, k)
                changes["removed"].append(f"{name}={k}")
        changes["added"] += [f"{name}={k}" for k in new]
    storage = instance.event_log_storage
    if storage.supports_global_concurrency_limits:
        if storage.get_concurrency_info(TRAIN_POOL).slot_count != cfg.train_concurrency:
            storage.set_concurrency_slots(TRAIN_POOL, cfg.train_concurrency)
    return changes


def run_key(context: dg.AssetExecutionContext) -> tuple[str, int]:
    """(strategy, seed) of a training/evaluation partition."""
    dims = context.partition_key.keys_by_dimension
    return dims["strategy"], int(dims["seed"])


def version_of(paths: list[Path]) -> str:
    """Data version: a hash over the content hashes of an asset's output files."""
    h = hashlib.sha256()
    for p in paths:
        h.update(file_sha256(p).encode())
    return h.hexdigest()[:16]


class Recorder:
    """Times a materialization and writes its lineage row (see pipeline/storage/warehouse.py).

    ``deps`` maps each upstream asset to the partition whose data version is recorded: ``None``
    for an unpartitioned asset, a partition key, a list of them, or ``"*"`` for every partition.
    """

    def __init__(self, context: dg.AssetExecutionContext, duckdb: DuckDBResource, deps: dict[str, str | list[str] | None]):
        self.context, self.duckdb, self.deps = context, duckdb, deps
        self.t0 = time.perf_counter()
        self.partition = context.partition_key if context.has_partition_key else None

    def finish(
        self,
        outputs: list[Path],
        rows: dict[str, int],
        params: dict[str, Any],
        metadata: dict[str, Any] | None = None,
        check_results: list[dg.AssetCheckResult] | None = None,
    ) -> dg.MaterializeResult:
        asset = self.context.assets_def.key.to_user_string()
        version = version_of(outputs)
        with self.duckdb.get_connection() as con:
            inputs: dict[str, str] = {}
            for dep, part in self.deps.items():
                if part == "*":
                    inputs.update({f"{dep}[{p}]": v for p, v in data_versions(con, dep).items()})
                elif isinstance(part, list):
                    inputs.update({f"{dep}[{p}]": latest_data_version(con, dep, p) for p in part})
                else:
                    inputs[dep if part is None else f"{dep}[{part}]"] = latest_data_version(con, dep, part)
            write_lineage(
                con,
                asset=asset,
                partition=self.partition,
                run_id=self.context.run.run_id,
                code_version=self.context.assets_def.code_versions_by_key.get(self.context.assets_def.key) or "",
                data_version=version,
                input_versions=inputs,
                outputs={str(p): file_sha256(p) for p in outputs},
                row_counts=rows,
                parameters=params,
                wall_s=time.perf_counter() - self.t0,
            )
        meta = {f"rows/{k}": v for k, v in rows.items()}
        if outputs:  # none: a shard partition with no training documents
            meta["path"] = dg.MetadataValue.path(str(outputs[0]))
        meta["wall_s"] = round(time.perf_counter() - self.t0, 2)
        meta.update(metadata or {})
        return dg.MaterializeResult(metadata=meta, data_version=dg.DataVersion(version), check_results=check_results or None)
