"""Shared pieces of the asset layer: the settings resource, partitions, lineage recording."""

from __future__ import annotations

import hashlib
import os
import resource
import time
from pathlib import Path
from typing import Any, Mapping

import dagster as dg
from dagster._core.definitions.assets.graph.base_asset_graph import BaseAssetGraph
from dagster_duckdb import DuckDBResource

from pipeline.config import StrataConfig, resolve_config
from pipeline.stage import Markdown, StageResult
from pipeline.storage.atomic import file_sha256, write_text
from pipeline.storage.layout import Layout
from pipeline.storage.warehouse import data_versions, latest_data_version, write_lineage

# Every `strata run` / `strata demo` writes the configuration it ran with here, under the data root,
# so the Dagster UI and `strata status` started without a config file show what the root was built with.
RECORDED_CONFIG = "strata_config.yaml"


def record_config(cfg: StrataConfig) -> Path:
    """Write ``<data root>/strata_config.yaml`` atomically: every key of ``cfg``, defaults included,
    but ``data_root``, which is the folder the file lies in (so a root's bytes do not depend on where
    it lies); unchanged bytes are not rewritten. Returns its path."""
    import yaml

    data = cfg.model_dump(mode="json", exclude={"data_root"})
    text = yaml.safe_dump(data, sort_keys=True)
    path = cfg.root / RECORDED_CONFIG
    if not (path.is_file() and path.read_text(encoding="utf-8") == text):
        write_text(text, path)
    return path


def default_data_root(environ: Mapping[str, str] | None = None) -> Path:
    """The data root of a process given no config file and no ``--data-root``: ``STRATA_HOME``, else
    the parent of ``DAGSTER_HOME`` when that parent holds a recorded config (the README's
    ``DAGSTER_HOME=<data root>/dagster``), else ``./.strata``."""
    environ = os.environ if environ is None else environ
    if environ.get("STRATA_HOME"):
        return Path(environ["STRATA_HOME"]).expanduser().resolve()
    if environ.get("DAGSTER_HOME"):
        parent = Path(environ["DAGSTER_HOME"]).expanduser().resolve().parent
        if (parent / RECORDED_CONFIG).is_file():
            return parent
    return Path(".strata").resolve()


def config_source(data_root: str | os.PathLike | None = None,
                  environ: Mapping[str, str] | None = None) -> tuple[str | None, str | None]:
    """(config file, data root) for a process given no ``--config``: ``STRATA_CONFIG`` when set; else
    the data root's recorded config (``data_root``, else :func:`default_data_root`) when it has one,
    with that data root; else no file (the defaults)."""
    environ = os.environ if environ is None else environ
    if environ.get("STRATA_CONFIG"):
        return environ["STRATA_CONFIG"], (str(data_root) if data_root else None)
    root = Path(data_root).expanduser().resolve() if data_root else default_data_root(environ)
    recorded = root / RECORDED_CONFIG
    if recorded.is_file():
        return str(recorded), str(root)
    return None, (str(data_root) if data_root else None)


def env_config() -> StrataConfig:
    """The configuration named by ``STRATA_CONFIG`` (a YAML/JSON file), else the data root's recorded
    config (:func:`config_source`), else the defaults; the data root by precedence (see
    :func:`pipeline.config.resolve_config`)."""
    return resolve_config(*config_source())


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


def version_of(paths: list[Path], digests: dict[str, str] | None = None) -> str:
    """Data version: a hash over the content hashes of an asset's output files (``digests``: the
    SHA-256 of outputs that are not local files, objects taken while they were written)."""
    h = hashlib.sha256()
    for p in paths:
        h.update(((digests or {}).get(str(p)) or file_sha256(p)).encode())
    return h.hexdigest()[:16]


def column_schema(outputs: list[Path]) -> dg.TableSchema | None:
    """The columns of the first Parquet table among ``outputs`` (the asset's table; its DuckDB rows
    have the same columns), as Dagster shows them in the asset's *Columns*; None when there is none."""
    import pyarrow.parquet as pq

    for p in outputs:
        if str(p).endswith(".parquet") and Path(p).is_file():
            schema = pq.read_schema(p)
            return dg.TableSchema(columns=[dg.TableColumn(name=f.name, type=str(f.type)) for f in schema])
    return None


def process_cpu_s() -> float:
    """CPU seconds this process has used so far, every thread (user + system)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class Recorder:
    """Times a materialization and writes its lineage row (see pipeline/storage/warehouse.py).

    The metadata shows the materialization's wall seconds (``wall_s``, from the asset function's
    start to its result) and the CPU seconds this process used meanwhile on every thread
    (``cpu_s``; work in child processes or on Ray workers is not in it), so ``cpu_s / wall_s`` is
    how many cores the asset's own work kept busy, Dagster's run around it left out.

    ``deps`` maps each upstream asset to the partition whose data version is recorded: ``None``
    for an unpartitioned asset, a partition key, a list of them, or ``"*"`` for every partition.
    """

    def __init__(self, context: dg.AssetExecutionContext, duckdb: DuckDBResource, deps: dict[str, str | list[str] | None]):
        self.context, self.duckdb, self.deps = context, duckdb, deps
        self.t0, self.c0 = time.perf_counter(), process_cpu_s()
        self.partition = context.partition_key if context.has_partition_key else None

    def finish(
        self,
        outputs: list[Path],
        rows: dict[str, int],
        params: dict[str, Any],
        metadata: dict[str, Any] | None = None,
        check_results: list[dg.AssetCheckResult] | None = None,
        digests: dict[str, str] | None = None,
    ) -> dg.MaterializeResult:
        asset = self.context.assets_def.key.to_user_string()
        version = version_of(outputs, digests)
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
                outputs={str(p): (digests or {}).get(str(p)) or file_sha256(p) for p in outputs},
                row_counts=rows,
                parameters=params,
                wall_s=time.perf_counter() - self.t0,
            )
        meta = {f"rows/{k}": v for k, v in rows.items()}
        if outputs:  # none: a shard partition with no training documents
            meta["path"] = dg.MetadataValue.path(str(outputs[0]))
        schema = column_schema(outputs)
        if schema is not None:
            meta["dagster/column_schema"] = schema
        meta["wall_s"] = round(time.perf_counter() - self.t0, 2)
        meta["cpu_s"] = round(process_cpu_s() - self.c0, 2)
        meta.update(metadata or {})
        return dg.MaterializeResult(metadata=meta, data_version=dg.DataVersion(version), check_results=check_results or None)

    def finish_stage(self, result: StageResult, metadata: dict[str, Any] | None = None) -> dg.MaterializeResult:
        """:meth:`finish` with a stage function's result (``pipeline/stage.py``): its outputs, rows,
        parameters, facts (plus ``metadata``), checks and digests; its ``deps`` replace the declared ones."""
        self.deps.update(result.deps)
        checks = [dg.AssetCheckResult(check_name=c.name, passed=c.passed, metadata=shown(c.metadata), description=c.description,
                                      severity=dg.AssetCheckSeverity.WARN if c.warn else dg.AssetCheckSeverity.ERROR)
                  for c in result.checks]
        return self.finish(result.outputs, result.rows, result.parameters, {**shown(result.facts), **(metadata or {})}, checks,
                           digests=result.digests or None)


def shown(facts: dict[str, Any]) -> dict[str, Any]:
    """Facts as Dagster metadata: markdown as markdown, dicts and lists as JSON, the rest as they are."""
    return {k: dg.MetadataValue.md(v) if isinstance(v, Markdown) else dg.MetadataValue.json(v) if isinstance(v, (dict, list)) else v
            for k, v in facts.items()}
