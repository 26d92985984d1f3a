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

import json
import os
from pathlib import Path

import dagster as dg

LOADED_ENV = "STRATA_LOADED_DEFINITIONS"


def source_id(config_file: str | None, data_root: str) -> list[str | None]:
    """The identity of a config source: the config file's absolute path (or none) and the data root."""
    return [str(Path(config_file).expanduser().resolve()) if config_file else None, str(data_root)]


def _ancestors() -> set[int] | None:
    """This process's parent, grandparent, ... (Linux ``/proc``); None where ``/proc`` is absent."""
    if not Path("/proc/self/stat").is_file():
        return None
    out, pid = set(), os.getppid()
    while pid > 0 and pid not in out:  # pid 1 too: in a container the UI itself may be pid 1
        out.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state is the parent's pid
    return out


def inherited_versions(source: list[str | None], environ: dict[str, str] | None = None) -> dict[str, str] | None:
    """The code versions an ancestor process loaded for this same config ``source`` (:data:`LOADED_ENV`),
    or None when this process is the first to load them (no record, another source, not an ancestor)."""
    raw = (os.environ if environ is None else environ).get(LOADED_ENV)
    if not raw:
        return None
    try:
        got = json.loads(raw)
        pid, src, versions = int(got["pid"]), got["source"], dict(got["versions"])
    except (ValueError, KeyError, TypeError):
        return None
    ancestors = _ancestors()
    if src != source or (ancestors is not None and pid not in ancestors):
        return None
    return versions


def code_versions(defs: dg.Definitions) -> dict[str, str]:
    """Each materializable asset's code version in ``defs``."""
    graph = defs.resolve_asset_graph()
    return {k.to_user_string(): graph.get(k).code_version or "" for k in graph.materializable_asset_keys}


def announce(defs: dg.Definitions, source: list[str | None]) -> None:
    """Record ``defs``' code versions in this process's environment, for the processes it starts."""
    os.environ[LOADED_ENV] = json.dumps({"pid": os.getpid(), "source": source, "versions": code_versions(defs)},
                                        sort_keys=True)
