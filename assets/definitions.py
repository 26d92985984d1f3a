"""Strata's Dagster definitions: the asset graph over ``pipeline/`` (loaded by workspace.yaml).

``defs`` follows ``STRATA_CONFIG`` (a YAML/JSON file), else the data root's recorded config
(:func:`pipeline.config_source.config_source`), and the data-root precedence of
:func:`pipeline.config.resolve_config`; ``build_definitions`` builds them for any config.
"""

import hashlib
import json

import dagster as dg
from dagster_duckdb import DuckDBResource

from pipeline.offline import set_offline
from pipeline.threads import set_thread_policy

set_offline()
set_thread_policy()  # before any asset imports torch

from assets import (  # noqa: E402
    checks,
    claims,
    clean,
    corpus,
    diagnostics,
    embeddings,
    evaluations,
    exports,
    loaded,
    mixture,
    orderings,
    quality,
    sequences,
    sync,
    tokens,
    training,
)
from assets.ablate_job import ablate as ablate_job  # noqa: E402
from assets.common import StrataSettings, sync_partitions  # noqa: E402
from assets.params import PARAMS, with_config_versions  # noqa: E402
from pipeline.config import resolve_config  # noqa: E402
from pipeline.config_source import config_source  # noqa: E402
from pipeline.overrides import params_hash  # noqa: E402

_MODULES = [corpus, tokens, embeddings, clean, quality, sequences, orderings, exports, diagnostics, training, evaluations, claims, checks,
            mixture]


def config_sensor(config_file: str | None, data_root: str | None, built_from) -> dg.SensorDefinition:
    """Keeps the strategy/seed partitions and the training pool equal to the config file (read at
    every tick: adding a strategy needs no restart), and says when the code versions are outdated."""

    @dg.sensor(name="strata_config", minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING,
               description="Syncs partitions and the training pool with the config file; warns when definitions need a reload.")
    def strata_config(context: dg.SensorEvaluationContext) -> dg.SkipReason:
        cfg = resolve_config(config_file, data_root)
        changes = sync_partitions(context.instance, cfg, context.repository_def.asset_graph if context.repository_def else None)
        changed = [a for a in PARAMS if PARAMS[a] and params_hash(PARAMS[a], cfg) != params_hash(PARAMS[a], built_from)]
        note = f"partitions: {changes}" if changes["added"] or changes["removed"] else "partitions in sync"
        if changes.get("hidden"):
            context.log.warning(f"removing partitions hid materializations of {changes['hidden']}")
            note += "; materializations hidden with them are listed in each asset's Events (observation)"
        if changed:
            note += f"; config changed for {changed}: reload the definitions (Deployment > Reload) to update code versions"
        graph = context.repository_def.asset_graph if context.repository_def else None
        if graph is not None and any(k.name == sync.CHECK for k in graph.asset_check_keys):
            # the up_to_date checks, re-evaluated when anything happened since the last tick (assets/sync.py)
            # (and when the definitions or the partitions changed: a reload, a strategy added)
            versions = hashlib.sha256(" ".join(sorted(f"{k.to_user_string()}={graph.get(k).code_version}"
                                                      for k in graph.materializable_asset_keys)).encode()).hexdigest()[:10]
            state = f"{versions}:{sorted(changes['added'])}:{sorted(changes['removed'])}"
            if f"{context.instance.event_log_storage.get_maximum_record_id()}:{state}" != context.cursor:
                reported = sync.report_changes(graph, context.instance, cfg)
                if reported:
                    note += f"; up_to_date changed for {reported}"
                context.update_cursor(f"{context.instance.event_log_storage.get_maximum_record_id()}:{versions}:[]:[]")
        return dg.SkipReason(note)

    return strata_config


def build_definitions(config_file: str | None = None, data_root: str | None = None,
                      loaded_versions: dict[str, str] | None = None, sync_checks: bool = False) -> dg.Definitions:
    """The asset graph configured by ``config_file`` (and ``data_root``, which wins over it): code
    versions cover each asset's parameters under this config (assets/params.py). With
    ``loaded_versions`` (the code versions the process that launched the run loaded,
    :mod:`assets.loaded`), an asset whose version differs from it stops with the fix. With
    ``sync_checks`` (the UI's definitions), each asset gets the ``up_to_date`` check (assets/sync.py);
    headless runs leave it out, as ``strata status`` says the same."""
    cfg = resolve_config(config_file, data_root)
    assets = with_config_versions(dg.load_assets_from_modules(_MODULES), cfg)
    if cfg.automation == "eager":
        eager = dg.AutomationCondition.eager()
        assets = [
            a.map_asset_specs(lambda spec: spec.replace_attributes(automation_condition=eager))
            if isinstance(a, dg.AssetsDefinition) and a.is_materializable else a
            for a in assets
        ]
    return dg.Definitions(
        assets=assets,
        asset_checks=[*dg.load_asset_checks_from_modules(_MODULES), *(sync.sync_checks(assets) if sync_checks else [])],
        sensors=[config_sensor(config_file, data_root, cfg)],
        jobs=[ablate_job],
        resources={
            "settings": StrataSettings(config_file=str(config_file or ""), data_root=str(cfg.root),
                                       loaded_versions=json.dumps(loaded_versions, sort_keys=True) if loaded_versions else ""),
            "duckdb": DuckDBResource(database=str(cfg.root / "strata.duckdb")),
        },
    )


def _load() -> dg.Definitions:
    """The definitions of this process's config source; the first process to load them (a code
    server) records their code versions for the runs it starts (:mod:`assets.loaded`)."""
    config_file, data_root = config_source()
    source = loaded.source_id(config_file, str(resolve_config(config_file, data_root).root))
    inherited = loaded.inherited_versions(source)
    out = build_definitions(config_file, data_root, loaded_versions=inherited, sync_checks=True)
    if inherited is None:
        loaded.announce(out, source)
    return out


defs = _load()
