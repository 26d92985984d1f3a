"""Strata's Dagster definitions: the asset graph over ``pipeline/`` (loaded by workspace.yaml).

``defs`` follows ``STRATA_CONFIG`` (a YAML/JSON file) and the data-root precedence of
:func:`pipeline.config.resolve_config`; ``build_definitions`` builds them for any config.
"""

import os

import dagster as dg
from dagster_duckdb import DuckDBResource

from pipeline.offline import set_offline

set_offline()

from assets import checks, corpus, diagnostics, embeddings, evaluations, exports, orderings, sequences, tokens, training  # noqa: E402
from assets.common import StrataSettings  # noqa: E402
from pipeline.config import resolve_config  # noqa: E402

_MODULES = [corpus, tokens, embeddings, sequences, orderings, exports, diagnostics, training, evaluations, checks]


def build_definitions(config_file: str | None = None, data_root: str | None = None) -> dg.Definitions:
    """The asset graph configured by ``config_file`` (and ``data_root``, which wins over it)."""
    cfg = resolve_config(config_file, data_root)
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
            "settings": StrataSettings(config_file=str(config_file or ""), data_root=str(cfg.root)),
            "duckdb": DuckDBResource(database=str(cfg.root / "strata.duckdb")),
        },
    )


defs = build_definitions(os.environ.get("STRATA_CONFIG") or None)
