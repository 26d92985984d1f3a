"""A record a process leaves in its environment for the processes it starts, read back only by its
descendants and only for the same source: the code server's loaded code versions
(``assets/loaded.py``) travel this way to the run and step processes it launches."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Mapping


def source_id(config_file: str | None, data_root: str) -> list[str | None]:
    """The identity of a config source: the config file's absolute path (or none) and the data root."""
    return [str(Path(config_file).expanduser().resolve()) if config_file else None, str(data_root)]


def ancestors() -> set[int] | None:
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


def inherited(name: str, source: list[str | None], environ: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """The record an ancestor process left under the environment variable ``name`` for this same
    ``source``, or None when there is none (no record, another source, not an ancestor's)."""
    raw = (os.environ if environ is None else environ).get(name)
    if not raw:
        return None
    try:
        got = json.loads(raw)
        pid, src, versions = int(got["pid"]), got["source"], dict(got["versions"])
    except (ValueError, KeyError, TypeError):
        return None
    family = ancestors()
    if src != source or (family is not None and pid not in family):
        return None
    return versions


def announce(name: str, source: list[str | None], versions: dict[str, str]) -> None:
    """Leave ``versions`` for ``source`` under the environment variable ``name``, for the processes this one starts."""
    os.environ[name] = json.dumps({"pid": os.getpid(), "source": source, "versions": versions}, sort_keys=True)
