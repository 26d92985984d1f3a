"""Which configuration a process runs with when it is given no config file: the one its data root
records (``<data root>/strata_config.yaml``, written by every ``strata run`` / ``strata demo``), so
the Dagster UI and ``strata status`` started without a config file show what the root was built with."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

import yaml

from pipeline.config import StrataConfig, config_from_dict, read_config_data, resolve_config
from pipeline.errors import StrataInputError
from pipeline.storage.atomic import write_text

RECORDED_CONFIG = "strata_config.yaml"


def record_config(cfg: StrataConfig) -> Path:
    """Write ``<data root>/strata_config.yaml`` atomically: every key of ``cfg``, defaults included,
    but ``data_root``, which is the folder the file lies in (so a root's bytes do not depend on where
    it lies); unchanged bytes are not rewritten. Returns its path."""
    data = cfg.model_dump(mode="json", exclude={"data_root"})
    text = yaml.safe_dump(data, sort_keys=True)
    path = cfg.root / RECORDED_CONFIG
    if not (path.is_file() and path.read_text(encoding="utf-8") == text):
        write_text(text, path)
    return path


def default_data_root(environ: Mapping[str, str] | None = None) -> Path:
    """The data root of a process given no config file and no ``--data-root``: ``STRATA_HOME``, else
    the parent of ``DAGSTER_HOME`` when that parent holds a recorded config (the README's
    ``DAGSTER_HOME=<data root>/dagster``), else ``./.strata``."""
    environ = os.environ if environ is None else environ
    if environ.get("STRATA_HOME"):
        return Path(environ["STRATA_HOME"]).expanduser().resolve()
    if environ.get("DAGSTER_HOME"):
        parent = Path(environ["DAGSTER_HOME"]).expanduser().resolve().parent
        if (parent / RECORDED_CONFIG).is_file():
            return parent
    return Path(".strata").resolve()


def config_source(data_root: str | os.PathLike | None = None,
                  environ: Mapping[str, str] | None = None) -> tuple[str | None, str | None]:
    """(config file, data root) for a process given no ``--config``: ``STRATA_CONFIG`` when set; else
    the data root's recorded config (``data_root``, else :func:`default_data_root`) when it has one,
    with that data root; else no file (the defaults)."""
    environ = os.environ if environ is None else environ
    if environ.get("STRATA_CONFIG"):
        return environ["STRATA_CONFIG"], (str(data_root) if data_root else None)
    root = Path(data_root).expanduser().resolve() if data_root else default_data_root(environ)
    recorded = root / RECORDED_CONFIG
    if recorded.is_file():
        return str(recorded), str(root)
    return None, (str(data_root) if data_root else None)


def env_config() -> StrataConfig:
    """The configuration named by ``STRATA_CONFIG`` (a YAML/JSON file), else the data root's recorded
    config (:func:`config_source`), else the defaults; the data root by precedence (see
    :func:`pipeline.config.resolve_config`)."""
    return resolve_config(*config_source())


def config_or_demo(config_file: str | None, data_root: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The config file of a command that reads a data root's results (``strata claims``, ``strata
    ablate``): the one given, else ``STRATA_CONFIG``, else the data root's ``demo_config.yaml`` (a
    root made by ``strata demo``: its settings), else none."""
    environ = os.environ if environ is None else environ
    config = config_file or environ.get("STRATA_CONFIG") or None
    demo = Path(data_root or environ.get("STRATA_HOME") or ".strata").resolve() / "demo_config.yaml"
    return str(demo) if config is None and demo.is_file() else config


def freeze_prefix_config(config_file: str, data_root: str | None, freeze_prefix: str) -> Path:
    """``config_file`` with ``freeze_prefix`` set, written to ``<data root>/run_config.yaml`` (``strata
    run --freeze-prefix``); a missing or malformed file, or a bad value, stops here naming the fix."""
    data = read_config_data(config_file)
    data["freeze_prefix"] = int(freeze_prefix) if freeze_prefix.strip().isdigit() else freeze_prefix
    try:
        config_from_dict({**data, "data_root": "."})
    except StrataInputError as err:
        raise StrataInputError(err.problem, path=config_file, fix=err.fix) from None
    root = resolve_config(config_file, data_root).root
    root.mkdir(parents=True, exist_ok=True)
    path = root / "run_config.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=True), encoding="utf-8")
    return path
