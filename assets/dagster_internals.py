"""Every piece of Dagster's private API Strata uses, in one place (tests/test_imports.py: no other
module imports ``dagster._`` or ``dagster_shared``).

Dagster is pinned (pyproject.toml: ``dagster==1.13.27``) because of what is here; a Dagster upgrade
starts by checking this module. What is private, and why Strata needs it:

- the stale-status resolver (``CachingStaleStatusResolver``, ``StaleStatus``, ``StaleCause``, the
  asset graph view it reads through): what the UI's GraphQL layer asks to say "Unsynced", asked
  headless by ``strata status``, ``strata run`` and the ``up_to_date`` checks. Dagster has no
  public call for it. :class:`TransitiveStaleResolver` extends it by overriding its private
  ``_get_stale_causes`` (and reads ``_get_status``, ``_get_current_data_version``,
  ``_get_partition_dependencies``);
- ``DATA_VERSION_TAG`` / ``NULL_DATA_VERSION``: the tag a source observation carries its data
  version in, and the version of a never-materialized asset (Dagster writes and reads them; no
  public name);
- ``BaseAssetGraph`` (only a type): the asset graph a sensor, a check or :func:`asset_graph`
  hands over;
- ``CheckError`` (``dagster_shared``): what ``context.repository_def`` raises in a run started by
  ``dg.materialize``, which has no repository;
- :func:`asset_graph`: the asset graph of the running job, through the job's asset layer, and the
  whole graph a job's selection was scoped from (``JobScopedAssetGraph.source_asset_graph``): an
  asset's upstream assets as defined, for its lineage (``assets/common.py: Recorder``).
"""

from __future__ import annotations

import dagster as dg
from dagster._core.asset_graph_view.asset_graph_view import AssetGraphView, TemporalContext
from dagster._core.definitions.assets.graph.base_asset_graph import BaseAssetGraph
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
from dagster_shared.check import CheckError

__all__ = ["DATA_VERSION_TAG", "AssetKeyPartitionKey", "BaseAssetGraph", "CachingStaleStatusResolver", "CheckError", "StaleStatus",
           "TransitiveStaleResolver", "asset_graph", "resolver_for"]


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


def resolver_for(graph: BaseAssetGraph, instance: dg.DagsterInstance) -> CachingStaleStatusResolver:
    """The stale-status resolver over an asset graph and ``instance``: Dagster's, transitive (:class:`TransitiveStaleResolver`)."""
    view = AssetGraphView(temporal_context=TemporalContext(effective_dt=get_current_datetime(), last_event_id=None),
                          instance=instance, asset_graph=graph)
    return TransitiveStaleResolver(instance=instance, asset_graph=graph, loading_context=view)


def asset_graph(context: dg.AssetExecutionContext | dg.AssetCheckExecutionContext, whole: bool = False) -> BaseAssetGraph:
    """The asset graph of the run ``context`` belongs to: its repository's (a run launched from the
    UI), else its job's (``dg.materialize`` sets no repository). A job's graph is scoped to the
    assets the run selected (the others are external stubs there); with ``whole``, the graph of
    every asset it was given, which the job's was made from (``source_asset_graph``)."""
    try:
        return context.repository_def.asset_graph
    except CheckError:
        graph = context.job_def.asset_layer.asset_graph
        return getattr(graph, "source_asset_graph", graph) if whole else graph
