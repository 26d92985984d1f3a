"""Strata's Dagster definitions: the asset graph over ``pipeline/`` (loaded by workspace.yaml).

The configuration is read from ``STRATA_CONFIG`` / ``STRATA_HOME`` when this module is imported.
"""

import os

import dagster as dg
from dagster_duckdb import DuckDBResource

from pipeline.offline import set_offline

set_offline()

from assets import checks, corpus, diagnostics, embeddings, evaluations, orderings, sequences, tokens, training  # noqa: E402
from assets.common import StrataSettings, env_config  # noqa: E402

_MODULES = [corpus, tokens, embeddings, sequences, orderings, diagnostics, training, evaluations, checks]


def build_definitions() -> dg.Definitions:
    cfg = env_config()
    cfg.root.mkdir(parents=True, exist_ok=True)
    assets = dg.load_assets_from_modules(_MODULES)
    if cfg.automation == "eager":
        eager = dg.AutomationCondition.eager()
        assets = [
            a.map_asset_specs(lambda spec: spec.replace_attributes(automation_condition=eager))
            if isinstance(a, dg.AssetsDefinition) and a.is_materializable else a
            for a in assets
        ]
    return dg.Definitions(
        assets=assets,
        asset_checks=dg.load_asset_checks_from_modules(_MODULES),
        resources={
            "settings": StrataSettings(config_file=os.environ.get("STRATA_CONFIG", ""), data_root=str(cfg.root)),
            "duckdb": DuckDBResource(database=str(cfg.root / "strata.duckdb")),
        },
    )


defs = build_definitions()
