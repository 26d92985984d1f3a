"""What is fresh, stale (and why) or missing: Dagster's own staleness, asked headless.

``strata status`` and the Dagster UI read the same thing: the stale-status resolver the UI's
GraphQL layer uses, over the same instance and definitions, after the same corpus observation.
"""

from __future__ import annotations

from dataclasses import dataclass

import dagster as dg
from dagster._core.asset_graph_view.asset_graph_view import AssetGraphView, TemporalContext
from dagster._core.definitions.data_version import (
    DATA_VERSION_TAG,
    NULL_DATA_VERSION,
    CachingStaleStatusResolver,
    StaleCause,
    StaleCauseCategory,
    StaleStatus,
)
from dagster._core.definitions.events import AssetKeyPartitionKey
from dagster._time import get_current_datetime

from assets.common import SHARD_PARTITIONS
from pipeline.config import StrataConfig
from pipeline.data.corpus import corpus_fingerprint, corpus_units, shard_key, shard_versions

RAW = dg.AssetKey("raw_corpus")
RAW_SHARDS = dg.AssetKey("raw_shards")


@dataclass(frozen=True)
class Row:
    asset: str
    partition: str | None
    status: str  # fresh | stale | missing
    why: str  # root causes of staleness, "" otherwise


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


class TransitiveStaleResolver(CachingStaleStatusResolver):
    """Dagster's stale-status resolver, and one more cause: a materialized asset partition is stale
    when a partition it depends on is stale (``has a stale dependency``, whose root causes are that
    dependency's). Dagster's own resolver marks only the direct dependents of a changed version, so
    after a corpus edit or a parameter change only the first assets of the chain say "Unsynced" in
    the UI; ``strata status``, ``strata run`` and the ``up_to_date`` checks name all of them."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._transitive: dict[AssetKeyPartitionKey, list] = {}

    def _get_stale_causes(self, key: AssetKeyPartitionKey):  # Dagster's cached method, extended (not cached twice)
        if key not in self._transitive:
            causes = list(super()._get_stale_causes(key=key))
            asset = self.asset_graph.get(key.asset_key)
            materialized = not (asset.is_partitioned and not key.partition_key) and not asset.is_external
            if materialized and self._get_current_data_version(key=key) != NULL_DATA_VERSION:
                direct = {c.dependency for c in causes if c.dependency is not None}
                for dep in sorted(self._get_partition_dependencies(key=key)):
                    if dep not in direct and self._get_status(key=dep) == StaleStatus.STALE:
                        causes.append(StaleCause(key, StaleCauseCategory.DATA, "has a stale dependency", dep,
                                                 list(self._get_stale_causes(key=dep))))
            self._transitive[key] = causes
        return self._transitive[key]


def resolver(defs: dg.Definitions, instance: dg.DagsterInstance) -> CachingStaleStatusResolver:
    """The stale-status resolver over ``defs`` and ``instance``: Dagster's, transitive (:class:`TransitiveStaleResolver`)."""
    return resolver_for(defs.resolve_asset_graph(), instance)


def resolver_for(graph, instance: dg.DagsterInstance) -> CachingStaleStatusResolver:
    """:func:`resolver` over an asset graph (a sensor's or a check's repository's)."""
    view = AssetGraphView(temporal_context=TemporalContext(effective_dt=get_current_datetime(), last_event_id=None),
                          instance=instance, asset_graph=graph)
    return TransitiveStaleResolver(instance=instance, asset_graph=graph, loading_context=view)


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
    before = recorded.value
    now = cfg.subset(list(before))
    return [f"{k}: {before[k]!r} -> {now[k]!r}" for k in sorted(before) if before[k] != now[k]]


class OnDisk:
    """What the data root itself holds, beside what Dagster remembers: a ``DAGSTER_HOME`` shared with
    another data root (the README's ``export DAGSTER_HOME=...``) remembers that root's
    materializations, which must not make an empty root look fresh."""

    def __init__(self, root):
        from pathlib import Path

        import duckdb

        self.root = Path(root).resolve()
        self.rows: dict[tuple[str, str], dict] | None = None  # (asset, partition) -> outputs; None: no lineage at all
        db = self.root / "strata.duckdb"
        if not db.is_file():
            return
        try:
            with duckdb.connect(str(db), read_only=True) as con:
                if not con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'lineage'").fetchone()[0]:
                    return
                found = con.execute("SELECT asset, partition, outputs FROM lineage ORDER BY created_at, rowid").fetchall()
        except duckdb.Error:  # a run holds the write lock: Dagster's view alone
            self.rows = {}
            return
        import json

        self.rows = {(a, p or ""): json.loads(o) if o else {} for a, p, o in found}

    def problem(self, asset: str, partition: str | None) -> str:
        """Why ``asset[partition]``, which Dagster calls materialized, is not in this data root ("" when it is)."""
        if self.rows is None:
            return f"not in this data root ({self.root} has no lineage; the Dagster history remembers another root's run)"
        outputs = self.rows.get((asset, partition or ""))
        if outputs is None:
            return ""  # nothing recorded to check against: Dagster's word
        from pathlib import Path

        gone = [p for p in outputs if Path(p).is_relative_to(self.root) and not Path(p).exists()]
        return f"{len(gone)} output file(s) not on disk, e.g. {gone[0]}" if gone else ""


def statuses(defs: dg.Definitions, instance: dg.DagsterInstance, cfg: StrataConfig) -> list[Row]:
    """Every materializable asset and partition of the config, in graph order (the mixture stage only when
    enabled; ``claim_runs`` once materialized or with ``claims_full``). An asset Dagster calls fresh or
    stale whose files this data root does not hold (:class:`OnDisk`) is missing."""
    return graph_statuses(defs.resolve_asset_graph(), instance, cfg)


def graph_statuses(graph, instance: dg.DagsterInstance, cfg: StrataConfig) -> list[Row]:
    """:func:`statuses` over an asset graph (a sensor's or a check's repository's)."""
    res = resolver_for(graph, instance)
    disk = OnDisk(cfg.root)
    rows = []
    for key in graph.toposorted_asset_keys:
        node = graph.get(key)
        if not node.is_materializable:
            continue
        if node.group_name == "mixture" and not cfg.mixture.enabled:
            continue  # the TerRIFIC stage is not part of this config (mixture.enabled: false)
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
