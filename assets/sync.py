"""``up_to_date``: one non-blocking check per asset, saying whether it and each partition the config
names is up to date, and if not, which partitions are stale and why.

Dagster's UI shows "Unsynced" only on an unpartitioned asset with a direct cause (its own code
version, or a dependency's new data version): a partitioned asset's stale partitions show one at a
time (its *Partitions* tab), and the assets below a changed one stay green until it is
rematerialized. This check asks the resolver ``strata status`` uses (Dagster's, transitive:
:class:`assets.dagster_internals.TransitiveStaleResolver`) about every partition of the config, so after a
config edit and *Reload definitions* (or a corpus edit and *Observe sources*) every affected asset,
orderings and training runs included, shows a warning naming its stale partitions and the root
cause. The ``strata_config`` sensor reports it whenever the instance changed (:func:`report_changes`);
*Execute* on the check, or materializing its asset from the UI, evaluates it too.
"""


from collections.abc import Iterable

import dagster as dg

from assets.common import StrataSettings
from assets.dagster_internals import asset_graph
from assets.params import PARAMS
from pipeline.cli.staleness import check_summary
from pipeline.config import StrataConfig

CHECK = "up_to_date"
def evaluation(asset: str, rows) -> dg.AssetCheckEvaluation:
    """The check's result for ``asset`` from its :class:`assets.status.Row` s (metadata as text, which
    the UI does not plot)."""
    stale, label, description = check_summary(asset, rows)
    metadata = {"stale": f"{len(stale)} of {len(rows)}",
                "missing": str(sum(r.status == "missing" for r in rows)),
                "stale_partitions": dg.MetadataValue.md("\n".join(f"- `{p}`: {r.why}" for p, r in zip(label, stale)) or "none")}
    return dg.AssetCheckEvaluation(asset_key=dg.AssetKey(asset), check_name=CHECK, passed=not stale,
                                   severity=dg.AssetCheckSeverity.WARN, description=description, metadata=metadata)


def evaluations(graph, instance: dg.DagsterInstance, cfg: StrataConfig,
                assets: Iterable[str] | None = None) -> list[dg.AssetCheckEvaluation]:
    """The check's result for each asset of ``graph`` that has it (or of ``assets``)."""
    from assets.status import graph_statuses

    rows = graph_statuses(graph, instance, cfg)
    wanted = set(assets) if assets is not None else {k.asset_key.to_user_string() for k in graph.asset_check_keys if k.name == CHECK}
    by_asset: dict[str, list] = {}
    for r in rows:
        by_asset.setdefault(r.asset, []).append(r)
    return [evaluation(a, by_asset[a]) for a in sorted(wanted) if a in by_asset]


def _same(ev: dg.AssetCheckEvaluation, instance: dg.DagsterInstance) -> bool:
    """Whether ``ev`` says what the check's latest evaluation said (then it is not reported again)."""
    history = instance.event_log_storage.get_asset_check_execution_history(dg.AssetCheckKey(ev.asset_key, CHECK), limit=1)
    if not history or history[0].event is None or history[0].event.dagster_event is None:
        return False
    last = history[0].event.dagster_event.event_specific_data
    if not isinstance(last, dg.AssetCheckEvaluation):
        return False
    return last.passed == ev.passed and last.description == ev.description and last.metadata == ev.metadata


def report_changes(graph, instance: dg.DagsterInstance, cfg: StrataConfig) -> list[str]:
    """Report (as runless check evaluations) each asset's result that differs from its latest one; returns their assets."""
    out = []
    for ev in evaluations(graph, instance, cfg):
        if not _same(ev, instance):
            instance.report_runless_asset_event(ev)
            out.append(ev.asset_key.to_user_string())
    return out


def _check(asset: str) -> dg.AssetChecksDefinition:
    @dg.asset_check(asset=asset, name=CHECK, blocking=False,
                    description="This asset and each partition the config names are up to date: none stale (its code version, "
                                "its parameters or anything upstream changed); names the stale partitions and the root cause. "
                                "The strata_config sensor re-evaluates it when the instance changes.")
    def up_to_date(context: dg.AssetCheckExecutionContext, settings: StrataSettings) -> dg.AssetCheckResult:
        ev = evaluations(asset_graph(context), context.instance, settings.config(), [asset])[0]
        return dg.AssetCheckResult(passed=ev.passed, severity=ev.severity, description=ev.description, metadata=ev.metadata)

    return up_to_date


def sync_checks(assets: list) -> list[dg.AssetChecksDefinition]:
    """An ``up_to_date`` check for each asset of ``assets`` that ``PARAMS`` lists (Strata's own graph)."""
    names = sorted({spec.key.to_user_string() for a in assets if isinstance(a, dg.AssetsDefinition) and a.is_materializable
                    for spec in a.specs} & set(PARAMS))
    return [_check(n) for n in names]
