"""What is fresh, stale (and why) or missing: Dagster's own staleness, asked headless.

``strata status`` and the Dagster UI read the same thing: the stale-status resolver the UI's
GraphQL layer uses, over the same instance and definitions, after the same corpus observation.
"""

from __future__ import annotations

import dagster as dg

from assets.common import SHARD_PARTITIONS
from assets.dagster_internals import DATA_VERSION_TAG, AssetKeyPartitionKey, CachingStaleStatusResolver, StaleStatus, resolver_for
from pipeline.cli.staleness import Row
from pipeline.config import StrataConfig
from pipeline.data.corpus import corpus_fingerprint, corpus_units, shard_key, shard_versions
from pipeline.overrides import changed_values
from pipeline.storage.lineage import OnDisk

RAW = dg.AssetKey("raw_corpus")
RAW_SHARDS = dg.AssetKey("raw_shards")


def observe_corpus(instance: dg.DagsterInstance, cfg: StrataConfig) -> str:
    """Record observations of ``raw_corpus`` and of each ``raw_shards`` partition (what "Observe
    sources" does in the UI) whose data version changed; returns the corpus's data version."""
    version = corpus_fingerprint(cfg.corpus)
    _observe(instance, RAW, None, version)
    for key, (_, fp) in shard_versions(cfg.corpus).items():
        _observe(instance, RAW_SHARDS, key, fp)
    return version


def _observe(instance: dg.DagsterInstance, asset: dg.AssetKey, partition: str | None, version: str) -> None:
    latest = instance.get_latest_data_version_record(asset, is_source=True, partition_key=partition)
    if latest is None or (latest.asset_observation and latest.asset_observation.tags.get(DATA_VERSION_TAG)) != version:
        instance.report_runless_asset_event(dg.AssetObservation(asset_key=asset, partition=partition, tags={DATA_VERSION_TAG: version}))


def resolver(defs: dg.Definitions, instance: dg.DagsterInstance) -> CachingStaleStatusResolver:
    """The stale-status resolver over ``defs`` and ``instance``: Dagster's, transitive
    (:class:`assets.dagster_internals.TransitiveStaleResolver`)."""
    return resolver_for(defs.resolve_asset_graph(), instance)


def _partitions(asset: str, partitions_def, cfg: StrataConfig) -> list[str | None]:
    if partitions_def is None:
        return [None]
    if isinstance(partitions_def, dg.MultiPartitionsDefinition):
        return [dg.MultiPartitionKey({"strategy": s, "seed": str(seed)}) for s in cfg.strategies for seed in cfg.seeds]
    if isinstance(partitions_def, dg.StaticPartitionsDefinition):  # the mixture stage's own partitions
        return list(partitions_def.get_partition_keys())
    if partitions_def.name == "corpus_shard":
        return [shard_key(u) for u in corpus_units(cfg.corpus)]
    return list(cfg.strategies)


def _label(key: AssetKeyPartitionKey) -> str:
    name = key.asset_key.to_user_string()
    if key.partition_key is None:
        return name
    pk = key.partition_key
    part = ", ".join(pk.keys_by_dimension[d] for d in ("strategy", "seed")) if isinstance(pk, dg.MultiPartitionKey) else pk
    return f"{name}[{part}]"


def changed_parameters(instance: dg.DagsterInstance, key: dg.AssetKey, partition: str | None, cfg: StrataConfig) -> list[str]:
    """Config keys whose value differs from the one the latest materialization recorded."""
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition] if partition is not None else None), limit=1
    ).records
    if not records or records[0].asset_materialization is None:
        return []
    recorded = records[0].asset_materialization.metadata.get("parameter_values")
    if recorded is None:
        return []
    return changed_values(recorded.value, cfg)


def statuses(defs: dg.Definitions, instance: dg.DagsterInstance, cfg: StrataConfig,
             corrupt: dict[str, tuple[str, str]] | None = None) -> list[Row]:
    """Every materializable asset and partition of the config, in graph order (the mixture and quality
    stages only when enabled; ``claim_runs`` once materialized or with ``claims_full``). An asset Dagster calls fresh or
    stale whose files this data root does not hold (:class:`OnDisk`) is missing; one with an output
    among the ``corrupt`` files (:func:`pipeline.storage.integrity.failing_digests`) is corrupt."""
    return graph_statuses(defs.resolve_asset_graph(), instance, cfg, corrupt)


def graph_statuses(graph, instance: dg.DagsterInstance, cfg: StrataConfig,
                   corrupt: dict[str, tuple[str, str]] | None = None) -> list[Row]:
    """:func:`statuses` over an asset graph (a sensor's or a check's repository's)."""
    res = resolver_for(graph, instance)
    disk = OnDisk(cfg.root, corrupt)
    rows = []
    for key in graph.toposorted_asset_keys:
        node = graph.get(key)
        if not node.is_materializable:
            continue
        if node.group_name == "mixture" and not cfg.mixture.enabled:
            continue  # the TerRIFIC stage is not part of this config (mixture.enabled: false)
        if node.group_name == "quality" and not cfg.quality.enabled:
            continue  # the quality stage is not part of this config (quality.enabled: false)
        for part in _partitions(key.to_user_string(), node.partitions_def, cfg):
            status = res.get_status(key, part)
            if key.to_user_string() == "claim_runs" and status == StaleStatus.MISSING and not cfg.claims.full:
                continue  # the claims' own runs: listed once trained (strata claims --full) or configured (claims.full)
            why = ""
            if status == StaleStatus.STALE:
                causes = res.get_stale_root_causes(key, part)
                why = "; ".join(sorted({f"{_label(c.key)}: {c.reason}" + (f" ({_label(c.dependency)})" if c.dependency else "")
                                        for c in causes}))
                changed = changed_parameters(instance, key, part, cfg)
                if changed:
                    why += f" — config changed: {', '.join(changed)}"
            elif status == StaleStatus.FRESH:
                changed = changed_parameters(instance, key, part, cfg)
                if changed:  # its code version matches the config, but a launchpad run overrode parameters
                    why = f"built with launchpad overrides: {', '.join(changed)}"
            label = status.value.lower()
            if status != StaleStatus.MISSING and (gone := disk.problem(key.to_user_string(), None if part is None else str(part))):
                label, why = "missing", gone
            elif status != StaleStatus.MISSING and (bad := disk.corrupt_outputs(key.to_user_string(), None if part is None else str(part))):
                label, why = "corrupt", bad
            rows.append(Row(key.to_user_string(), None if part is None else str(part), label, why))
    return rows


def shards_to_run(defs: dg.Definitions, instance: dg.DagsterInstance, cfg: StrataConfig, assets: list[str]) -> list[str]:
    """The corpus-shard partitions in which any of ``assets`` (per-shard assets) is missing or stale
    (a new or edited shard, changed split options, a new tokenizer or k-means model), after
    observing the corpus: what ``strata run`` materializes, one run each."""
    observe_corpus(instance, cfg)
    res = resolver(defs, instance)
    keys = [dg.AssetKey(a) for a in assets]
    return [p for p in _partitions("corpus_shards", SHARD_PARTITIONS, cfg) if any(res.get_status(k, p) != StaleStatus.FRESH for k in keys)]
