"""Which definitions a run was launched from: a run against an outdated load stops with the fix.

The Dagster UI launches a run from the definitions its code server loaded, but the run's process
imports ``assets.definitions`` again and so builds code versions from the config file as it is
*now*. Had the file been edited in between (before *Reload definitions*), the run would use the new
values while the UI still shows the old code versions. So the process that loads the definitions
first (the code server) puts the code versions it built into the environment
(:data:`LOADED_ENV`), which the run and step processes it starts inherit; a process that finds it
there, from an ancestor process and for the same config source, keeps those versions in its
``settings`` resource, and :func:`assets.params.asset_config` refuses to run an asset whose version
differs from them ("reload the definitions").
"""

from __future__ import annotations

import dagster as dg

from pipeline.distributed import inherited
from pipeline.distributed.inherited import source_id

LOADED_ENV = "STRATA_LOADED_DEFINITIONS"

__all__ = ["LOADED_ENV", "announce", "code_versions", "inherited_versions", "source_id"]


def inherited_versions(source: list[str | None], environ: dict[str, str] | None = None) -> dict[str, str] | None:
    """The code versions an ancestor process loaded for this same config ``source`` (:data:`LOADED_ENV`),
    or None when this process is the first to load them (no record, another source, not an ancestor)."""
    return inherited.inherited(LOADED_ENV, source, environ)


def code_versions(defs: dg.Definitions) -> dict[str, str]:
    """Each materializable asset's code version in ``defs``."""
    graph = defs.resolve_asset_graph()
    return {k.to_user_string(): graph.get(k).code_version or "" for k in graph.materializable_asset_keys}


def announce(defs: dg.Definitions, source: list[str | None]) -> None:
    """Record ``defs``' code versions in this process's environment, for the processes it starts."""
    inherited.announce(LOADED_ENV, source, code_versions(defs))
